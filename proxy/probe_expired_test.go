package proxy_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/proxy"
)

// A failed probe on a message's last allowed delivery is held again; when
// the breaker's next token makes it the probe again and it has outlived
// COURIER_MAX_AGE meanwhile, it is dead-lettered without a request. That
// token reached no app: another probe must follow, or the breaker stays
// open for good and nothing is delivered once the app recovers.
func TestExpiredReheldProbeDoesNotStallBreaker(t *testing.T) {
	e := setup(t)
	a := newStormApp(t, e)
	a.storming.Store(true)
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: 1, AckWait: 5 * time.Second})
	e.publishKeyed(t, "s.a", "k-a")
	e.publishKeyed(t, "s.b", "k-b")
	e.publishKeyed(t, "s.c", "k-c")
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 1, MaxInflight: 1, BreakerFailures: 2, BreakerProbe: 100 * time.Millisecond,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		MaxAge: time.Second,
	})
	waitFor(t, "the breaker to open", func() bool {
		err := r.Ready()
		return err != nil && contains(err.Error(), "breaker open")
	})
	// C, probed again and again, outlives MaxAge: dead-lettered as expired.
	waitFor(t, "A, B and C dead-lettered", func() bool { return e.deadLetters(t) == 3 })
	a.storming.Store(false)
	e.publishKeyed(t, "s.d", "k-d")
	waitFor(t, "k-d delivered after the app recovered", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.keys["k-d"] == 1
	})
}
