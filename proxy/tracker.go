package proxy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// tracker keeps every message courier holds from being redelivered: a
// message held longer than half the ack wait is marked in progress, again
// every half ack wait. It also serves as the liveness heartbeat. Safe for
// concurrent use.
type tracker struct {
	mu   sync.Mutex
	msgs map[jetstream.Msg]time.Time // last time JetStream heard of it
	// lapsed, for a message of a pinned group admitted to its key's line,
	// reports whether it is no longer this courier's to send (orderer.lapse):
	// it is then no longer kept in progress.
	lapsed map[jetstream.Msg]func() bool
	// retrying is, for each message given back with a delay (its stream
	// sequence, as Runner.Delivering asks), until when it may be out
	// waiting for it: its delay and an ack wait.
	retrying map[uint64]time.Time
	ackWait  time.Duration
	now      func() time.Time
	beat     atomic.Int64 // unix nanos of the last tick
	sent     func()
	retime   chan struct{} // the ack wait changed
}

func newTracker(ackWait time.Duration, now func() time.Time, sent func()) *tracker {
	t := &tracker{msgs: make(map[jetstream.Msg]time.Time), lapsed: make(map[jetstream.Msg]func() bool), retrying: make(map[uint64]time.Time), ackWait: ackWait, now: now, sent: sent,
		retime: make(chan struct{}, 1)}
	t.beat.Store(now().UnixNano())
	return t
}

// add tracks m; a partition's message counts among what the courier holds
// of its partition (session.held) until it is removed.
func (t *tracker) add(m jetstream.Msg) {
	t.mu.Lock()
	if len(t.retrying) > 0 {
		// A retry come back is held again, no longer retrying.
		if meta, err := m.Metadata(); err == nil {
			delete(t.retrying, streamSeq(m, meta))
		}
	}
	if _, ok := t.msgs[m]; !ok {
		if sm, ok := m.(*sourcedMsg); ok {
			sm.held.Add(1)
		}
	}
	t.msgs[m] = t.now()
	t.mu.Unlock()
}

// lapse stops keeping m in progress once lapsed reports true: a message
// of a pinned group that this courier has not sent when the pin moved to
// another (orderer.lapse). JetStream then redelivers it within an ack wait
// of the last signal, to the courier pinned now, which awaits it that
// long (orderer.awaitRetained); kept in progress, it would stay out for
// as long as this courier held it (a dedup check, a closed gate).
func (t *tracker) lapse(m jetstream.Msg, lapsed func() bool) {
	t.mu.Lock()
	if _, ok := t.msgs[m]; ok {
		t.lapsed[m] = lapsed
	}
	t.mu.Unlock()
}

// retried notes that the message at seq was given back to be delivered
// again after delay: until then and an ack wait, it is still being
// delivered (Runner.Delivering), though no longer held.
func (t *tracker) retried(seq uint64, delay time.Duration) {
	t.mu.Lock()
	t.retrying[seq] = t.now().Add(delay + t.ackWait)
	t.mu.Unlock()
}

// isRetrying reports whether the message at seq was given back with a
// delay that, with an ack wait, has not run out.
func (t *tracker) isRetrying(seq uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	until, ok := t.retrying[seq]
	return ok && t.now().Before(until)
}

func (t *tracker) remove(m jetstream.Msg) {
	t.mu.Lock()
	if _, ok := t.msgs[m]; ok {
		delete(t.msgs, m)
		delete(t.lapsed, m)
		if sm, ok := m.(*sourcedMsg); ok {
			sm.held.Add(-1)
		}
	}
	t.mu.Unlock()
}

// held is how many messages are tracked.
func (t *tracker) held() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.msgs)
}

// lapsedOf is how many tracked messages have lapsed (lapse): admitted
// before the pin moved away and not sent, so JetStream may have delivered
// them to another courier since, whose delivery the consumer counts as
// out. Of a partition's messages only, when part is that partition's held
// count (session.held); of all, when it is nil. Whether one has is asked
// without the lock, as in due.
func (t *tracker) lapsedOf(part *atomic.Int64) int {
	var asks []func() bool
	t.mu.Lock()
	for m, ask := range t.lapsed {
		if sm, ok := m.(*sourcedMsg); part != nil && (!ok || sm.held != part) {
			continue
		}
		asks = append(asks, ask)
	}
	t.mu.Unlock()
	n := 0
	for _, ask := range asks {
		if ask() {
			n++
		}
	}
	return n
}

