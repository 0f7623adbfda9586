package proxy

import (
	"cmp"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/orderkey"
	"github.com/courierhq/courier/ordermark"
)

// Order per key (Options.OrderKey), as README's "Order per key" describes
// it.
//
// The fetcher asks the orderer, for each message with an ordering key as it
// arrives (admit), whether the key is free. If it is, the message becomes the key's
// head and is delivered as any message; if not, it waits in the key's line,
// in stream order, kept in progress by the tracker, spending nothing. When
// the head is settled for good (acked, acked as a duplicate,
// dead-lettered), the next message of its line is let go to the workers
// (letGo). A head that is retried (NAK'd with a delay) stays the key's
// head: JetStream redelivers it, and the line waits for it. Other keys and
// messages without a key go on in parallel. What waits is bounded by
// COURIER_MAX_ACK_PENDING (the server hands out no more) and, in bytes, by
// maxWaitingBytes, beyond which fetching stops (roomToFetch) rather than
// reorder; deliveries go on meanwhile.

// maxWaitingBytes bounds the message data waiting behind busy keys: past
// it, courier fetches nothing until lines move on.
const maxWaitingBytes = 64 << 20

// orderer is the lines of the keys with a message in courier: of the
// durable, or of one partition of it (partition.go). Safe for concurrent
// use.
type orderer struct {
	key orderkey.Key
	now func() time.Time
	log func(full bool) // told when the bound is reached and left
	rel *letGo          // where a settled head's successor goes
	// untrack, when set, stops keeping a message in progress (tracker): a
	// waiting copy replaced by its redelivery. Set once, before use.
	untrack func(jetstream.Msg)
	// lapse, when set, stops keeping a message in progress once it is
	// outdated and unsent (tracker.lapse). Set once, before use.
	lapse func(m jetstream.Msg, lapsed func() bool)
	// rewinds, when set, tells a partition's message that a rewind
	// copies again (copyOf.superseded): no line awaits it. Set once,
	// before use.
	rewinds Rewinds

	mu      sync.Mutex
	lines   map[string]*keyLine
	waiting int           // messages in lines
	bytes   int64         // their size, as the fetch queue counts it
	full    bool          // bytes passed maxWaitingBytes: nothing is fetched
	room    chan struct{} // closed while not full
	// handingOn: the partition is being handed to another courier
	// (handOn); a head retried from now on gives its line back.
	handingOn bool

	// Crash safety (README, "Order per key"): marks, when kept, name each
	// busy key's first unsettled message for a courier that comes after.
	// Until barrierUntil, keyed messages wait (in barrier), and then go in
	// stream order: the messages another courier held when it died come
	// back within the ack wait, in any order, and must go before later
	// ones. stale counts lines whose
	// head came from a mark and is awaited only until its line's stale.
	marks        *marker
	markWait     time.Duration // how long a marked head is awaited (addMarked)
	barrierUntil time.Time
	// holding: keyed messages wait in barrier until open is called
	// (hold: the pull the pin came with, until all it may bring is in).
	holding bool
	barrier []queued
	stale   int
	// floor is the consumer's ack floor as last read (ackFloor): a stale
	// head above it is still out, and awaited longer (lift).
	floor uint64
	// epoch counts the times the pin moved away (unpinned) or this
	// courier's membership lapsed (lease): a message admitted before is
	// not sent.
	epoch uint64
	// lease, when set, is this courier's membership term
	// (Membership.Term); term is the one the lines are in, and lapsed
	// that it ended and the fetcher has yet to give back what the lines
	// hold (ordermarks.go, lapsedNow).
	lease  func() (uint64, bool)
	term   uint64
	lapsed bool
	// blind: at the hand-over, a barrier stood (a start's or a takeover's
	// wait for what another courier held) or a line still awaited what
	// another courier had, so this courier did not know every key's
	// unsettled messages; its hand-over is not clean.
	blind bool
	// givenBack is, for each key whose line was given back whole (drain)
	// while its head was still with a worker, that head and the first
	// message given back behind it (0: none): the mark moves on to it
	// once the head is settled (marks.go, markGivenBack).
	givenBack map[string]givenBack
}

