package proxy

import (
	"fmt"
	"sync"
	"time"
)

// breaker stops sending when the app answers transient failures again and
// again, from more than one message: it is up, but something it depends on
// (its database) is not. Like an unreachable app, that is not the messages'
// fault: the gate closes (cause breakerOpen), courier holds what it has and
// spends nothing, and lets one probe message through at a time, after
// BreakerProbe (or the app's Retry-After), doubling per failed probe up to
// BackoffMax. Any answer that is not a transient failure closes it. One
// message failing among successes never opens it: every success resets the
// count. Safe for concurrent use.
type breaker struct {
	threshold int // 0: never opens
	first     time.Duration
	most      time.Duration
	gate      *gate

	mu       sync.Mutex
	streak   int
	firstKey string
	distinct bool // the streak spans more than one message
	open     bool
	wait     time.Duration
	timer    *time.Timer
	// probes receives a token each time a probe may go.
	probes chan struct{}
}

func newBreaker(threshold int, first, most time.Duration, g *gate) *breaker {
	return &breaker{threshold: threshold, first: first, most: max(most, first), gate: g, probes: make(chan struct{}, 1)}
}

// success notes an answer that is not a transient failure.
func (b *breaker) success() {
	b.mu.Lock()
	b.streak, b.distinct = 0, false
	wasOpen := b.open
	b.open = false
	if b.timer != nil {
		b.timer.Stop()
	}
	// A token left over would let a message through as a probe later.
	select {
	case <-b.probes:
	default:
	}
	b.mu.Unlock()
	if wasOpen {
		b.gate.free(causeBreaker)
	}
}

// failure notes a transient failure of the message with key; retryAfter is
// the app's Retry-After (0 if none); probe says whether it was a probe.
func (b *breaker) failure(key string, retryAfter time.Duration, probe bool) {
	if b.threshold <= 0 {
		return
	}
	b.mu.Lock()
	if b.open {
		if probe {
			b.wait = min(2*b.wait, b.most)
			if retryAfter > 0 {
				b.wait = retryAfter
			}
			b.schedule()
		}
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
	b.open = true
	b.wait = b.first
	if retryAfter > 0 {
		b.wait = retryAfter
	}
	b.schedule()
	streak, wait := b.streak, b.wait
	b.mu.Unlock()
	b.gate.hold(causeBreaker, fmt.Sprintf("%d transient failures in a row from the app; probing with one message after %s",
		streak, wait.Round(time.Millisecond)))
}

// retryProbe lets another probe go after the current wait: the token was
// taken by a worker that could not use it (another cause holds deliveries).
func (b *breaker) retryProbe() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open {
		b.schedule()
	}
}

// schedule sends a probe token after b.wait. Called with mu held.
func (b *breaker) schedule() {
	if b.timer != nil {
		b.timer.Stop()
	}
	b.timer = time.AfterFunc(b.wait, func() {
		select {
		case b.probes <- struct{}{}:
		default:
		}
	})
}

// stop stops the probe timer.
func (b *breaker) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timer != nil {
		b.timer.Stop()
	}
}
