package proxy_test

import (
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// COURIER_MAX_RATE caps requests per second across workers.
func TestMaxRateCapsRequests(t *testing.T) {
	e := setup(t)
	a := newStormApp(t, e)
	const n, perSecond = 30, 20.0
	e.publish(t, n, []byte("x"))
	_, _ = e.runWith(t, nil, proxy.Options{MaxInflight: 8, MaxRate: perSecond})
	poll.Until(t, 10*time.Second, "every message delivered", func() bool { return a.ok.Load() == n })
	a.mu.Lock()
	defer a.mu.Unlock()
	// In any window of one second, at most perSecond+1 requests are sent
	// (the bucket starts with one token). The app sees when they arrive,
	// which a busy machine can delay by a scheduling slice: a request
	// arriving late opens a window that reaches one or two sends further.
	// Three of slack for that; without the limit all n would arrive
	// within milliseconds.
	const slack = 3
	for i := range a.times {
		in := 0
		for j := i; j < len(a.times) && a.times[j].Sub(a.times[i]) < time.Second; j++ {
			in++
		}
		if in > int(perSecond)+1+slack {
			t.Fatalf("%d requests within one second from request %d, cap %v/s", in, i, perSecond)
		}
	}
	// And the whole run took as long as the limit makes it: n-1 sends
	// after the first token, 1/perSecond apart, less the slack.
	if span, least := a.times[len(a.times)-1].Sub(a.times[0]), time.Duration(float64(n-1-slack)/perSecond*float64(time.Second)); span < least {
		t.Errorf("%d requests over %v, want at least %v at %v/s", n, span, least, perSecond)
	}
	if got := counter(t, e.reg, "courier_rate_limit_wait_seconds_total", ""); got <= 0 {
		t.Errorf("no time counted waiting for the rate limit (%v)", got)
	}
}
