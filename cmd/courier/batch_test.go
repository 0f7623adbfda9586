package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	if !strings.Contains(ch.logs.String(), "dedup store sized for batches") {
		t.Errorf("with batches, the store is not sized for them; courier logs:\n%s", ch.logs.String())
	}
	ch.kill(t)
	mu.Lock()
	holding = false
	mu.Unlock()

	c := start(t, env)
	poll.Until(t, 30*time.Second, "every message settled", func() bool { return h.settled("courier") })
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

// Batches with replicas on a 3-node cluster: two couriers with batches on
// share one durable and the shared store; one is killed (SIGKILL) and
// replaced mid-run, and the stream's leader node is shut down. The app
// answers in Dapr's shape, RETRY for every seventh key the first time it
// sees it. Every key is stored (answered SUCCESS), nothing is
// dead-lettered, and the keys stored twice are no more than the killed
// courier had in flight when it died. Each message carries 1,000 bytes, so
// that a full batch's request is larger than the connection's 4 KiB write
// buffer and leaves in one writev (apphttp/h1.go).
func TestBatchesOnAClusterThroughAKillAndALeaderLoss(t *testing.T) {
	k := newCluster(t)
	var (
		mu      sync.Mutex
		stored  = map[string]int{} // key → times answered SUCCESS
		retried = map[string]bool{}
		batches int
		largest int64 // the largest batch request's body
	)
	pad := strings.Repeat("p", 1000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Entries []struct {
				EntryID        string `json:"entryId"`
				IdempotencyKey string `json:"idempotencyKey"`
			} `json:"entries"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || r.Header.Get("Courier-Batch") != fmt.Sprint(len(body.Entries)) {
			http.Error(w, "not a batch", http.StatusBadRequest)
			return
		}
		time.Sleep(5 * time.Millisecond) // a write to a database
		out := make([]map[string]string, 0, len(body.Entries))
		mu.Lock()
		batches++
		largest = max(largest, r.ContentLength)
		for _, e := range body.Entries {
			status := "SUCCESS"
			var n int
			if _, err := fmt.Sscanf(e.IdempotencyKey, "b-%d", &n); err == nil && n%7 == 0 && !retried[e.IdempotencyKey] {
				retried[e.IdempotencyKey] = true
				status = "RETRY"
			} else {
				stored[e.IdempotencyKey]++
			}
			out = append(out, map[string]string{"entryId": e.EntryID, "status": status})
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"statuses": out})
	}))
	t.Cleanup(srv.Close)
	storedCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(stored)
	}

	const inflight, batchMax, total = 2, 8, 400
	env := func(i int) []string {
		return k.env(srv.URL, i, fmt.Sprint("COURIER_MAX_INFLIGHT=", inflight), fmt.Sprint("COURIER_BATCH_MAX=", batchMax),
			"COURIER_BATCH_WAIT=5ms", "COURIER_ACK_WAIT=3s", "COURIER_BACKOFF_INITIAL=50ms", "COURIER_BACKOFF_MAX=200ms")
	}
	victim := startChild(t, env(0))
	other := start(t, env(1))
	waitReady(t, victim.asCourier())
	waitReady(t, other)

	keys := make([]string, total)
	var futures []jetstream.PubAckFuture
	for i := range total / 2 {
		keys[i] = fmt.Sprint("b-", i)
		m := nats.NewMsg("orders.batched")
		m.Header.Set("Nats-Msg-Id", keys[i])
		m.Data = []byte(`{"n":` + fmt.Sprint(i) + `,"pad":"` + pad + `"}`)
		f, err := k.js.PublishMsgAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	awaitAcks(t, futures)
	poll.Until(t, 20*time.Second, "batches under way", func() bool { return storedCount() >= 40 })
	victim.kill(t)
	t.Logf("killed one courier after %d keys stored", storedCount())
	replacement := start(t, env(2))
	waitReady(t, replacement)
	leader := k.c.StreamLeader("ORDERS")
	t.Logf("shutting down node %d, the stream's leader, after %d keys stored", leader, storedCount())
	k.c.Shutdown(leader)
	for i := total / 2; i < total; i++ {
		keys[i] = fmt.Sprint("b-", i)
		k.publishRetry("orders.batched", `{"n":`+fmt.Sprint(i)+`,"pad":"`+pad+`"}`, map[string]string{"Nats-Msg-Id": keys[i]})
	}
	poll.Until(t, 90*time.Second, "every key stored and every message acked", func() bool {
		return storedCount() == total && k.drained()
	})
	mu.Lock()
	defer mu.Unlock()
	twice := 0
	for _, key := range keys {
		if stored[key] > 1 {
			twice += stored[key] - 1
		}
	}
	t.Logf("%d keys in %d batches, %d stored more than once, the largest request %d bytes", total, batches, twice, largest)
	if largest <= 4<<10 {
		t.Errorf("the largest batch request was %d bytes, want one beyond the 4 KiB buffer", largest)
	}
	if twice > inflight*batchMax {
		t.Errorf("%d keys stored twice, want at most %d (what the killed courier had in flight)", twice, inflight*batchMax)
	}
	for i := 0; i < total; i += 7 {
		if !retried[keys[i]] {
			t.Errorf("%s was never answered RETRY", keys[i])
		}
	}
	k.noDeadLetters()
}
