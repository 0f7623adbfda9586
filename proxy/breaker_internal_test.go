package proxy

import (
	"log/slog"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
)

func newTestBreaker(threshold int, probe time.Duration) (*breaker, *gate) {
	g := newGate(time.Now, func(cause, bool, string, time.Duration) {})
	return newBreaker(threshold, probe, 8*probe, g, slog.New(slog.DiscardHandler)), g
}

// got reports whether t has received the go-ahead, waiting up to d.
func got(t *probeTicket, d time.Duration) bool {
	select {
	case <-t.ahead:
		return true
	case <-time.After(d):
		return false
	}
}

// Failures of messages on a later delivery (retries, redeliveries after a
// restart) neither open the breaker nor break a streak of fresh ones.
func TestBreakerCountsOnlyFreshFailures(t *testing.T) {
	b, g := newTestBreaker(3, time.Hour)
	defer b.stop()
	for i := range 10 {
		b.failure(string(rune('a'+i)), false, 0, false)
	}
	if g.isHeld(causeBreaker) {
		t.Fatal("ten retries failing in a row opened the breaker")
	}
	b.failure("f1", true, 0, false)
	b.failure("r1", false, 0, false)
	b.failure("f2", true, 0, false)
	if g.isHeld(causeBreaker) {
		t.Fatal("opened after two fresh failures, threshold 3")
	}
	b.failure("f3", true, 0, false)
	if !g.isHeld(causeBreaker) {
		t.Fatal("three fresh failures in a row, a retry's between them, did not open the breaker")
	}
	b.success()
	if g.isHeld(causeBreaker) {
		t.Fatal("a success did not close the breaker")
	}
}

// The probe is a fresh message when one is held, whatever the order the
// candidates enlisted in; without one, the first retry.
func TestBreakerProbesWithFreshMessageFirst(t *testing.T) {
	b, _ := newTestBreaker(2, time.Hour)
	defer b.stop()
	b.failure("a", true, 0, false)
	b.failure("b", true, 0, false) // open; the first probe an hour away
	r1, fresh, r2 := b.enlist(false), b.enlist(true), b.enlist(false)
	b.handOn()
	if !got(fresh, time.Second) {
		t.Fatal("the fresh candidate did not get the go-ahead")
	}
	if got(r1, 0) || got(r2, 0) {
		t.Fatal("a retry got a go-ahead beside the fresh one")
	}
	b.handOn()
	if !got(r1, time.Second) {
		t.Fatal("with no fresh candidate, the first retry did not get the go-ahead")
	}
}

// A go-ahead that finds no candidate is kept for the next one to enlist; one
// that a candidate received but did not use (it left: the gate opened, or
// courier stopped) goes to the next.
func TestBreakerGoAheadIsNeverLost(t *testing.T) {
	b, _ := newTestBreaker(2, 20*time.Millisecond)
	defer b.stop()
	b.failure("a", true, 0, false)
	b.failure("b", true, 0, false)
	poll.Until(t, 5*time.Second, "the probe timer to fire with no candidate", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.pending
	})
	if late := b.enlist(true); !got(late, time.Second) {
		t.Fatal("a go-ahead with no candidate was lost")
	}
	first, second := b.enlist(false), b.enlist(false)
	b.handOn() // to first, which leaves without taking it
	b.leave(first)
	if !got(second, time.Second) {
		t.Fatal("an unused go-ahead left with its candidate")
	}
}

// Only a fresh probe's failure is news of the outage: it doubles the wait;
// a retry probe's failure keeps it. The app's Retry-After wins over both.
func TestBreakerWaitDoublesOnlyOnFreshProbes(t *testing.T) {
	b, _ := newTestBreaker(2, time.Hour)
	defer b.stop()
	b.failure("a", true, 0, false)
	b.failure("b", true, 0, false)
	wait := func() time.Duration {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.wait
	}
	b.failure("r", false, 0, true)
	if w := wait(); w != time.Hour {
		t.Fatalf("a retry probe's failure made the wait %s, want it kept at 1h", w)
	}
	b.failure("f", true, 0, true)
	if w := wait(); w != 2*time.Hour {
		t.Fatalf("a fresh probe's failure made the wait %s, want 2h", w)
	}
	b.failure("r", false, 3*time.Second, true)
	if w := wait(); w != 3*time.Second {
		t.Fatalf("Retry-After 3s made the wait %s", w)
	}
}