// givenBack is a key's head at drain and the first message given back
// behind it.
type givenBack struct{ head, next uint64 }

// keyLine is one key's head and the later messages waiting behind it.
type keyLine struct {
	head     uint64   // stream sequence of the message that goes first
	inFlight bool     // the head is with a worker; false: retried, awaited from JetStream
	waiting  []queued // each with held, when it began to wait
	marked   bool     // a mark names head (marks)
	// stale, for a head known from a mark only: when to stop awaiting it
	// (it may have been settled before the mark could be removed);
	// extended counts the times it was put off, the head being above the
	// ack floor (lift).
	stale    time.Time
	extended int
	// retained: kept when the pin moved away (unpinned), for the pin may
	// come back before the head is settled by the courier that has it now;
	// let go by the consumer's ack floor, or once stale.
	retained bool
	// here: the head was delivered to this courier since it last became
	// the head, in the lines' epoch: a retry of it comes back here, and
	// is awaited as long as that takes, as in a line not retained.
	here bool
	// next, of a retained line whose head was with a worker: the first
	// message given back behind it, awaited once the head is settled
	// here (the pin may come back, and the key's later messages with it,
	// before that message does).
	next uint64
	// out are the key's later messages another courier had out when the
	// pin came to this one (awaitOut), in stream order: each is awaited
	// in its turn, as the head is.
	out []uint64
	// retried are heads retried here that an earlier message of the key,
	// redelivered, took the place of (enter), in stream order: each is
	// awaited again in its turn, as long as its redelivery takes.
	retried []uint64
	// src is what the head, a partition's message, copies (if src.work
	// is head; a head known otherwise, from a mark, has none): a head a
	// rewind copies again is not awaited (passOver).
	src copyOf
}

func newOrderer(key orderkey.Key, now func() time.Time, rel *letGo, log func(full bool)) *orderer {
	o := &orderer{key: key, now: now, rel: rel, log: log, lines: make(map[string]*keyLine),
		room: make(chan struct{})}
	close(o.room)
	return o
}

// letGo holds the messages their keys' lines let go, for the next free
// worker, from every orderer of the runner. Safe for concurrent use.
type letGo struct {
	mu    sync.Mutex
	ready []queued
	wake  chan struct{} // signalled when there may be one to take
}

func newLetGo() *letGo { return &letGo{wake: make(chan struct{}, 1)} }

func (rl *letGo) push(q queued) {
	rl.mu.Lock()
	rl.ready = append(rl.ready, q)
	rl.mu.Unlock()
	rl.signal()
}

// pop returns a message let go, if any.
func (rl *letGo) pop() (queued, bool) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if len(rl.ready) == 0 {
		return queued{}, false
	}
	q := rl.ready[0]
	rl.ready = slices.Delete(rl.ready, 0, 1)
	if len(rl.ready) > 0 {
		rl.signal() // another worker may take the next
	}
	return q, true
}

// take removes and returns the messages o's lines let go.
func (rl *letGo) take(o *orderer) []queued {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	var out []queued
	rl.ready = slices.DeleteFunc(rl.ready, func(q queued) bool {
		if q.ord == o {
			out = append(out, q)
			return true
		}
		return false
	})
	return out
}

func (rl *letGo) signal() {
	select {
	case rl.wake <- struct{}{}:
	default:
	}
}

// roomToFetch returns a channel closed while the messages waiting behind
// their keys are within their bound.
func (o *orderer) roomToFetch() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.room
}

