package proxy_test

import (
	"testing"
	"time"

	"github.com/courierhq/courier/proxy"
)

// COURIER_MAX_RATE caps requests per second across workers.
func TestMaxRateCapsRequests(t *testing.T) {
	e := setup(t)
	a := newStormApp(t, e)
	const n, perSecond = 30, 20.0
	e.publish(t, n, []byte("x"))
	_, _ = e.runWith(t, nil, proxy.Options{MaxInflight: 8, MaxRate: perSecond})
	waitFor(t, "every message delivered", func() bool { return a.ok.Load() == n })
	a.mu.Lock()
	defer a.mu.Unlock()
	// In any window of one second, at most perSecond+1 requests (the
	// bucket starts with one token).
	for i := range a.times {
		in := 0
		for j := i; j < len(a.times) && a.times[j].Sub(a.times[i]) < time.Second; j++ {
			in++
		}
		if in > int(perSecond)+1 {
			t.Fatalf("%d requests within one second from request %d, cap %v/s", in, i, perSecond)
		}
	}
	if got := counter(t, e.reg, "courier_rate_limit_wait_seconds_total", ""); got <= 0 {
		t.Errorf("no time counted waiting for the rate limit (%v)", got)
	}
}
