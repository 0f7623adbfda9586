package proxy

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// breaker stops sending when the app answers transient failures again and
// again, from more than one message: it is up, but something it depends on
// (its database) is not. Like an unreachable app, that is not the messages'
// fault: the gate closes (cause breakerOpen), courier holds what it has and
// spends nothing, and lets one probe message through at a time, after
// BreakerProbe (or the app's Retry-After), doubling per failed probe up to
// BreakerProbeMax: an app that recovers waits at most that long for the
// next probe, however long the storm lasted. /readyz and the log say when
// the next probe goes. Any answer that is not a transient failure closes
// it.
//
// It must tell an outage from messages that fail on their own. Only
// failures of fresh messages (on their first delivery) count toward
// opening: a retry, or a redelivery after a restart (they come first), has
// failed before and says little about the app, so a backlog of them never
// opens it. Retries' failures neither count nor break a streak; every
// success resets it, so one message failing among successes never opens
// it. While open, the probe is a fresh message when one is held, and only a
// fresh probe's failure doubles the wait.
//
// Probing must never stop: each held message that may be the probe waits on
// a ticket of its own (enlist), and the breaker hands the go-ahead to one
// ticket, fresh ones first; a go-ahead with no ticket to take it is kept
// (pending) for the next. A probe that cannot be sent at once (it waits for
// another delivery of its key, the store, another replica's claim) hands
// the go-ahead on (handOn) rather than keep it while it waits. Safe for
// concurrent use.
type breaker struct {
	threshold int // 0: never opens
	first     time.Duration
	most      time.Duration
	gate      *gate
	log       *slog.Logger

	mu       sync.Mutex
	streak   int
	firstKey string
	distinct bool // the streak spans more than one message
	open     bool
	wait     time.Duration
	timer    *time.Timer
	// next is when the probe timer fires (the gate's clock); past once it
	// has, while the probe it let go is under way.
	next time.Time
	// waiting are the tickets of held messages that may be the probe, in
	// the order they enlisted.
	waiting []*probeTicket
	// pending: a probe may go, and no ticket was waiting to take it.
	pending bool
}

// probeTicket is one held message's place among the probe candidates.
type probeTicket struct {
	fresh bool
	ahead chan struct{} // receives the go-ahead; capacity 1
}

// newBreaker returns a breaker that holds g's causeBreaker; most caps the
// wait between probes (never below first). It tells g what to add to the
// hold's reason for /readyz: when the next probe goes.
func newBreaker(threshold int, first, most time.Duration, g *gate, log *slog.Logger) *breaker {
	b := &breaker{threshold: threshold, first: first, most: max(most, first), gate: g, log: log}
	g.detail[causeBreaker] = b.nextProbe
	return b
}

// success notes an answer that is not a transient failure.
func (b *breaker) success() {
	b.mu.Lock()
	b.streak, b.distinct = 0, false
	wasOpen := b.open
	b.open, b.pending = false, false
	if b.timer != nil {
		b.timer.Stop()
	}
	b.mu.Unlock()
	if wasOpen {
		b.gate.free(causeBreaker)
	}
}

// failure notes a transient failure of the message with key; fresh says it
// was the message's first delivery, retryAfter is the app's Retry-After (0
// if none), probe says whether it was a probe.
func (b *breaker) failure(key string, fresh bool, retryAfter time.Duration, probe bool) {
	if b.threshold <= 0 {
		return
	}
	b.mu.Lock()
	if b.open {
		if !probe {
			b.mu.Unlock()
			return
		}
		was := b.wait
		if fresh {
			b.wait = min(2*b.wait, b.most)
		}
		if retryAfter > 0 {
			b.wait = retryAfter
		}
		b.schedule()
		wait, next := b.wait, b.next
		b.mu.Unlock()
		if wait != was {
			// Logged when the wait changes, not at every probe: it settles
			// at the cap (or the app's Retry-After) within a few probes.
			b.log.Info("breaker still open: the probe failed", "next_probe_in", wait.Round(time.Millisecond).String(),
				"next_probe_at", next.UTC().Format(time.RFC3339), "probing_every", b.every(wait, retryAfter))
		}
		return
	}
	if !fresh {
		b.mu.Unlock()
		return
	}
	b.streak++
	if b.streak == 1 {
		b.firstKey = key
	} else if key != b.firstKey {
		b.distinct = true
	}
	if b.streak < b.threshold || !b.distinct {
		b.mu.Unlock()
		return
	}
	b.open, b.pending = true, false
	b.wait = b.first
	if retryAfter > 0 {
		b.wait = retryAfter
	}
	b.schedule()
	streak := b.streak
	b.mu.Unlock()
	// The hold's reason says what opened it; when the next probe goes
	// changes, and /readyz adds it (nextProbe), as does the log line
	// the gate writes (gateLog).
	b.gate.hold(causeBreaker, fmt.Sprintf("%d transient failures in a row from the app; probing with one message at a time", streak))
}