// admit is called by the fetcher for each message as it arrives, in the
// order JetStream sent them: it reports whether q may be queued for the
// workers (no ordering key, or its key is free), setting q's key; if not,
// q waits in its key's line. (Admitting as messages are taken would let two
// workers taking a key's messages one after the other enter them in either
// order.)
func (o *orderer) admit(q *queued) bool {
	k, ok := o.key(q.m.Subject(), q.m.Headers())
	if !ok {
		return true
	}
	meta, err := q.m.Metadata()
	if err != nil {
		return true // the worker NAKs it
	}
	q.okey, q.seq, q.ord = k, streamSeq(q.m, meta), o
	o.mu.Lock()
	q.epoch = o.epoch
	if o.lapse != nil {
		sending, epoch := new(atomic.Bool), o.epoch
		q.sending = sending
		o.lapse(q.m, func() bool { return !sending.Load() && o.outdated(epoch) })
	}
	if o.holding || !o.barrierUntil.IsZero() {
		// Redeliveries too: what a courier that died held comes back
		// when each message's ack wait runs out, not in stream order;
		// lift lets them in in stream order.
		q.held = o.now()
		o.barrier = append(o.barrier, *q)
		o.mu.Unlock()
		return false
	}
	o.mu.Unlock()
	return o.enter(*q, k, q.seq)
}

// enter reports whether q, of key k at stream sequence seq, may be
// delivered now; if not, it waits in k's line until let go.
func (o *orderer) enter(q queued, k string, seq uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.lines[k]
	src := copyOfMsg(q.m)
	if src.superseded(o.rewinds) {
		if l == nil || seq != l.head {
			// An earlier copy of a message a rewind copies again: its
			// worker acks it unsent, and its key's line neither awaits it
			// nor is held by it.
			return true
		}
	} else if l != nil && seq > l.head && !l.inFlight {
		l = o.passOver(k, l)
	}
	switch {
	case l == nil:
		o.lines[k] = &keyLine{head: seq, inFlight: true, here: true, src: src}
		return true
	case seq == l.head:
		// The head again: redelivered after a retry (or, held too long,
		// after its ack wait).
		l.inFlight, l.here, l.src = true, true, src
		if !l.stale.IsZero() {
			l.stale = time.Time{}
			o.stale--
		}
		return true
	case seq < l.head && !l.inFlight:
		// An earlier message of the key, redelivered before the retried
		// head (after a restart, or an ack lost in a leader change): it
		// goes first; the head is awaited again once it is settled.
		if l.here {
			i, _ := slices.BinarySearch(l.retried, l.head)
			l.retried = slices.Insert(l.retried, i, l.head)
		} else {
			l.out = append([]uint64{l.head}, l.out...)
		}
		l.head, l.inFlight, l.here, l.src = seq, true, true, src
		if !l.stale.IsZero() {
			l.stale = time.Time{}
			o.stale--
		}
		return true
	}
	q.okey, q.seq, q.held, q.ord = k, seq, o.now(), o
	i, _ := slices.BinarySearchFunc(l.waiting, seq, func(w queued, s uint64) int { return cmp.Compare(w.seq, s) })
	if i < len(l.waiting) && l.waiting[i].seq == seq {
		// A redelivery of a message already waiting (its ack wait ran
		// out while courier held it): the later copy replaces it, and
		// the earlier is no longer kept in progress.
		if o.untrack != nil {
			o.untrack(l.waiting[i].m)
		}
		o.bytes -= l.waiting[i].size
		l.waiting[i] = q
		o.bytes += q.size
		return false
	}
	l.waiting = slices.Insert(l.waiting, i, q)
	if o.marks != nil && !l.marked {
		l.marked = true
		o.marks.set(k, ordermark.Mark{Seq: l.head})
	}
	o.waiting++
	o.bytes += q.size
	if !o.full && o.bytes > maxWaitingBytes {
		o.full, o.room = true, make(chan struct{})
		o.log(true)
	}
	return false
}

// settled ends the head seq of key k for good (acked, a duplicate,
// dead-lettered): the next message of its line, if any, is let go. It
// returns how many were waiting behind it.
func (o *orderer) settled(k string, seq uint64) int {
	o.mu.Lock()
	n, freed := o.settle(k, seq)
	o.mu.Unlock()
	if freed {
		o.log(false)
	}
	return n
}

