// Package limit bounds how many requests courier has at the app at once.
//
// A delivery path has exactly one Limiter: every request to the app (a
// delivery, a retry, a breaker probe, a batch) takes a Slot from it and gives
// it back with what came of the request. The limit is either a fixed number
// (NewFixed: a plain FIFO semaphore) or found from the app's answers
// (NewAuto: auto.go; docs/adaptive-concurrency.md says how and why).
package limit

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Reason names why a slot is taken. It labels metrics only: every reason
// shares the one limit and waits in the same FIFO line.
type Reason uint8

const (
	// Deliver is a first attempt at a message.
	Deliver Reason = iota
	// Retry is a redelivered message.
	Retry
	// Probe is a request that tests whether the app is back (the breaker's).
	Probe
	// Batch is one request carrying several messages.
	Batch
	nReasons
)

// Reasons lists every reason, in order; Stats.InFlightBy is indexed by them.
func Reasons() []Reason { return []Reason{Deliver, Retry, Probe, Batch} }

// String is the reason's metric label.
func (r Reason) String() string {
	switch r {
	case Deliver:
		return "deliver"
	case Retry:
		return "retry"
	case Probe:
		return "probe"
	case Batch:
		return "batch"
	}
	return "unknown"
}

// Outcome is what came of a request, told to Slot.Release.
type Outcome uint8

const (
	// Success: the app answered that it took the request. Its answer time
	// is a sample of how long the app takes.
	Success Outcome = iota
	// Failed: the app answered with a failure other than overload (400,
	// 500, ...). Not a sample: a failure's answer time measures another
	// code path (a validation error returns before any work, a broken
	// dependency fails fast), so it would teach a wrong unloaded time.
	Failed
	// Overload: the app said it has too much to do (429, 503). Lowers an
	// automatic limit.
	Overload
	// Timeout: no answer came within the request's timeout. Lowers an
	// automatic limit.
	Timeout
	// Dropped: nothing was learnt of the app: it could not be reached, the
	// breaker or shutdown abandoned the request, the caller gave up. Not a
	// sample and changes nothing: no answer is not a slow answer.
	Dropped
)

// Cause says what last changed a limit (courier_inflight_limit_changes_total{cause}).
type Cause uint8

const (
	// CauseNone: the limit has not changed since it was made.
	CauseNone Cause = iota
	// CauseRise: answer times stayed near the unloaded time with the limit in use.
	CauseRise
	// CauseQueueing: answer times grew past the unloaded time: the app queues.
	CauseQueueing
	// CauseOverload: the app answered 429 or 503.
	CauseOverload
	// CauseTimeout: a request timed out.
	CauseTimeout
	// CauseProbe: the limit was held low to measure the unloaded answer
	// time again, or given back after that measurement.
	CauseProbe
	nCauses
)

// Causes lists every cause, in order, for registering metrics up front;
// Stats.Changes is indexed by them.
func Causes() []Cause {
	return []Cause{CauseNone, CauseRise, CauseQueueing, CauseOverload, CauseTimeout, CauseProbe}
}

// String is the cause's metric label.
func (c Cause) String() string {
	switch c {
	case CauseNone:
		return "none"
	case CauseRise:
		return "rise"
	case CauseQueueing:
		return "queueing"
	case CauseOverload:
		return "overload"
	case CauseTimeout:
		return "timeout"
	case CauseProbe:
		return "minrtt-probe"
	}
	return "unknown"
}

// Limiter is the one bound on requests in flight to the app. Acquire takes a
// slot, waiting in FIFO order while the limit is reached; Slot.Release gives
// it back. All methods are safe for concurrent use. It starts no goroutine and
// needs no Close: an automatic limit is adjusted inside Release.
type Limiter struct {
	now  func() time.Time
	ctrl *control // nil for a fixed limit

	mu        sync.Mutex
	limit     int // in effect now
	inflight  int
	byReason  [nReasons]int
	waiters   []*waiter
	lastCause Cause
	changes   [nCauses]uint64
}

type waiter struct {
	reason Reason
	ready  chan struct{} // closed once slot is set
	slot   *Slot
}

// NewFixed returns a limiter that admits n requests at once and never changes:
// a FIFO semaphore of n. n below 1 is taken as 1 (the configuration refuses it
// before it gets here).
func NewFixed(n int) *Limiter {
	return &Limiter{now: time.Now, limit: max(n, 1)}
}

// Slot is one admitted request. Release must be called exactly once when the
// request is over, whatever became of it; later calls do nothing. A Slot may
// be released from any goroutine.
type Slot struct {
	l        *Limiter
	reason   Reason
	admitted time.Time
	epoch    uint64 // the automatic limit's epoch at admission (auto.go)
	done     atomic.Bool
}

