package main

// What a rollout or a crash costs an ordered durable (docs/order.md,
// "Rollouts and crashes"): a courier stopped with SIGTERM hands its pin on
// at once. Each courier is a process of its own (startChild); the app
// checks every request as it comes (keyedApp).

import (
	"fmt"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
)

// from accepts the requests of replica i.
func from(i int) func(appCall) bool {
	path := fmt.Sprint("/c", i)
	return func(c appCall) bool { return c.path == path }
}

// One courier active on a pinned durable, another standing by, messages
// published throughout: SIGTERM to the active one hands the pin on, and
// the other calls the app within a moment of the signal, not after the
// pin's TTL (7.5s with this ack wait). Every key in order, nothing lost,
// nothing sent twice.
func TestOrderStopHandsThePinOn(t *testing.T) {
	h := newHarness(t)
	a := newKeyedApp(t, 2*time.Millisecond)
	const keys = 20
	s := newReplicaSet(t, a.url, 2, func(url string, i int) []string {
		return orderEnv(h, url, i, "COURIER_ACK_WAIT=30s")
	})
	s.start(0)
	stop := publisher(t, h.js, keys, 300, 100*time.Millisecond)
	poll.Until(t, 30*time.Second, "replica 0 delivering", func() bool { return a.delivered() >= keys })
	s.start(1)
	at := a.delivered()
	poll.Until(t, 30*time.Second, "messages flowing with two replicas", func() bool { return a.delivered() >= at+2*keys })
	active := s.active(a)
	other := 1 - active
	signalled := time.Now()
	s.term(active)
	exited := time.Since(signalled)
	poll.Until(t, 20*time.Second, "the other replica calling the app", func() bool {
		_, ok := a.firstCall(signalled, from(other))
		return ok
	})
	c, _ := a.firstCall(signalled, from(other))
	took := c.at.Sub(signalled)
	t.Logf("SIGTERM to replica %d: it exited %s after it, replica %d called the app %s after it",
		active, exited.Round(time.Millisecond), other, took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("replica %d called the app %s after replica %d's SIGTERM, want within 2s (the pin's TTL is 7.5s)", other, took, active)
	}
	rounds := stop()
	a.settledInOrder(t, h, keys, rounds, true)
	if recs := logLines(s.cs[active].asCourier(), "pin given up for the next courier"); len(recs) != 1 || recs[0]["handed_on"] != true {
		t.Errorf("the stopped replica logged %v, want the pin given up with a clean record", recs)
	}
}
