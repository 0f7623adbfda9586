package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// Batches end to end, through a courier killed (SIGKILL) while the app
// holds both its batches in flight: nothing is lost, nothing is stored
// twice, each entry's attempts are JetStream's (the killed courier spent
// the first). The app answers in Dapr's shape: "drop" dropped, "retry"
// retried once, the rest stored; it stores an entry when it answers
// SUCCESS for it.
func TestBatchesThroughAKill(t *testing.T) {
	h := newHarness(t)
	var (
		mu      sync.Mutex
		batches int
		holding = true
		stored  = map[string][]int{} // key → attempts it was stored at
		retried = map[string]bool{}
		held    = make(chan struct{}, 2)
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Entries []struct {
				EntryID        string `json:"entryId"`
				IdempotencyKey string `json:"idempotencyKey"`
				Attempt        int    `json:"attempt"`
			} `json:"entries"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || r.Header.Get("Courier-Batch") != fmt.Sprint(len(body.Entries)) {
			http.Error(w, "not a batch", http.StatusBadRequest)
			return
		}
		mu.Lock()
		batches++
		hold := holding
		mu.Unlock()
		if hold {
			held <- struct{}{}
			<-r.Context().Done() // held until courier dies
			return
		}
		var out []map[string]string
		mu.Lock()
		for _, e := range body.Entries {
			status := "SUCCESS"
			switch {
			case e.IdempotencyKey == "drop":
				status = "DROP"
			case e.IdempotencyKey == "retry" && !retried["retry"]:
				retried["retry"] = true
				status = "RETRY"
			default:
				stored[e.IdempotencyKey] = append(stored[e.IdempotencyKey], e.Attempt)
			}
			out = append(out, map[string]string{"entryId": e.EntryID, "status": status})
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"statuses": out})
	}))
	t.Cleanup(srv.Close)

	keys := []string{"drop", "retry"}
	for i := range 14 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	for _, k := range keys {
		h.publish("orders.batch", `{"k":"`+k+`"}`, map[string]string{"Idempotency-Key": k, "Content-Type": "application/json"})
	}
	env := h.env(srv.URL, "COURIER_BATCH_MAX=8", "COURIER_MAX_INFLIGHT=2", "COURIER_BATCH_WAIT=20ms",
		"COURIER_ACK_WAIT=2s", "COURIER_LOG_LEVEL=info")
	ch := startChild(t, env)
	for range 2 { // COURIER_MAX_INFLIGHT batches of 8: every message
		select {
		case <-held:
		case <-time.After(30 * time.Second):
			t.Fatalf("two batches did not reach the app; courier logs:\n%s", ch.logs.String())
		}
	}
	ch.kill(t)
	mu.Lock()
	holding = false
	mu.Unlock()

	c := start(t, env)
	waitFor(t, 30*time.Second, "every message settled", func() bool { return h.settled("courier") })
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, k := range keys {
		want := "[2]" // the killed courier spent the first delivery
		switch k {
		case "drop":
			want = "[]"
		case "retry":
			want = "[3]"
		}
		if got := fmt.Sprint(stored[k]); got != want && !(want == "[]" && stored[k] == nil) {
			t.Errorf("%s stored at attempts %s, want %s", k, got, want)
		}
	}
	dls := h.deadLetters("dlq.ORDERS.courier")
	if len(dls) != 1 || dls[0].Header.Get("Idempotency-Key") != "drop" || dls[0].Header.Get("Courier-Reason") != "rejected" {
		t.Errorf("dead letters: %d, want one for drop, rejected", len(dls))
	}
	if _, ok := stored["drop"]; ok {
		t.Error("the dropped entry was stored")
	}
}