// every says how often probes go from now on while they fail: the wait,
// which grows no more once at the cap (unless the app's Retry-After sets
// it).
func (b *breaker) every(wait, retryAfter time.Duration) string {
	if retryAfter > 0 {
		return "as the app's Retry-After asks"
	}
	if wait >= b.most {
		return wait.Round(time.Millisecond).String() + " (the most)"
	}
	return "doubling up to " + b.most.Round(time.Millisecond).String()
}

// nextProbe says, while the breaker is open, when the next probe goes: ""
// while it is closed.
func (b *breaker) nextProbe() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return ""
	}
	now := b.gate.now()
	switch {
	case b.next.After(now):
		return fmt.Sprintf("next probe in %s (at %s)", b.next.Sub(now).Round(100*time.Millisecond), b.next.UTC().Format(time.RFC3339))
	case b.pending:
		return "next probe: the next message held or fetched"
	}
	return "a probe is under way"
}

// probeState is the breaker's state for State: whether it is open, when the
// next probe goes (zero while one is under way or none is due), the wait
// between probes and its cap.
func (b *breaker) probeState() (open bool, next time.Time, wait, most time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return false, time.Time{}, 0, b.most
	}
	if b.next.After(b.gate.now()) {
		next = b.next
	}
	return true, next, b.wait, b.most
}

// enlist makes a held message a probe candidate until leave; its ticket
// receives the go-ahead when it is to be the probe.
func (b *breaker) enlist(fresh bool) *probeTicket {
	t := &probeTicket{fresh: fresh, ahead: make(chan struct{}, 1)}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open && b.pending {
		b.pending = false
		t.ahead <- struct{}{}
		return t
	}
	b.waiting = append(b.waiting, t)
	return t
}

// leave ends t's candidacy. A go-ahead it received but did not use goes to
// the next candidate.
func (b *breaker) leave(t *probeTicket) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i := slices.Index(b.waiting, t); i >= 0 {
		b.waiting = slices.Delete(b.waiting, i, i+1)
	}
	select {
	case <-t.ahead:
		b.dispatch()
	default:
	}
}

// retryProbe lets another probe go after the current wait: the go-ahead
// went to a message that could not use it (another cause holds deliveries).
func (b *breaker) retryProbe() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open {
		b.schedule()
	}
}

// handOn passes the go-ahead of a probe that reached no app (a duplicate,
// an expired message, one that must wait for its key or the store) to the
// next candidate at once: no request was spent on it.
func (b *breaker) handOn() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dispatch()
}

// dispatch gives the go-ahead to a waiting candidate, a fresh one first, or
// keeps it pending. Called with mu held.
func (b *breaker) dispatch() {
	if !b.open {
		return
	}
	if len(b.waiting) == 0 {
		b.pending = true
		return
	}
	i := slices.IndexFunc(b.waiting, func(t *probeTicket) bool { return t.fresh })
	if i < 0 {
		i = 0
	}
	t := b.waiting[i]
	b.waiting = slices.Delete(b.waiting, i, i+1)
	t.ahead <- struct{}{}
}

// schedule dispatches a go-ahead after b.wait. Called with mu held.
func (b *breaker) schedule() {
	if b.timer != nil {
		b.timer.Stop()
	}
	b.next = b.gate.now().Add(b.wait)
	b.timer = time.AfterFunc(b.wait, b.handOn)
}

// stop stops the probe timer.
func (b *breaker) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timer != nil {
		b.timer.Stop()
	}
}
