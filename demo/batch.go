package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The demo's batch part: four invoices go to the app in one request
// (COURIER_BATCH_MAX=4), which answers in Dapr's bulk shape with a status
// per entry; the one it asks to retry comes back alone.

const invoicesStream = "INVOICES"

// invoiceApp is the sample app's batch endpoint.
type invoiceApp struct {
	say     func(string, ...any)
	mu      sync.Mutex
	retried bool
	stored  int
}

func (a *invoiceApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var batch struct {
		Entries []struct {
			EntryID        string          `json:"entryId"`
			IdempotencyKey string          `json:"idempotencyKey"`
			Attempt        int             `json:"attempt"`
			Data           json.RawMessage `json:"data"`
		} `json:"entries"`
	}
	if err := json.NewDecoder(r.Body).Decode(&batch); err != nil {
		http.Error(w, "not a batch: "+err.Error(), http.StatusBadRequest)
		return
	}
	type status struct {
		EntryID string `json:"entryId"`
		Status  string `json:"status"`
	}
	var out []status
	var said []string
	a.mu.Lock()
	for _, e := range batch.Entries {
		st := "SUCCESS"
		if e.IdempotencyKey == "invoice-3" && !a.retried {
			a.retried, st = true, "RETRY" // its row was locked: try again later
		} else {
			a.stored++
		}
		out = append(out, status{e.EntryID, st})
		said = append(said, fmt.Sprintf("%s (attempt %d) %s", e.IdempotencyKey, e.Attempt, st))
	}
	a.mu.Unlock()
	a.say("app got a batch of %d in one request (Courier-Batch: %s) → 200 {\"statuses\": %s}",
		len(batch.Entries), r.Header.Get("Courier-Batch"), strings.Join(said, ", "))
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"statuses": out})
}

func (a *invoiceApp) storedCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stored
}

// runBatches publishes four invoices and runs a courier with batches on
// them until the app has stored all four.
func runBatches(ctx context.Context, sidecar Sidecar, js jetstream.JetStream, natsURL, dir, appURL string, app *invoiceApp, timeout time.Duration) error {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(sctx, jetstream.StreamConfig{Name: invoicesStream, Subjects: []string{"invoices.>"}}); err != nil {
		return fmt.Errorf("demo: create stream: %w", err)
	}
	for i := 1; i <= 4; i++ {
		m := nats.NewMsg("invoices.issued")
		m.Header.Set("Idempotency-Key", fmt.Sprintf("invoice-%d", i))
		m.Header.Set("Content-Type", "application/json")
		m.Data = fmt.Appendf(nil, `{"invoice":%d}`, i)
		if _, err := js.PublishMsg(sctx, m); err != nil {
			return fmt.Errorf("demo: publish: %w", err)
		}
	}
	app.say("published 4 invoices to stream %s; a courier with COURIER_BATCH_MAX=4 sends them together", invoicesStream)
	environ := []string{
		"NATS_URL=" + natsURL, "COURIER_STREAM=" + invoicesStream, "COURIER_CONSUMER=invoices",
		"COURIER_APP_URL=" + appURL, "COURIER_BATCH_MAX=4", "COURIER_BATCH_WAIT=200ms",
		"COURIER_BACKOFF_INITIAL=200ms", "COURIER_BACKOFF_MAX=500ms",
		"COURIER_DEDUP_DIR=" + dir + "/dedup-invoices", "COURIER_ADMIN_ADDR=127.0.0.1:0",
		"COURIER_SHUTDOWN_GRACE=2s", "COURIER_LOG_FORMAT=text", "COURIER_LOG_LEVEL=warn",
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- sidecar(runCtx, environ) }()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var result error
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case err := <-done:
			return fmt.Errorf("demo: the batch courier stopped early: %w", err)
		case <-deadline.C:
			result = fmt.Errorf("demo: the invoices were not all stored within %s", timeout)
			break wait
		case <-tick.C:
			if app.storedCount() >= 4 {
				app.say("all 4 invoices stored: invoice-3 retried on its own, through JetStream, as any message")
				break wait
			}
		}
	}
	stop()
	if err := <-done; err != nil && result == nil {
		result = err
	}
	return result
}