// settle is settled with mu held; freed: the waiting messages are back
// under their bound, to be logged once mu is released.
func (o *orderer) settle(k string, seq uint64) (n int, freed bool) {
	l := o.lines[k]
	if l == nil {
		o.headSettledAfterDrain(k, seq)
		return 0, false
	}
	if l.head != seq {
		return 0, false
	}
	if !l.stale.IsZero() {
		l.stale = time.Time{}
		o.stale--
	}
	n = len(l.waiting)
	if n == 0 && l.retained && l.next != 0 {
		// Its head was with a worker when the pin moved away, and what
		// waited behind it was given back: the first of that is the
		// key's next, awaited as a retried head.
		o.headSettledAfterDrain(k, seq)
		l.head, l.next, l.inFlight, l.here = l.next, 0, false, false
		o.awaitRetained(l, o.now())
		return 0, false
	}
	if l.retried = after(l.retried, seq); len(l.retried) > 0 && (n == 0 || l.retried[0] < l.waiting[0].seq) &&
		(len(l.out) == 0 || l.retried[0] < l.out[0]) {
		// A head retried here, which an earlier message took the place
		// of: awaited again, here.
		l.head, l.inFlight, l.here, l.retried = l.retried[0], false, true, l.retried[1:]
		if o.marks != nil {
			l.marked = true
			o.marks.set(k, ordermark.Mark{Seq: l.head})
		}
		return n, false
	}
	if l.out = after(l.out, seq); len(l.out) > 0 && (n == 0 || l.out[0] < l.waiting[0].seq) {
		// The key's next message is out with another courier: awaited.
		l.head, l.inFlight, l.here, l.out = l.out[0], false, false, l.out[1:]
		o.awaitRetained(l, o.now())
		if o.marks != nil && n > 0 {
			l.marked = true
			o.marks.set(k, ordermark.Mark{Seq: l.head})
		}
		return n, false
	}
	if n == 0 {
		delete(o.lines, k)
		switch {
		case l.retained:
			// What waited behind it was given back: the mark moves on.
			o.headSettledAfterDrain(k, seq)
		case l.marked:
			o.marks.set(k, ordermark.Mark{})
		}
		return 0, false
	}
	next := l.waiting[0]
	l.waiting = slices.Delete(l.waiting, 0, 1)
	l.head, l.inFlight, l.here, l.out, l.src = next.seq, true, true, after(l.out, next.seq), copyOfMsg(next.m)
	switch {
	case o.marks != nil && len(l.waiting) > 0:
		l.marked = true
		o.marks.set(k, ordermark.Mark{Seq: next.seq})
	case l.marked:
		l.marked = false
		o.marks.set(k, ordermark.Mark{})
	}
	next.letGo = true
	o.waiting--
	o.bytes -= next.size
	o.rel.push(next)
	freed = o.full && o.bytes <= maxWaitingBytes/2
	if freed {
		o.full = false
		close(o.room)
	}
	return n, freed
}

// passOver stops awaiting key k's head in its line l while that head is
// an earlier copy of a message a rewind copies again (copyOf.superseded),
// not with a worker (retried): the rewind's copy comes behind it and
// delivers it, so the line goes on as if it were settled; when it comes
// back, its worker acks it unsent, and it passes the line by (enter). It
// returns k's line afterwards (nil: none). Called with mu held.
func (o *orderer) passOver(k string, l *keyLine) *keyLine {
	for l != nil && !l.inFlight && l.src.work == l.head && l.src.superseded(o.rewinds) {
		if _, freed := o.settle(k, l.head); freed {
			o.log(false)
		}
		l = o.lines[k]
	}
	return l
}