// setAckWait changes the ack wait the signals are timed by: the consumer's
// on the server, which another instance (a rollout) may change under this one.
func (t *tracker) setAckWait(d time.Duration) {
	if d <= 0 {
		return
	}
	t.mu.Lock()
	t.ackWait = d
	t.mu.Unlock()
	select {
	case t.retime <- struct{}{}:
	default:
	}
}

// tickEvery is how often the tracker looks: a quarter of the ack wait, so no
// message goes longer than three quarters of it without a signal.
func (t *tracker) tickEvery() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return max(t.ackWait/4, 10*time.Millisecond)
}

// run marks held messages in progress until ctx ends.
func (t *tracker) run(ctx context.Context) {
	tk := time.NewTicker(t.tickEvery())
	defer tk.Stop()
	var due []jetstream.Msg
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.retime:
			tk.Reset(t.tickEvery())
		case <-tk.C:
		}
		now := t.now()
		t.beat.Store(now.UnixNano())
		due = t.due(due[:0], now)
		t.forgetRetries(now)
		// The signals are sent under the lock: a worker removes a message
		// (taking the lock) before it acks or NAKs it, so no in-progress
		// signal can follow a NAK and turn its delay into a full ack wait.
		// Sending is a buffered publish, quick even for many messages.
		t.mu.Lock()
		for _, m := range due {
			if _, ok := t.msgs[m]; !ok {
				continue
			}
			t.msgs[m] = now
			if m.InProgress() == nil {
				t.sent()
			}
		}
		t.mu.Unlock()
	}
}

// forgetRetries forgets the retries whose time ran out.
func (t *tracker) forgetRetries(now time.Time) {
	t.mu.Lock()
	for seq, until := range t.retrying {
		if !now.Before(until) {
			delete(t.retrying, seq)
		}
	}
	t.mu.Unlock()
}

// due appends to due the messages whose last signal is half an ack wait
// old and that have not lapsed. Whether one has is asked without the lock:
// the lines it asks take their own lock, and call remove under it.
func (t *tracker) due(due []jetstream.Msg, now time.Time) []jetstream.Msg {
	var asks []func() bool
	t.mu.Lock()
	for m, last := range t.msgs {
		if now.Sub(last) >= t.ackWait/2 {
			due = append(due, m)
			asks = append(asks, t.lapsed[m])
		}
	}
	t.mu.Unlock()
	kept := due[:0]
	for i, m := range due {
		if asks[i] == nil || !asks[i]() {
			kept = append(kept, m)
		}
	}
	return kept
}

// lastBeat is when the tracker last ticked.
func (t *tracker) lastBeat() time.Time { return time.Unix(0, t.beat.Load()) }

// flights coalesces concurrent deliveries of one key in this process: the
// first caller owns the key; the others wait for its outcome. Safe for
// concurrent use.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

// flight is one delivery of a key under way. Its done channel is made by
// the first caller that waits for it (most flights have none), under the
// flights' lock; ok is set under it too, before done is closed.
type flight struct {
	done chan struct{} // nil until someone waits; closed when the flight ends
	ok   bool
}

func newFlights() *flights { return &flights{m: make(map[string]*flight)} }

// claim makes own (a new flight, held in the caller's delivery so that it
// costs no allocation of its own) the flight of key once this caller owns
// the key, and returns it; or dup=true if another delivery of the key
// succeeded while this one waited. waiting (nil: none) is called once,
// before the first wait.
func (f *flights) claim(ctx context.Context, key string, own *flight, waiting func()) (fl *flight, dup bool, err error) {
	for {
		f.mu.Lock()
		other, busy := f.m[key]
		if !busy {
			f.m[key] = own
			f.mu.Unlock()
			return own, false, nil
		}
		if other.done == nil {
			other.done = make(chan struct{})
		}
		done := other.done
		f.mu.Unlock()
		if waiting != nil {
			waiting()
			waiting = nil
		}
		select {
		case <-done:
			if other.ok {
				return nil, true, nil
			}
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

// finish ends the flight of key with its outcome and wakes its waiters.
func (f *flights) finish(key string, fl *flight, ok bool) {
	if fl == nil {
		return
	}
	f.mu.Lock()
	delete(f.m, key)
	fl.ok = ok
	if fl.done != nil {
		close(fl.done)
	}
	f.mu.Unlock()
}
