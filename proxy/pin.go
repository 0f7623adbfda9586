package proxy

import (
	"context"
	"errors"
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
// left them, and if the consumer has more messages out than this pull
// asked for, another courier may hold some of them: order per key waits
// for them as after a restart (orderer.takeover).
func (f *fetcher) checkPin(ctx context.Context, m jetstream.Msg, asked int) {
	p := m.Headers().Get("Nats-Pin-Id")
	if p == "" || p == f.pin {
		return
	}
	f.pin = p
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	f.order.reload(ictx)
	info, err := f.cons.Info(ictx)
	if err == nil && info.NumAckPending <= asked {
		return
	}
	f.log.Info("pinned to this courier: keyed messages wait for what another courier may still hold",
		"for", orderBarrier(f.ackWaitNow()).String())
	f.order.takeover(orderBarrier(f.ackWaitNow()))
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
	if f.connected != nil && !f.connected() {
		return
	}
	batch, err := f.cons.Fetch(1, jetstream.FetchMaxBytes(1), jetstream.FetchMaxWait(100*time.Millisecond),
		jetstream.FetchPriorityGroup(f.group))
	if err != nil {
		return
	}
	defer func() { f.checkUnpinned(batch.Error()) }()
	for m := range batch.Messages() {
		// Not expected (no message is one byte), but never dropped.
		f.track.add(m)
		q := queued{m: m, size: queueSize(m)}
		if f.order != nil && !f.order.admit(&q) {
			continue
		}
		f.bytes.Add(q.size)
		select {
		case f.queue <- q:
		case <-ctx.Done():
			f.track.remove(m)
			_ = m.Nak()
			return
		}
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
	f.pin = ""
	held := f.order.unpinned()
	f.log.Info("the durable's pin moved to another courier: keyed messages held here are given back to it", "held", len(held))
	for _, q := range held {
		f.release(q.m, "the durable's pin moved while it waited behind its key")
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
