package proxy

import (
	"context"

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
		r.takePlace()
		q, ok := r.next()
		if !ok {
			r.givePlace()
			return
		}
		switch r.take(q, ln) {
		case endedDetached:
			return // a new worker has this one's place
		case endedHere:
			r.givePlace()
		}
		// Handed off: its place is its batch entry's until it is settled.
	}
}

// take delivers q, which a worker took, or gives it back once courier is
// stopping, and reports how it left the worker.
func (r *Runner) take(q queued, ln lane) ended {
	meta, merr := q.m.Metadata()
	probe := false
	if r.ph.noStart.Err() == nil && !r.open() {
		r.countHeld(func() { probe = r.waitToSend(r.ph.noStart, merr == nil && meta.NumDelivered == 1) })
	}
	if r.ph.noStart.Err() == nil {
		return r.deliver(q, meta, merr, ln, ln.noStart, probe)
	}
	// Stopping. A message on its last allowed delivery is sent within
	// the grace period rather than given back: a NAK would make
	// JetStream give up on it without the app having seen it.
	if r.open() && lastDelivery(meta, r.o.MaxDeliver) {
		return r.deliver(q, meta, merr, ln, ln.requests, false)
	}
	if merr != nil {
		meta = nil
	}
	r.settle.giveBack(r.settle.make.delivery(q.m, meta, lane{}, nil), afterLastPull, "shutting down")
	return endedHere
}

// next returns the next message for a worker: one its key's line released
// (order.go), else one from the fetch queue; false once the queue is
// closed and nothing released is left.
func (r *Runner) next() (queued, bool) {
	if r.rel == nil {
		q, ok := <-r.queue
		if ok && r.took != nil {
			r.took(q)
		}
		return q, ok
	}
	for {
		if q, ok := r.rel.pop(); ok {
			return q, true
		}
		select {
		case <-r.rel.wake:
		case q, ok := <-r.queue:
			if !ok {
				return r.rel.pop()
			}
			if r.took != nil {
				r.took(q)
			}
			return q, true
		}
	}
}

// waitToSend waits until the gate opens or stop ends. While the breaker
// alone holds deliveries, the message goes as a probe when the breaker picks
// it (fresh: on its first delivery, which it picks first); waitToSend then
// reports true. Any message may be a probe: a failed probe on a message's
// last allowed delivery is held again rather than dead-lettered (attempt),
// so a probe never spends that delivery, and a breaker whose workers all
// hold such messages still probes.
func (r *Runner) waitToSend(stop context.Context, fresh bool) (probe bool) {
	r.probers.Add(1)
	defer r.probers.Add(-1)
	if fresh {
		r.freshProbers.Add(1)
		defer r.freshProbers.Add(-1)
	}
	for {
		t := r.breaker.enlist(fresh)
		select {
		case <-r.gate.Up():
			r.breaker.leave(t)
			return false
		case <-stop.Done():
			r.breaker.leave(t)
			return false
		case <-t.ahead:
			if r.gate.onlyHeld(causeBreaker) {
				return true
			}
			r.breaker.retryProbe()
		}
	}
}

// lastDelivery reports whether a message with metadata meta (nil: none) is
// on its last allowed delivery.
func lastDelivery(meta *jetstream.MsgMetadata, maxDeliver int) bool {
	return meta != nil && int(meta.NumDelivered) >= maxDeliver
}

// open reports whether the gate lets deliveries go.
func (r *Runner) open() bool { return r.gate.open.Load() }

// countHeld runs wait counted among the held messages
// (courier_held_messages).
func (r *Runner) countHeld(wait func()) {
	r.parked.Add(1)
	defer r.parked.Add(-1)
	wait()
}

// heldMessages is what courier holds for the app: messages waiting in
// workers, and, while the gate is closed, those queued behind them.
func (r *Runner) heldMessages() float64 {
	n := r.parked.Load()
	if !r.open() {
		n += int64(r.queued())
	}
	return float64(n)
}

// detach gives d's worker place to a new worker while d, a retry held for
// the breaker's next probe on its last allowed delivery, waits on its own
// goroutine (its worker returns once d is settled). Retries that keep
// failing could otherwise take every worker while the breaker is open, and
// leave no worker to take a fresh message, the probe that tells a healthy
// app: the fetcher pulls for one while no fresh message is held
// (Runner.freshProbers). Requests stay bounded by the in-flight limit (inflight.go).
//
// With batches, the place d held (handoff.go) is given back; d handed off
// to a batch has no worker waiting on it, so none is started.
func (r *Runner) detach(d *delivery) {
	d.detached = true
	r.givePlace()
	if d.handedOff {
		d.log.Debug("held for the next probe apart from the workers: its place is given back")
		return
	}
	r.workers.Add(1)
	go r.worker()
	d.log.Debug("held for the next probe apart from the workers: a new worker takes its place")
}
