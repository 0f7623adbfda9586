package proxy_test

import (
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// A failed probe on a message's last allowed delivery is held again; when
// the breaker's next token makes it the probe again and it has outlived
// COURIER_MAX_AGE meanwhile, it is dead-lettered without a request. That
// token reached no app: another probe must follow, or the breaker stays
// open for good and nothing is delivered once the app recovers.
func TestExpiredReheldProbeDoesNotStallBreaker(t *testing.T) {
	e := setup(t)
	a, _ := openInStorm(t, e, 1, proxy.Options{
		BreakerProbe: 100 * time.Millisecond, BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		MaxAge: time.Second,
	})
	// C, probed again and again, outlives MaxAge: dead-lettered as expired.
	poll.Until(t, 10*time.Second, "A, B and C dead-lettered", func() bool { return e.deadLetters(t) == 3 })
	a.storming.Store(false)
	e.publishKeyed(t, "s.d", "k-d")
	poll.Until(t, 10*time.Second, "k-d delivered after the app recovered", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.keys["k-d"] == 1
	})
}
