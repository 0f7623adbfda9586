package proxy_test

import (
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// State says what the runner is doing and when that changes: the breaker
// open with its next probe and the wait between probes, the messages held,
// the limit in effect; and, once the storm is over, all clear.
func TestStateDuringStorm(t *testing.T) {
	e := setup(t)
	a, r := openInStorm(t, e, 20, proxy.Options{
		BreakerProbe: 2 * time.Second, BreakerProbeMax: 8 * time.Second,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
	})
	var st proxy.State
	poll.Until(t, 10*time.Second, "a probe due, with messages held", func() bool {
		st = r.State()
		return st.Breaker.NextProbe != nil && st.Held > 0
	})
	if st.Stream != "S" || st.Consumer != "c" || !st.Bound || !st.AppAvailable {
		t.Errorf("state %+v: want S/c, bound, the app available", st)
	}
	if st.Breaker.ProbeWait != "2s" || st.Breaker.ProbeMax != "8s" {
		t.Errorf("probe wait %q up to %q, want 2s up to 8s", st.Breaker.ProbeWait, st.Breaker.ProbeMax)
	}
	if d := time.Until(*st.Breaker.NextProbe); d > 2*time.Second {
		t.Errorf("next probe in %s, more than the wait", d)
	}
	if len(st.Holds) != 1 || st.Holds[0].Cause != "breaker_open" || st.Holds[0].Until == nil ||
		!st.Holds[0].Until.Equal(*st.Breaker.NextProbe) || st.Holds[0].Since.IsZero() {
		t.Errorf("holds %+v, want the breaker's, since when, until its next probe", st.Holds)
	}
	if !contains(st.Ready, "breaker open") || !contains(st.Ready, "next probe in") {
		t.Errorf("ready %q", st.Ready)
	}
	if st.Limit != 1 || st.LimitMax != 1 || st.LimitAuto {
		t.Errorf("limit %d of at most %d (auto %v), want a fixed 1", st.Limit, st.LimitMax, st.LimitAuto)
	}

	a.storming.Store(false)
	poll.Until(t, 15*time.Second, "every message delivered", func() bool { return e.settled(t) })
	poll.Until(t, 5*time.Second, "all clear", func() bool {
		st = r.State()
		return st.Ready == "" && !st.Breaker.Open && len(st.Holds) == 0 && st.Held == 0 && st.InFlight == 0
	})
}
