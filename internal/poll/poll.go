// Package poll is the one "wait until true" helper of courier's tests: they
// poll a condition instead of sleeping a fixed time.
package poll

import (
	"testing"
	"time"
)

// Until calls cond every few milliseconds until it returns true, and fails tb
// (naming what) if it has not within timeout.
func Until(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