// retrying notes that the head seq of key k was NAK'd for a retry in
// delay: its line waits for JetStream to redeliver it. While the partition
// is handed on, the redelivery goes to the next courier: the line's waiting
// messages are returned, to be given back, and the line forgotten (its
// mark stays).
func (o *orderer) retrying(k string, seq uint64, delay time.Duration) (giveBack []jetstream.Msg) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.lines[k]
	if l == nil {
		o.headRetriedAfterDrain(k, seq, delay)
		return nil
	}
	if l.head != seq {
		return nil
	}
	l.inFlight = false
	if o.marks != nil {
		l.marked = true
		o.marks.set(k, ordermark.Mark{Seq: seq, Due: o.now().Add(delay)})
	}
	if l.retained && !l.here {
		// Retried after the pin moved away: its redelivery goes to the
		// courier pinned now, and may be settled there.
		delete(o.givenBack, k)
		o.awaitRetained(l, o.now().Add(delay))
	}
	if o.handingOn {
		for _, q := range o.forget(k, l) {
			giveBack = append(giveBack, q.m)
		}
	}
	return giveBack
}

// headSettledAfterDrain moves key k's mark on when seq, its head given up
// by drain while with a worker, is settled: to the first message given
// back behind it, or away. Called with mu held.
func (o *orderer) headSettledAfterDrain(k string, seq uint64) {
	g, ok := o.givenBack[k]
	if !ok || g.head != seq {
		return
	}
	delete(o.givenBack, k)
	o.marks.set(k, ordermark.Mark{Seq: g.next}) // Seq 0: unmark
}

// headRetriedAfterDrain notes in key k's mark when seq, its head given up
// by drain while with a worker, is due again. Called with mu held.
func (o *orderer) headRetriedAfterDrain(k string, seq uint64, delay time.Duration) {
	g, ok := o.givenBack[k]
	if !ok || g.head != seq {
		return
	}
	delete(o.givenBack, k)
	o.marks.set(k, ordermark.Mark{Seq: seq, Due: o.now().Add(delay)})
}

