package proxy

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The pin of a priority group (Options.PriorityGroup, with order per key):
// one courier at a time receives the durable's messages. The fetcher keeps
// its pin while it fetches nothing, and notices when the pin has just come
// to it.

// checkPin notes the pin id m carries: when it is new, the pin of the
// priority group has just moved to this courier (its start, or another
// replica gone quiet): it reads the marks as the courier that had the pin
// left them (tookOver: the pin handed on clean, or nothing else out, and
// nothing more is awaited). If messages are out, the keys of what is out
// wait for it (waitForOut: read from the stream). Without the stream to
// read them from, if the consumer has more messages out than this pull
// asked for, another courier may hold some of them: every keyed message
// waits as after a restart (orderer.takeover); if not, this pull may bring
// them all back, in the order each fell due: keyed messages wait until as
// many as were out have arrived, and then go in stream order (endHold).
//
// What is out is counted from the consumer's info, read now (its ack
// pending), less what this courier holds itself (a pin given anew when
// the durable's leader moved finds it with requests in flight), but for
// what lapsed here when the pin moved away (tracker.lapsedOf: JetStream
// may have delivered it to the courier that had the pin since, and a
// key's later message must not go before that delivery), and the
// retries its marks name as due after this pull has ended (each its key's
// awaited head, come back later). A message of this pull the consumer
// delivered new after the info was read (a stream sequence past the last
// it had delivered) was not out, and is not counted.
func (f *fetcher) checkPin(ctx context.Context, m jetstream.Msg, asked int) {
	p := m.Headers().Get("Nats-Pin-Id")
	if p == "" || p == f.pin {
		return
	}
	first := f.pin == ""
	f.pin = p
	f.pinNow.Store(&p)
	// The pull runs to its end after fetching stops; so does this.
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	marks := f.order.reload(ictx)
	info, err := f.cons.Info(ictx)
	if f.tookOver(ictx, info, err, first && asked == 1) {
		return
	}
	own := f.track.held() - f.track.lapsedOf(nil) - 1 // m is tracked already, and out
	if f.part != nil {
		own = int(f.part.heldNow()) - f.track.lapsedOf(f.part.heldCount()) - 1 // of this partition only
	}
	out := info.NumAckPending - own - dueAfter(marks, info.AckFloor.Stream, f.now().Add(fetchWait))
	if out <= 1 {
		f.order.open(true) // nothing but m is out
		return
	}
	if out > asked || f.handover.Stream != nil {
		f.waitForOut(ctx, info.AckFloor.Stream, info.Delivered.Stream, out)
		return
	}
	f.holdFor, f.holdFloor, f.holdUpTo, f.arrivals = out, info.AckFloor.Stream, info.Delivered.Stream, 0
	f.order.hold()
}

// endHold ends the wait checkPin began, once as many messages as the
// consumer had out have arrived, or at the end of the pull. If they all
// have, the wait of a start (source.startOrder) is over too: what it
// waits for is here. If the pull ended short of them, the rest are
// elsewhere: held by another courier, or retried with a delay not yet run
// out, or not due back from a courier that died until their ack wait runs
// out; the keys of what was out wait for it (waitForOut).
func (f *fetcher) endHold(ctx context.Context) {
	if f.holdFor == 0 {
		return
	}
	all := f.arrivals >= f.holdFor
	if !all {
		f.waitForOut(ctx, f.holdFloor, f.holdUpTo, f.holdFor-f.arrivals)
	}
	f.holdFor, f.arrivals = 0, 0
	f.order.open(all)
}

// stillPinned reports whether the pin of the fetcher's priority group is
// still the one it last saw.
func (f *fetcher) stillPinned(ctx context.Context) bool {
	p := f.pinNow.Load()
	if p == nil {
		return false
	}
	info, err := f.cons.Info(ctx)
	if err != nil {
		return false
	}
	for _, g := range info.PriorityGroups {
		if g.Group == f.group {
			return g.PinnedClientID == *p
		}
	}
	return false
}