// Acquire waits until a request for reason may be sent and returns its slot,
// or returns ctx.Err() if ctx ends first (then it holds nothing). Take the slot
// right before sending: an automatic limit reads the time from Acquire to
// Release as the app's answer time.
func (l *Limiter) Acquire(ctx context.Context, reason Reason) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := l.clock()
	l.mu.Lock()
	if len(l.waiters) == 0 && l.inflight < l.limit {
		s := l.admitLocked(reason, now)
		l.mu.Unlock()
		return s, nil
	}
	w := &waiter{reason: reason, ready: make(chan struct{})}
	l.waiters = append(l.waiters, w)
	l.mu.Unlock()

	select {
	case <-w.ready:
		return w.slot, nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	select {
	case <-w.ready:
		// Admitted while ctx ended: give the place to the next in line.
		l.mu.Unlock()
		w.slot.Release(Dropped)
		return nil, ctx.Err()
	default:
	}
	for i, o := range l.waiters {
		if o == w {
			l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
			break
		}
	}
	l.mu.Unlock()
	return nil, ctx.Err()
}

// TryAcquire takes a slot only if one is free now and nobody waits for one.
func (l *Limiter) TryAcquire(reason Reason) (*Slot, bool) {
	now := l.clock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.waiters) > 0 || l.inflight >= l.limit {
		return nil, false
	}
	return l.admitLocked(reason, now), true
}

// clock reads the time for an automatic limit, outside the lock; a fixed
// limit needs none.
func (l *Limiter) clock() time.Time {
	if l.ctrl == nil {
		return time.Time{}
	}
	return l.now()
}

func (l *Limiter) admitLocked(reason Reason, now time.Time) *Slot {
	l.inflight++
	l.byReason[reason]++
	s := &Slot{l: l, reason: reason, admitted: now}
	if l.ctrl != nil {
		s.epoch = l.ctrl.admitted(l.inflight)
	}
	return s
}

// Release gives the slot back and tells the limiter what came of the request.
// Only the first call counts.
func (s *Slot) Release(o Outcome) {
	if !s.done.CompareAndSwap(false, true) {
		return
	}
	l := s.l
	now := l.clock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight--
	l.byReason[s.reason]--
	if l.ctrl != nil && o != Dropped {
		if limit, cause, changed := l.ctrl.observe(s, o, now); changed {
			l.setLimitLocked(limit, cause)
		}
	}
	l.wakeLocked()
}

// setLimitLocked puts a new limit in effect and counts the change by cause.
func (l *Limiter) setLimitLocked(limit int, cause Cause) {
	if limit == l.limit {
		return
	}
	l.limit = limit
	l.lastCause = cause
	l.changes[cause]++
	l.wakeLocked()
}

// wakeLocked admits waiters, first come first served, while places are free.
func (l *Limiter) wakeLocked() {
	for len(l.waiters) > 0 && l.inflight < l.limit {
		w := l.waiters[0]
		l.waiters[0] = nil
		l.waiters = l.waiters[1:]
		w.slot = l.admitLocked(w.reason, l.clock())
		close(w.ready)
	}
}

// Stats is a consistent picture of a limiter, for metrics and `courier status`.
type Stats struct {
	// Auto is true for an automatic limit.
	Auto bool
	// Limit is the limit in effect (courier_inflight_limit).
	Limit int
	// Max is the ceiling: the fixed number, or N of auto:N.
	Max int
	// MinRTT is the answer time taken as unloaded
	// (courier_inflight_limit_min_rtt_seconds); zero for a fixed limit or
	// before it is first measured.
	MinRTT time.Duration
	// InFlight counts the slots held, and InFlightBy those held per Reason.
	InFlight   int
	InFlightBy [nReasons]int
	// Waiting counts callers blocked in Acquire.
	Waiting int
	// LastCause says what last changed the limit.
	LastCause Cause
	// Changes counts the changes of the limit per Cause
	// (courier_inflight_limit_changes_total{cause}).
	Changes [nCauses]uint64
}

// Stats returns the limiter's state at one instant.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := Stats{
		Limit:      l.limit,
		Max:        l.limit,
		InFlight:   l.inflight,
		InFlightBy: l.byReason,
		Waiting:    len(l.waiters),
		LastCause:  l.lastCause,
		Changes:    l.changes,
	}
	if l.ctrl != nil {
		st.Auto = true
		st.Max = l.ctrl.max
		st.MinRTT = l.ctrl.minRTT
	}
	return st
}

// Limit returns the limit in effect.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}

// InFlight returns how many slots are held.
func (l *Limiter) InFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inflight
}

// MinRTT returns the answer time an automatic limit takes as unloaded (zero
// for a fixed limit or before it is measured).
func (l *Limiter) MinRTT() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctrl == nil {
		return 0
	}
	return l.ctrl.minRTT
}