// handOn readies the lines for the partition's hand-over to another
// courier (partition.go): fetching has stopped, so a retried head will not
// come back here. It returns, in stream order, what cannot be finished
// here, to be given back: the messages held at the barrier and those behind
// a head that is not in flight; their lines are forgotten (their marks
// stay, for the next courier). Lines whose head is in flight go on: their
// messages are delivered as each head is settled, unless one is retried
// (retrying).
func (o *orderer) handOn() []queued {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.handingOn = true
	o.blind = o.holding || !o.barrierUntil.IsZero() || o.awaitsElsewhere()
	out := o.barrier
	o.barrier, o.barrierUntil, o.holding = nil, time.Time{}, false
	o.markGivenBack(out) // keys with a line keep their line's mark
	for k, l := range o.lines {
		if !l.inFlight {
			out = append(out, o.forget(k, l)...)
		}
	}
	slices.SortFunc(out, func(a, b queued) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

// forget drops key k's line l and returns the messages that waited in it.
// Called with mu held.
func (o *orderer) forget(k string, l *keyLine) []queued {
	delete(o.lines, k)
	if !l.stale.IsZero() {
		o.stale--
	}
	o.waiting -= len(l.waiting)
	for _, w := range l.waiting {
		o.bytes -= w.size
	}
	if o.full && o.bytes <= maxWaitingBytes/2 {
		o.full = false
		close(o.room)
		o.log(false)
	}
	return l.waiting
}

// awaitsElsewhere reports whether a line awaits a message another courier
// had (awaitOut, unpinned): the marks name only each key's first. Called
// with mu held.
func (o *orderer) awaitsElsewhere() bool {
	for _, l := range o.lines {
		if len(l.out) > 0 || len(l.retried) > 0 || l.retained && !l.inFlight && !l.here {
			return true
		}
	}
	return false
}

// isBlind reports whether a wait for what another courier held stood when
// the lines were handed on or drained.
func (o *orderer) isBlind() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.blind
}

// waitingBehind is how many messages wait in key k's line.
func (o *orderer) waitingBehind(k string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	if l := o.lines[k]; l != nil {
		return len(l.waiting)
	}
	return 0
}

// drain returns every message still waiting or let go, in stream order,
// and forgets them: at shutdown they are given back in that order, so that
// JetStream redelivers them in it.
func (o *orderer) drain() []queued {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.blind = o.blind || o.holding || !o.barrierUntil.IsZero() || o.awaitsElsewhere()
	out := append(o.rel.take(o), o.barrier...)
	o.barrier, o.holding = nil, false
	o.markDrained()
	o.markGivenBack(out)
	for _, l := range o.lines {
		out = append(out, l.waiting...)
	}
	o.lines, o.waiting, o.bytes, o.stale = make(map[string]*keyLine), 0, 0, 0
	if o.full {
		o.full = false
		close(o.room)
	}
	slices.SortFunc(out, func(a, b queued) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

// unpinned forgets every line when the pin of the durable's priority group
// moved away from this courier, and returns, in stream order, the messages
// waiting behind their keys, to be given back. A message admitted before,
// queued or with a worker, is given back by its worker (outdated).
//
// What this courier knows stays: each key's head, which was not settled,
// is kept as the key's awaited head (retained). If the pin comes back
// before the courier that has it now settles the head, the key's later
// messages, which may come back first, wait for it (the consumer's ack
// floor, read when the pin comes back, lets go of those settled
// meanwhile; the others once stale).
func (o *orderer) unpinned() []queued {
	o.mu.Lock()
	o.epoch++
	heads := make(map[string]keyLine, len(o.lines))
	for k, l := range o.lines {
		h := keyLine{head: l.head, inFlight: l.inFlight, marked: l.marked}
		if l.inFlight && len(l.waiting) > 0 {
			h.next = l.waiting[0].seq
		}
		heads[k] = h
	}
	o.mu.Unlock()
	out := o.drain()
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, h := range heads {
		l := &keyLine{head: h.head, inFlight: h.inFlight, marked: h.marked, next: h.next, retained: true}
		o.lines[k] = l
		if !l.inFlight {
			o.awaitRetained(l, o.now())
		}
	}
	// A head released to the workers and not yet taken was given back
	// with the rest: it is awaited as a retried one.
	for _, q := range out {
		if l := o.lines[q.okey]; l != nil && l.inFlight && l.head == q.seq {
			l.inFlight = false
			o.awaitRetained(l, o.now())
		}
	}
	return out
}

// awaitRetained awaits the retained line l's head, not with a worker (due:
// when it is due back), until markWait after it is due. Called with mu
// held.
func (o *orderer) awaitRetained(l *keyLine, due time.Time) {
	if l.stale.IsZero() {
		o.stale++
	}
	l.stale, l.extended = later(o.now(), due).Add(o.markWait), 0
}

// gaveBack is told that seq, key k's head, admitted before the pin moved
// away (outdated), was given back by its worker: its retained line awaits
// it as a retried head.
func (o *orderer) gaveBack(k string, seq uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if l := o.lines[k]; l != nil && l.retained && l.inFlight && l.head == seq {
		l.inFlight = false
		o.awaitRetained(l, o.now())
	}
}

// outdated reports whether a message admitted in epoch was admitted before
// the pin last moved away from this courier, or this courier's membership
// has lapsed since: it must not be sent.
func (o *orderer) outdated(epoch uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.leaseHeld() || epoch != o.epoch
}

// stats is what the metrics show: keys with messages waiting, the messages
// waiting, and the longest wait.
func (o *orderer) stats() (keys, msgs int, longest time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	for _, l := range o.lines {
		if len(l.waiting) == 0 {
			continue
		}
		keys++
		for _, w := range l.waiting {
			longest = max(longest, now.Sub(w.held))
		}
	}
	for _, q := range o.barrier {
		longest = max(longest, now.Sub(q.held))
	}
	return keys, o.waiting + len(o.barrier), longest
}

// orderFull returns what logs when the messages waiting behind their keys
// reach their bound, and when they are back under it.
func orderFull(log *slog.Logger) func(full bool) {
	return func(full bool) {
		if full {
			log.Warn("messages waiting behind their keys passed 64 MiB: fetching nothing until their keys move on")
		} else {
			log.Info("messages waiting behind their keys back under the bound: fetching again")
		}
	}
}
