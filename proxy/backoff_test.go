package proxy_test

import (
	"testing"
	"time"

	"github.com/courierhq/courier/proxy"
)

// Delay draws from zero up to the schedule's ceiling at the attempt, which
// grows by the multiplier and stops at the cap.
func TestDelayFullJitter(t *testing.T) {
	// rnd returning n-1 shows the ceiling; returning 0 shows the floor.
	top := func(n int64) int64 { return n - 1 }
	for attempt, want := range map[int]time.Duration{
		1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 8 * time.Second, 5: 10 * time.Second, 40: 10 * time.Second,
	} {
		if got := proxy.Delay(attempt, time.Second, 10*time.Second, 2, top); got != want {
			t.Errorf("Delay ceiling at attempt %d = %v, want %v", attempt, got, want)
		}
		if got := proxy.Delay(attempt, time.Second, 10*time.Second, 2, func(int64) int64 { return 0 }); got != 0 {
			t.Errorf("Delay floor at attempt %d = %v, want 0", attempt, got)
		}
	}
	if got := proxy.Delay(3, 100*time.Millisecond, time.Minute, 3, top); got != 900*time.Millisecond {
		t.Errorf("multiplier 3 at attempt 3 = %v, want 900ms", got)
	}
}
