package proxy

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Order per key across a courier's death or a takeover by another replica
// (order.go keeps it within one courier's life): the marks of each busy
// key's first unsettled message, read at start and on takeover; the
// barrier that makes first deliveries wait one ack wait for what another
// courier held; and the stale time after which a marked head is no longer
// awaited.

// load reads the marks at start (floor: the consumer's ack floor, below
// which every message is settled) and, if other couriers may hold messages
// (pending: the consumer's ack-pending count), raises the barrier for
// barrier (the ack wait and a margin). staleAfter bounds the wait for a
// marked head.
func (o *orderer) load(ctx context.Context, floor uint64, pending int, barrier, staleAfter time.Duration) error {
	o.mu.Lock()
	if pending > 0 {
		o.barrierUntil = o.now().Add(barrier)
	}
	o.mu.Unlock()
	if o.marks == nil {
		return nil
	}
	marks, err := o.marks.store.Marks(ctx)
	if err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.staleAfter = staleAfter
	for k, seq := range marks {
		if seq <= floor {
			o.marks.set(k, 0) // settled: left behind by a courier that died
			continue
		}
		o.addMarked(k, seq)
	}
	return nil
}

// addMarked makes seq the awaited head of key k, known from a mark, unless
// this courier has a line for k already. Called with mu held.
func (o *orderer) addMarked(k string, seq uint64) {
	if o.lines[k] != nil {
		return
	}
	o.lines[k] = &keyLine{head: seq, marked: true, stale: o.now().Add(o.staleAfter)}
	o.stale++
}

// reload reads the marks again after a takeover: those of the courier that
// had the pin. Marks at or below floor (the consumer's ack floor, 0:
// unknown) are of settled messages, left by a courier that died: they are
// removed.
func (o *orderer) reload(ctx context.Context, floor uint64) {
	if o.marks == nil {
		return
	}
	marks, err := o.marks.store.Marks(ctx)
	if err != nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, seq := range marks {
		if seq <= floor {
			o.marks.set(k, 0)
			continue
		}
		o.addMarked(k, seq)
	}
}

// lift lets the barrier down once its time is over, and gives up on marked
// heads not seen by their stale time: their lines go on.
func (o *orderer) lift() {
	o.mu.Lock()
	now := o.now()
	var held []queued
	if !o.barrierUntil.IsZero() && now.After(o.barrierUntil) {
		o.barrierUntil, held, o.barrier = time.Time{}, o.barrier, nil
	}
	heads := map[string]uint64{}
	if o.stale > 0 {
		for k, l := range o.lines {
			if !l.stale.IsZero() && !l.inFlight && now.After(l.stale) {
				heads[k] = l.head
			}
		}
	}
	o.mu.Unlock()
	for k, seq := range heads {
		o.settled(k, seq)
	}
	for _, q := range held {
		if o.enter(q, q.okey, q.seq) {
			q.released = true
			o.rel.push(q)
		}
	}
}

// OrderMarks keeps, durably and for every replica of the durable, the
// stream sequence of the first unsettled message of each key that has later
// messages waiting or is being retried (package ordermark). Safe for
// concurrent use.
type OrderMarks interface {
	Mark(ctx context.Context, key string, seq uint64) error
	Unmark(ctx context.Context, key string) error
	Marks(ctx context.Context) (map[string]uint64, error)
}

// marker writes marks in the background, the latest wish per key first
// come, so that a hot key costs a write now and then rather than one per
// message. A crash loses at most the wishes not yet written: a few
// milliseconds' worth.
type marker struct {
	store   OrderMarks
	log     *slog.Logger
	mu      sync.Mutex
	want    map[string]uint64 // key → seq to mark; 0: unmark
	wake    chan struct{}
	done    chan struct{}
	failing bool
}

func newMarker(store OrderMarks, log *slog.Logger) *marker {
	return &marker{store: store, log: log, want: map[string]uint64{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// set asks for key's mark to be seq (0: none).
func (m *marker) set(key string, seq uint64) {
	m.mu.Lock()
	m.want[key] = seq
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// run writes what is asked until ctx ends, then what is left, and closes
// done.
func (m *marker) run(ctx context.Context) {
	defer close(m.done)
	for {
		select {
		case <-m.wake:
			m.flush(ctx)
		case <-ctx.Done():
			m.flush(context.WithoutCancel(ctx))
			return
		}
	}
}

func (m *marker) flush(ctx context.Context) {
	m.mu.Lock()
	want := m.want
	m.want = map[string]uint64{}
	m.mu.Unlock()
	for key, seq := range want {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var err error
		if seq == 0 {
			err = m.store.Unmark(wctx, key)
		} else {
			err = m.store.Mark(wctx, key, seq)
		}
		cancel()
		switch {
		case err != nil && !m.failing:
			m.failing = true
			m.log.Warn("cannot record a key's first unsettled message; if courier dies now, its later messages may go first", "error", err)
		case err == nil && m.failing:
			m.failing = false
			m.log.Info("recording keys' first unsettled messages again")
		}
	}
}

// orderBarrier is how long first deliveries of keyed messages wait after a
// start or a takeover, given the ack wait: what another courier held comes
// back within it.
func orderBarrier(ackWait time.Duration) time.Duration { return ackWait + 2*time.Second }

// startOrder reads the marks and raises the barrier (the consumer's state
// decides), then runs the marker and the lifting of the barrier on loops
// until it ends.
func (r *Runner) startOrder(ctx context.Context, loops context.Context, wg *sync.WaitGroup) {
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	floor, pending := uint64(0), 1 // unknown: as if another courier held messages
	if info, err := r.fetch.cons.Info(ictx); err == nil {
		floor, pending = info.AckFloor.Stream, info.NumAckPending
	}
	if err := r.order.load(ictx, floor, pending, orderBarrier(r.o.AckWait), r.staleAfter()); err != nil {
		r.log.Warn("cannot read the keys' first unsettled messages; order holds from now on", "error", err)
	}
	if r.order.marks != nil {
		wg.Add(1)
		go func() { defer wg.Done(); r.order.marks.run(loops) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); liftLoop(loops, r.order) }()
}

// staleAfter is how long a head known from a mark is awaited: the longest
// a retry can wait, and an ack wait.
func (r *Runner) staleAfter() time.Duration {
	return max(r.o.AckWait, r.o.BackoffMax, r.o.RetryAfterMax) + r.o.AckWait
}

// liftLoop lets o's barrier down and gives up on stale heads (lift) every
// 200ms until ctx ends.
func liftLoop(ctx context.Context, o *orderer) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			o.lift()
		}
	}
}

// takeover raises the barrier again when the pin of the consumer's
// priority group moved to this courier: the replica that had it may have
// held messages.
func (o *orderer) takeover(barrier time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.barrierUntil = o.now().Add(barrier)
}
