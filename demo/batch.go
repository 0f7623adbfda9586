package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The demo's batch part: the app publishes four invoices through courier in
// one HTTP request (COURIER_PUBLISH_ADDR, POST /v1/publish-batch), and they
// come back to it in one request (COURIER_BATCH_MAX=4), which it answers in
// Dapr's bulk shape with a status per entry; the one it asks to retry comes
// back alone.

const invoicesStream = "INVOICES"

// invoiceApp is the sample app's batch endpoint.
type invoiceApp struct {
	say func(string, ...any)
	// published is closed once the app has said it published the
	// invoices: courier may deliver them before the publish's answer has
	// reached the app, and the story tells the publish first.
	published chan struct{}
	mu        sync.Mutex
	retried   bool
	stored    int
	// arrived is when each key was first stored (delayed.go).
	arrived map[string]time.Time
}

func newInvoiceApp(say func(string, ...any)) *invoiceApp {
	return &invoiceApp{say: say, published: make(chan struct{}), arrived: map[string]time.Time{}}
}

// arrival is when the entry of key was stored, if it was.
func (a *invoiceApp) arrival(key string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.arrived[key]
	return t, ok
}

func (a *invoiceApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case <-a.published:
	case <-r.Context().Done():
		return
	}
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
			if _, ok := a.arrived[e.IdempotencyKey]; !ok {
				a.arrived[e.IdempotencyKey] = time.Now()
			}
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

// runBatches runs a courier with batches and its publish API on, has the
// app publish four invoices through it in one request, and waits until the
// app has stored all four.
func runBatches(ctx context.Context, sidecar Sidecar, js jetstream.JetStream, natsURL, dir, appURL string, app *invoiceApp, timeout time.Duration) error {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// It holds the schedules of delayed publishes too (delayed.go).
	if _, err := js.CreateStream(sctx, jetstream.StreamConfig{Name: invoicesStream, Subjects: []string{"invoices.>", "_sched." + invoicesStream + ".>"},
		AllowMsgSchedules: true}); err != nil {
		return fmt.Errorf("demo: create stream: %w", err)
	}
	publishAddr, err := freeAddr()
	if err != nil {
		return err
	}
	environ := []string{
		"NATS_URL=" + natsURL, "COURIER_STREAM=" + invoicesStream, "COURIER_CONSUMER=invoices",
		// One batch request at a time: the story is told in one order.
		"COURIER_APP_URL=" + appURL, "COURIER_BATCH_MAX=4", "COURIER_BATCH_WAIT=200ms", "COURIER_MAX_INFLIGHT=1",
		"COURIER_BACKOFF_INITIAL=200ms", "COURIER_BACKOFF_MAX=500ms",
		"COURIER_DEDUP_DIR=" + dir + "/dedup-invoices", "COURIER_ADMIN_ADDR=127.0.0.1:0",
		"COURIER_PUBLISH_ADDR=" + publishAddr, "COURIER_PUBLISH_SUBJECTS=invoices.>",
		"COURIER_SHUTDOWN_GRACE=1s", "COURIER_LOG_FORMAT=text", "COURIER_LOG_LEVEL=warn",
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- sidecar(runCtx, environ) }()
	if err := publishInvoices(runCtx, app, "http://"+publishAddr, timeout); err != nil {
		stop()
		<-done
		return err
	}
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
				result = sendReminder(runCtx, app, "http://"+publishAddr, timeout)
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

// freeAddr is a loopback address with a port free now, for the publish API.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("demo: finding a port for the publish API: %w", err)
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// publishInvoices publishes the four invoices as the app would, in one
// request to courier's publish API, sent again until it is up and answers
// 200 (it answers 503 until courier has reached NATS), and says what it was
// answered.
func publishInvoices(ctx context.Context, app *invoiceApp, base string, timeout time.Duration) error {
	type entry struct {
		IdempotencyKey string          `json:"idempotencyKey"`
		ContentType    string          `json:"contentType"`
		Data           json.RawMessage `json:"data"`
	}
	var batch struct {
		Entries []entry `json:"entries"`
	}
	for i := 1; i <= 4; i++ {
		batch.Entries = append(batch.Entries, entry{fmt.Sprintf("invoice-%d", i), "application/json", fmt.Appendf(nil, `{"invoice":%d}`, i)})
	}
	body, err := json.Marshal(batch)
	if err != nil {
		return err
	}
	url := base + "/v1/publish-batch/invoices.issued"
	var answer struct {
		Entries []struct {
			Status int    `json:"status"`
			Seq    uint64 `json:"seq"`
		} `json:"entries"`
		Error string `json:"error"`
	}
	status := 0
	deadline := time.Now().Add(timeout)
	for status != http.StatusOK {
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: courier's publish API did not store the invoices within %s (last answer %d %s)", timeout, status, answer.Error)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue // not listening yet
		}
		status = resp.StatusCode
		err = json.NewDecoder(resp.Body).Decode(&answer)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("demo: the publish API answered %d with no JSON: %w", status, err)
		}
	}
	var seqs []string
	for _, e := range answer.Entries {
		seqs = append(seqs, strconv.FormatUint(e.Seq, 10))
	}
	app.say("app published 4 invoices through courier in one request (POST /v1/publish-batch/invoices.issued) → 200, stored at %s in %s; a courier with COURIER_BATCH_MAX=4 sends them together",
		strings.Join(seqs, ", "), invoicesStream)
	close(app.published)
	return nil
}
