package main

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
)

// A courier killed while its request is at the app holds a claim on the
// message's key in the shared store: the claim lapses about an ack wait
// later, when JetStream redelivers the message to the courier that is
// left, not after the request timeout (here a minute), which would stall
// the key that long.
func TestClaimOfAKilledCourierLapsesWithTheAckWait(t *testing.T) {
	h := newHarness(t)
	var calls, done atomic.Int32
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if calls.Add(1) == 1 {
			<-r.Context().Done() // until the courier that sent it dies
			return
		}
		done.Add(1)
		w.WriteHeader(http.StatusOK)
	})
	env := func() []string {
		return h.env(a.URL, "COURIER_DEDUP_STORE=shared", "COURIER_ACK_WAIT=2s", "COURIER_HTTP_TIMEOUT=60s",
			"COURIER_DEDUP_DIR="+t.TempDir())
	}
	first := startChild(t, env())
	waitReady(t, first.asCourier())
	h.publish("orders.created", "held", map[string]string{"Nats-Msg-Id": "held-1"})
	poll.Until(t, 10*time.Second, "the message at the app", func() bool { return calls.Load() == 1 })
	second := start(t, env())
	waitReady(t, second)
	first.kill(t)
	killed := time.Now()
	// The ack wait (2s) and the claim's 2s, with room for a loaded
	// machine: far less than the minute the request timeout would give.
	poll.Until(t, 30*time.Second, "the message delivered by the courier left", func() bool { return done.Load() == 1 })
	t.Logf("delivered %s after the kill", time.Since(killed).Round(time.Millisecond))
	if n := calls.Load(); n != 2 {
		t.Errorf("app called %d times, want 2 (the killed courier's request, then one more)", n)
	}
}
