package proxy

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/courierhq/courier/ordermark"
)

// Order per key across a courier's death or a takeover by another replica
// (order.go keeps it within one courier's life): the marks of each busy
// key's first unsettled message, read at start and on takeover; the
// barrier that makes keyed messages wait one ack wait for what another
// courier held, and then go in stream order, or only until the pull the
// pin comes with has brought it all back (hold, open; pin.go); and the
// stale time after which a marked head is no longer awaited.

// load reads the marks at start (floor: the consumer's ack floor, below
// which every message is settled) and, if other couriers may hold messages
// (pending: the consumer's ack-pending count), raises the barrier for
// barrier (the ack wait and a margin). A marked head is awaited as long,
// or that long after its retry is due.
func (o *orderer) load(ctx context.Context, floor uint64, pending int, barrier time.Duration) error {
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
	o.markWait = barrier
	for k, m := range marks {
		if m.Seq <= floor {
			o.marks.set(k, ordermark.Mark{}) // settled: left behind by a courier that died
			continue
		}
		o.addMarked(k, m)
	}
	return nil
}

// addMarked makes m's message the awaited head of key k, known from a
// mark, unless this courier has a line for k already. It is awaited for
// markWait, or as long after its retry is due: a head not being retried
// comes back within an ack wait of the death of the courier that held it,
// and one that does not was settled before its mark could be changed.
// Called with mu held.
func (o *orderer) addMarked(k string, m ordermark.Mark) {
	if o.lines[k] != nil {
		return
	}
	o.lines[k] = &keyLine{head: m.Seq, marked: true, stale: later(o.now(), m.Due).Add(o.markWait)}
	o.stale++
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// reload reads the marks again after a takeover: those of the courier that
// had the pin. A head known from an earlier read of the marks (at start,
// while another courier was pinned) that the marks no longer name was
// settled meanwhile: its line goes on. It returns the marks read (nil:
// none kept, or they cannot be read).
func (o *orderer) reload(ctx context.Context) map[string]ordermark.Mark {
	if o.marks == nil {
		return nil
	}
	marks, err := o.marks.store.Marks(ctx)
	if err != nil {
		return nil
	}
	o.mu.Lock()
	gone := map[string]uint64{}
	for k, l := range o.lines {
		if m, ok := marks[k]; !l.retained && !l.stale.IsZero() && !l.inFlight && (!ok || m.Seq != l.head) {
			// The mark is the other courier's to change or remove.
			if len(l.waiting) > 0 {
				gone[k], l.marked = l.head, false
				continue
			}
			delete(o.lines, k)
			o.stale--
		}
	}
	o.mu.Unlock()
	for k, seq := range gone {
		o.settled(k, seq)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, m := range marks {
		o.addMarked(k, m)
	}
	return marks
}

// dueAfter counts the marks of retries (above floor, the consumer's ack
// floor) due after t: messages out that come back later, each its key's
// awaited head.
func dueAfter(marks map[string]ordermark.Mark, floor uint64, t time.Time) int {
	n := 0
	for _, m := range marks {
		if m.Seq > floor && m.Due.After(t) {
			n++
		}
	}
	return n
}

// lift lets the barrier down once its time is over, and gives up on marked
// heads not seen by their stale time: their lines go on.
func (o *orderer) lift() {
	o.mu.Lock()
	now := o.now()
	var held []queued
	timed := !o.barrierUntil.IsZero()
	if !o.holding && (timed && now.After(o.barrierUntil) || !timed && len(o.barrier) > 0) {
		o.barrierUntil, held, o.barrier = time.Time{}, o.barrier, nil
		slices.SortFunc(held, func(a, b queued) int { return cmp.Compare(a.seq, b.seq) })
	}
	heads := map[string]uint64{}
	if o.stale > 0 {
		for k, l := range o.lines {
			if l.stale.IsZero() || l.inFlight || !now.After(l.stale) {
				continue
			}
			if o.floor > 0 && l.head > o.floor && l.extended < staleExtensions {
				// Still out as far as the consumer knows (its ack floor
				// has not passed it): its redelivery may have been lost
				// or delayed by a leader's election, or given to another
				// courier as the pin moved. Awaited longer, a few times.
				l.stale, l.extended = now.Add(o.markWait), l.extended+1
				continue
			}
			// Given up without removing the mark: it may be the pinned
			// courier's, if this one stands by. So is what else of the
			// key was out.
			heads[k], l.marked, l.out = l.head, false, nil
		}
	}
	o.mu.Unlock()
	for k, seq := range heads {
		o.settled(k, seq)
	}
	for _, q := range held {
		if o.enter(q, q.okey, q.seq) {
			q.letGo = true
			o.rel.push(q)
		}
	}
}

// ackFloor is told the consumer's ack floor: every message at or below it
// is settled. A line whose head is one of them and is not with a worker
// goes on: the head was settled by another courier (one that held it too
// while the pin moved) or known from a mark left behind. A head known from
// a mark only is let go without removing the mark: it may be the pinned
// courier's.
func (o *orderer) ackFloor(floor uint64) {
	o.mu.Lock()
	o.floor = floor
	heads := map[string]uint64{}
	for k, l := range o.lines {
		l.out, l.retried = after(l.out, floor), after(l.retried, floor)
		if !l.inFlight && l.head <= floor {
			if !l.stale.IsZero() {
				l.marked = false
			}
			heads[k] = l.head
		}
	}
	o.mu.Unlock()
	for k, seq := range heads {
		o.settled(k, seq)
	}
}

// markDrained marks, as the lines are given up (drain), each key's first
// unsettled message: its line's head. A head still with a worker is
// noted (givenBack): once it is settled here the mark moves on to the
// first message given back behind it, or goes; once it is retried the
// mark says when it is due. Called with mu held.
func (o *orderer) markDrained() {
	if o.marks == nil {
		return
	}
	for k, l := range o.lines {
		if l.inFlight {
			var next uint64
			if len(l.waiting) > 0 {
				next = l.waiting[0].seq
			}
			if o.givenBack == nil {
				o.givenBack = map[string]givenBack{}
			}
			o.givenBack[k] = givenBack{head: l.head, next: next}
			l.marked = true
			o.marks.set(k, ordermark.Mark{Seq: l.head})
			continue
		}
		if !l.marked {
			l.marked = true
			o.marks.set(k, ordermark.Mark{Seq: l.head})
		}
	}
}

// markGivenBack marks, for each key of msgs without a line (those with
// one keep their line's mark: its head comes first), the first of them:
// given back to JetStream, they come back to the courier that comes next
// in no particular order (JETSTREAM.md, "Order"), and the marks make it
// await each key's first. Called with mu held.
func (o *orderer) markGivenBack(msgs []queued) {
	if o.marks == nil {
		return
	}
	first := map[string]uint64{}
	for _, q := range msgs {
		if q.okey == "" || o.lines[q.okey] != nil {
			continue
		}
		if s, ok := first[q.okey]; !ok || q.seq < s {
			first[q.okey] = q.seq
		}
	}
	for k, seq := range first {
		o.marks.set(k, ordermark.Mark{Seq: seq})
	}
}

// marker writes marks in the background, the latest wish per key first
// come, so that a hot key costs a write now and then rather than one per
// message. A crash loses at most the wishes not yet written: a few
// milliseconds' worth.
type marker struct {
	store   OrderMarks
	log     *slog.Logger
	mu      sync.Mutex
	want    map[string]ordermark.Mark // key → its mark; Seq 0: unmark
	wake    chan struct{}
	done    chan struct{}
	failing bool
	// unwritten: wishes were left unwritten when run ended (the store
	// could not be reached): a hand-over is not clean (finishSession).
	unwritten bool
}

func newMarker(store OrderMarks, log *slog.Logger) *marker {
	return &marker{store: store, log: log, want: map[string]ordermark.Mark{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// set asks for key's mark to be mk (Seq 0: none).
func (m *marker) set(key string, mk ordermark.Mark) {
	m.mu.Lock()
	m.want[key] = mk
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// run writes what is asked until ctx ends, then what is left (trying for
// up to markFinalTries), and closes done. A wish that cannot be written is
// kept and tried again with the next, unless a newer one replaced it.
// Writes outlive ctx (each bounded by its own timeout): one cut short as
// the loops stop would fail for nothing, and leave a mark the next courier
// relies on unwritten.
func (m *marker) run(ctx context.Context) {
	defer close(m.done)
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	write := context.WithoutCancel(ctx)
	for {
		select {
		case <-m.wake:
			m.flush(write)
		case <-retry.C:
			m.flush(write)
		case <-ctx.Done():
			for try := 0; m.flush(write) && try < markFinalTries; try++ {
				time.Sleep(200 * time.Millisecond)
			}
			m.mu.Lock()
			m.unwritten = len(m.want) > 0
			m.mu.Unlock()
			return
		}
	}
}

// markFinalTries is how many times run tries again, when it ends, to write
// what the store refused.
const markFinalTries = 10

// written reports, once run has ended, whether every wish was written.
func (m *marker) written() bool {
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.unwritten
}

// flush writes the wishes; it reports whether any was left unwritten (and
// kept for the next flush).
func (m *marker) flush(ctx context.Context) (left bool) {
	m.mu.Lock()
	want := m.want
	m.want = map[string]ordermark.Mark{}
	m.mu.Unlock()
	for key, mk := range want {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var err error
		if mk.Seq == 0 {
			err = m.store.Unmark(wctx, key)
		} else {
			err = m.store.Mark(wctx, key, mk)
		}
		cancel()
		if err != nil {
			left = true
			m.mu.Lock()
			if _, newer := m.want[key]; !newer {
				m.want[key] = mk
			}
			m.mu.Unlock()
		}
		switch {
		case err != nil && !m.failing:
			m.failing = true
			m.log.Warn("cannot record a key's first unsettled message; if courier dies now, its later messages may go first", "error", err)
		case err == nil && m.failing:
			m.failing = false
			m.log.Info("recording keys' first unsettled messages again")
		}
	}
	return left
}

// staleExtensions is how many times a head awaited until stale is awaited
// a markWait longer while the consumer's ack floor is below it (lift).
const staleExtensions = 2

// orderBarrier is how long first deliveries of keyed messages wait after a
// start or a takeover, given the ack wait: what another courier held comes
// back within it.
func orderBarrier(ackWait time.Duration) time.Duration { return ackWait + 2*time.Second }

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
			if o.marks != nil && o.barrierDue() {
				// Marks a courier before this one wrote late (its bucket
				// without quorum for a while) are read before keyed
				// messages go: each key's awaited head with them.
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				o.reload(rctx)
				cancel()
			}
			o.lift()
		}
	}
}

// postpone starts the waits for what is out over, as the consumer does not
// answer (its leader is being elected, its node is lost): nothing out can
// come back meanwhile, so neither a head awaited until stale nor the
// barrier of a takeover gives up before markWait after now. Called by the
// fetcher each time a read of the consumer fails.
func (o *orderer) postpone() {
	o.mu.Lock()
	defer o.mu.Unlock()
	until := o.now().Add(o.markWait)
	for _, l := range o.lines {
		if !l.stale.IsZero() {
			l.stale = later(l.stale, until)
		}
	}
	if !o.barrierUntil.IsZero() {
		o.barrierUntil = later(o.barrierUntil, until)
	}
}

// awaiting reports whether a line awaits a head until stale, or a
// takeover's barrier stands: what is out is awaited for a time.
func (o *orderer) awaiting() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stale > 0 || !o.barrierUntil.IsZero()
}

// barrierDue reports whether a timed barrier is up and its time is over:
// the next lift lets it down.
func (o *orderer) barrierDue() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.holding && !o.barrierUntil.IsZero() && o.now().After(o.barrierUntil)
}

// awaitOut makes each key of outs await its messages there, in stream
// order: those the consumer had out when the pin came to this courier
// (fetcher.waitForOut). Each comes back within the ack wait if the courier
// that held it died, or was settled by that courier: it is awaited, as a
// head kept when the pin moved away (retained), until the ack floor
// passes it (ackFloor) or for markWait. A key with a line already (this
// courier's, or a mark's) awaits those after its head; and, if its head is
// not with a worker, those before it first: a mark may name a later
// message than one still out (written by a courier that took the pin
// without knowing what was out, and gave back only the later one).
func (o *orderer) awaitOut(outs map[string][]uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, seqs := range outs {
		l := o.lines[k]
		switch {
		case l == nil:
			l = &keyLine{head: seqs[0], retained: true}
			o.lines[k] = l
			o.awaitRetained(l, o.now())
		case !l.inFlight && seqs[0] < l.head:
			l.out = append(l.out, l.head)
			l.head, l.retained, l.here = seqs[0], true, false
			stale := l.stale
			o.awaitRetained(l, o.now())
			l.stale = later(l.stale, stale)
		}
		merged := append(slices.Clone(l.out), after(seqs, l.head)...)
		slices.Sort(merged)
		l.out = slices.Compact(merged)
	}
}

// after is seqs, in stream order, without those up to seq.
func after(seqs []uint64, seq uint64) []uint64 {
	i, found := slices.BinarySearch(seqs, seq)
	if found {
		i++
	}
	return seqs[i:]
}

// setLease makes the lines follow this courier's membership term (lease:
// Membership.Term), from the term it is in now.
func (o *orderer) setLease(lease func() (uint64, bool)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lease = lease
	o.term, _ = lease()
}

// leaseHeld reports whether this courier's membership is live, in the term
// the lines are in. Once it is not, every message admitted before is
// outdated (the epoch moves on), and stays so: another courier may have
// been given the pin meanwhile, and sends those keys now. Called with mu
// held.
func (o *orderer) leaseHeld() bool {
	if o.lease == nil {
		return true
	}
	if o.lapsed {
		return false
	}
	if term, live := o.lease(); live && term == o.term {
		return true
	}
	o.lapsed = true
	o.epoch++
	return false
}

// lapsedNow reports whether this courier's membership lapsed and the
// fetcher has yet to give back what the lines hold (fetcher.checkLease).
func (o *orderer) lapsedNow() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.leaseHeld()
}

// renew puts the lines in term, once the membership is live again and
// what they held was given back.
func (o *orderer) renew(term uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.term, o.lapsed = term, false
}

// takeover raises the barrier again when the pin of the consumer's
// priority group moved to this courier: the replica that had it may have
// held messages.
func (o *orderer) takeover(barrier time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.barrierUntil = o.now().Add(barrier)
}

// hold makes keyed messages wait at the barrier until open: the pull the
// pin came with may bring back every message the consumer has out, but
// one at a time, in the order they fell due (JETSTREAM.md, "Order"), and
// a key's head may be settled before an earlier message than the next
// one has arrived.
func (o *orderer) hold() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.holding = true
}

// open ends hold: what waited at the barrier goes in stream order, unless
// a timed barrier (a start's, a takeover's) still stands. all: every
// message that was out has come back but retries due later, which their
// marks make their keys await: the timed barrier, which waits for them, is
// let down too.
func (o *orderer) open(all bool) {
	o.mu.Lock()
	o.holding = false
	if all {
		o.barrierUntil = time.Time{} // lift lets down what it held
	}
	o.mu.Unlock()
	o.lift()
}
