package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/poll"
)

// poisonApp answers every batch holding a poison message with 500, as an
// app that crashes on one record, and any other 2xx; it notes, per key,
// the messages answered 2xx in the order they were, and the size of the
// batch each poison message was in on each attempt.
type poisonApp struct {
	mu      sync.Mutex
	ok      map[string][]int    // key → N answered 2xx, in order
	poisons map[string][]string // "key/N" → "attempt:batch size" of each request
	calls   int
}

// poisoned says whether message n of key k<i> is poison: one in ten.
func poisoned(key string, n int) bool {
	h := fnv.New32a()
	fmt.Fprint(h, key, "/", n)
	return h.Sum32()%10 == 0
}

func (a *poisonApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Entries []struct {
			Attempt int                 `json:"attempt"`
			Headers map[string][]string `json:"headers"`
		} `json:"entries"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	bad := false
	for _, e := range body.Entries {
		key, n := e.Headers["Order"][0], e.Headers["N"][0]
		i, _ := strconv.Atoi(n)
		if poisoned(key, i) {
			bad = true
			id := key + "/" + n
			a.poisons[id] = append(a.poisons[id], fmt.Sprintf("%d:%d", e.Attempt, len(body.Entries)))
		}
	}
	if bad {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	for _, e := range body.Entries {
		i, _ := strconv.Atoi(e.Headers["N"][0])
		a.ok[e.Headers["Order"][0]] = append(a.ok[e.Headers["Order"][0]], i)
	}
	w.WriteHeader(http.StatusOK)
}

// One message in ten makes the app fail every batch it is in, with order
// per key, two couriers (processes) and one of them killed with SIGKILL
// midway: every other message reaches the app, in its key's order; each
// poison message is dead-lettered (exhausted after a request of its own),
// and none other is.
func TestBatchPoisonThroughAKill(t *testing.T) {
	h := newHarness(t)
	a := &poisonApp{ok: map[string][]int{}, poisons: map[string][]string{}}
	app := httptest.NewServer(a)
	t.Cleanup(app.Close)
	srv := app.URL
	const keys, rounds, maxDeliver = 20, 12, 5
	env := func() []string {
		return h.env(srv, "COURIER_BATCH_MAX=8", "COURIER_BATCH_WAIT=5ms", "COURIER_ORDER_KEY=header:Order",
			"COURIER_MAX_DELIVER="+strconv.Itoa(maxDeliver), "COURIER_MAX_INFLIGHT=2", "COURIER_ACK_WAIT=2s",
			"COURIER_BREAKER_FAILURES=0", "COURIER_DEDUP_STORE=shared", "COURIER_DEDUP_DIR="+t.TempDir(),
			"COURIER_LOG_LEVEL=info")
	}
	poison := 0
	for n := range rounds {
		for k := range keys {
			key := fmt.Sprint("k", k)
			h.publish("orders."+key, "x", map[string]string{"Order": key, "N": strconv.Itoa(n), "Nats-Msg-Id": key + "-" + strconv.Itoa(n)})
			if poisoned(key, n) {
				poison++
			}
		}
	}
	first := startChild(t, env())
	second := startChild(t, env())
	waitReady(t, first.asCourier())
	waitReady(t, second.asCourier())
	poll.Until(t, 30*time.Second, "deliveries under way", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.calls >= 15
	})
	first.kill(t)
	third := startChild(t, env())
	waitReady(t, third.asCourier())
	poll.Until(t, 90*time.Second, "every message settled", func() bool { return h.settled("courier") })

	a.mu.Lock()
	defer a.mu.Unlock()
	dls := h.deadLetters("dlq.ORDERS.courier")
	reasons := map[string]string{}
	for _, m := range dls {
		reasons[m.Header.Get("Order")+"/"+m.Header.Get("N")] = m.Header.Get(dlq.HeaderReason)
	}
	for k := range keys {
		key := fmt.Sprint("k", k)
		last := -1
		for _, n := range a.ok[key] {
			if n < last {
				t.Errorf("%s: message %d answered 2xx after %d (%v)", key, n, last, a.ok[key])
				break
			}
			last = n
		}
		for n := range rounds {
			id := fmt.Sprint(key, "/", n)
			if !poisoned(key, n) {
				if reasons[id] != "" {
					t.Errorf("%s dead-lettered (%s) for a poison message it shared batches with", id, reasons[id])
				}
				continue
			}
			switch reasons[id] {
			case dlq.ReasonExhausted:
				tries := a.poisons[id]
				if want := fmt.Sprintf("%d:1", maxDeliver); len(tries) == 0 || tries[len(tries)-1] != want {
					t.Errorf("poison %s's requests (attempt:batch size) %v, want the last alone (%s)", id, tries, want)
				}
			case dlq.ReasonMaxDeliveries:
				// Its last delivery was with the courier killed.
				t.Logf("poison %s dead-lettered as %s (its last delivery died with a courier)", id, reasons[id])
			default:
				t.Errorf("poison %s dead letter reason %q, want %q", id, reasons[id], dlq.ReasonExhausted)
			}
		}
	}
	if len(dls) != poison {
		t.Errorf("%d dead letters, want %d (the poison messages)", len(dls), poison)
	}
	t.Logf("%d poison messages of %d, %d batch requests", poison, keys*rounds, a.calls)
}