// holdPin keeps the pin of a partition whose fetching has stopped, with
// pulls no message fits in, until done reports true (nothing of the
// partition is held) or ctx ends. A message such a pull brings anyway is
// given to giveBack.
func (f *fetcher) holdPin(ctx context.Context, done func() bool, giveBack func(jetstream.Msg)) {
	check := time.NewTicker(20 * time.Millisecond)
	defer check.Stop()
	pull := time.NewTicker(fetchWait)
	defer pull.Stop()
	for !done() {
		select {
		case <-ctx.Done():
			return
		case <-check.C:
		case <-pull.C:
			f.log.Debug("holding the pin until what is held of the partition is settled", "held", f.part.heldNow())
			f.pinPull(giveBack)
		}
	}
}

// ackWaitNow is the consumer's ack wait as last read.
func (f *fetcher) ackWaitNow() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ackWait
}

// keepPin keeps this courier pinned (the priority group's PinnedTTL) while
// deliveries are held and nothing is fetched: a pull no message fits in
// (one byte) counts as the pinned client pulling, and delivers nothing. A
// pinned courier that held messages through an app outage and lost the pin
// would deliver them beside the replica that took it, out of order.
func (f *fetcher) keepPin(ctx context.Context) {
	f.pinPull(func(m jetstream.Msg) {
		// Not expected (no message is one byte), but never dropped.
		f.track.add(m)
		q := queued{m: m, size: queueSize(m)}
		if f.order != nil && !f.order.admit(&q) {
			return
		}
		f.bytes.Add(q.size)
		select {
		case f.queue <- q:
		case <-ctx.Done():
			f.track.remove(m)
			_ = m.Nak()
		}
	})
}

// pinPull sends one pull no message fits in (one byte), which counts as
// the pinned client pulling, and hands what it brings anyway to got. Not
// once this courier's membership lapsed: its pin is to go.
func (f *fetcher) pinPull(got func(jetstream.Msg)) {
	if f.connected != nil && !f.connected() || f.order != nil && f.order.lapsedNow() {
		return
	}
	batch, err := f.cons.Fetch(1, jetstream.FetchMaxBytes(1), jetstream.FetchMaxWait(100*time.Millisecond),
		jetstream.FetchPriorityGroup(f.group))
	if err != nil {
		return
	}
	defer func() { f.checkUnpinned(batch.Error()) }()
	for m := range batch.Messages() {
		if f.wrap != nil {
			m = f.wrap(m)
		}
		got(m)
	}
}

// checkUnpinned is told how a pull ended: refused the pin id this courier
// had, the pin has moved (another courier took it after this one went
// quiet, or the consumer's new leader gives it anew) and the courier now
// pinned receives the durable's messages. What this courier holds behind
// keys is given back, in stream order, for that courier to send in it,
// and what it admitted but has not sent is given back by the workers
// (orderer.unpinned); its in-flight requests finish.
func (f *fetcher) checkUnpinned(err error) {
	if f.order == nil || f.pin == "" || !errors.Is(err, jetstream.ErrPinIDMismatch) {
		return
	}
	f.lostPin("the durable's pin moved to another courier: keyed messages held here are given back to it")
}

// lostPin forgets the pin, and gives back what the lines hold (why says
// why, for the log).
func (f *fetcher) lostPin(why string) {
	f.pin = ""
	f.pinNow.Store(nil)
	held := f.order.unpinned()
	f.log.Info(why, "held", len(held))
	for _, q := range held {
		f.giveBack(q.m, "the durable's pin moved while it waited behind its key")
	}
}

// waitPinned waits until ready yields or ctx ends, keeping the pin
// meanwhile (keepPin) when pulls name a priority group.
func (f *fetcher) waitPinned(ctx context.Context, ready <-chan struct{}) error {
	var tick <-chan time.Time
	if f.group != "" {
		t := time.NewTicker(fetchWait)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ready:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			f.keepPin(ctx)
		}
	}
}

// pinnedPartition is the partition a fetcher pulls for (partition.go's
// session): what the runner holds of it, and the count its messages carry
// (sourcedMsg.held).
type pinnedPartition interface {
	heldNow() int64
	heldCount() *atomic.Int64
}
