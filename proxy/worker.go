package proxy

import (
	"github.com/nats-io/nats.go/jetstream"
)

// A worker parses a message's metadata once, when it takes the message, and
// hands it on: jetstream.Msg.Metadata parses the reply subject anew at every
// call.

// worker delivers queued messages until the fetcher closes the queue. While
// the gate is closed it holds the message it took (the tracker keeps it in
// progress) and waits; once courier is stopping it gives messages back
// instead of starting them.
func (r *Runner) worker() {
	defer r.workers.Done()
	ln, stop := r.ph.lane()
	defer stop()
	ln.timer = newRequestTimer(ln.requests, r.o.HTTPTimeout)
	if r.batcher != nil {
		ln.batchDone = make(chan batchResult, 1)
	}
	defer ln.timer.close()
	for {
		r.batcher.takePlace()
		q, ok := r.src.next()
		if !ok {
			r.batcher.givePlace()
			return
		}
		switch r.take(q, ln) {
		case endedDetached:
			return // a new worker has this one's place
		case endedHere:
			r.batcher.givePlace()
		}
		// Handed off: its place is its batch entry's until it is settled.
	}
}

// take delivers q, which a worker took, or gives it back once courier is
// stopping, and reports how it left the worker.
func (r *Runner) take(q queued, ln lane) ended {
	meta, merr := q.m.Metadata()
	probe := false
	if r.ph.noStart.Err() == nil && !r.hold.open() {
		probe = r.hold.hold(r.ph.noStart, merr == nil && meta.NumDelivered == 1)
	}
	if r.ph.noStart.Err() == nil {
		return r.deliver(q, meta, merr, ln, ln.noStart, probe)
	}
	// Stopping. A message on its last allowed delivery is sent within
	// the grace period rather than given back: a NAK would make
	// JetStream give up on it without the app having seen it.
	if r.hold.open() && lastDelivery(meta, r.o.MaxDeliver) {
		return r.deliver(q, meta, merr, ln, ln.requests, false)
	}
	if merr != nil {
		meta = nil
	}
	r.settle.end(r.settle.make.delivery(q.m, meta, lane{}, nil), giveBackEnding(afterLastPull, "shutting down"))
	return endedHere
}

// lastDelivery reports whether a message with metadata meta (nil: none) is
// on its last allowed delivery.
func lastDelivery(meta *jetstream.MsgMetadata, maxDeliver int) bool {
	return meta != nil && int(meta.NumDelivered) >= maxDeliver
}

// heldMessages is what courier holds for the app: messages waiting in
// workers, and, while the gate is closed, those queued behind them.
func (r *Runner) heldMessages() float64 {
	n := r.hold.parked.Load()
	if !r.hold.open() {
		n += int64(r.src.queued())
	}
	return float64(n)
}

// detach gives d's worker place to a new worker while d, a retry held for
// the breaker's next probe on its last allowed delivery, waits on its own
// goroutine (its worker returns once d is settled). Retries that keep
// failing could otherwise take every worker while the breaker is open, and
// leave no worker to take a fresh message, the probe that tells a healthy
// app: the fetcher pulls for one while no fresh message is held
// (holder.noProbe). Requests stay bounded by the in-flight limit (inflight.go).
//
// With batches, the place d held (handoff.go) is given back; d handed off
// to a batch has no worker waiting on it, so none is started.
func (r *Runner) detach(d *delivery) {
	d.detached = true
	r.batcher.givePlace()
	if d.handedOff {
		d.log.Debug("held for the next probe apart from the workers: its place is given back")
		return
	}
	r.workers.Add(1)
	go r.worker()
	d.log.Debug("held for the next probe apart from the workers: a new worker takes its place")
}
