package proxy

import (
	"errors"
	"net/http"
)

// Handing deliveries to batches (Options.BatchMax > 1). A worker that would
// wait for its entry's part of a batch's answer hands the delivery to the
// batch instead and takes the next message; the batch's goroutine settles
// the entry by its part of the answer as the worker would have. So a few
// workers (MaxInflight) fill the batches, rather than one waiting worker per
// entry in flight.
//
// Places bound what is held: MaxInflight×BatchMax of them, each a message a
// worker holds or an entry handed off and not yet settled, as many as the
// workers that waited on their entries. A worker takes a place before it
// takes a message; an entry handed off keeps it until it is settled (or
// detached, proxy.go). Places bound the messages held, not requests: the
// one in-flight limit bounds those (inflight.go), so an automatic limit
// changes one number.
//
// The batch's goroutine settles at once what settles without waiting: a 2xx
// handed to the recorder (no success record to store), a retry NAK'd (no
// claim in a shared store to release). Anything else (a dead letter, a
// success record, a message held while the app is unavailable or for the
// breaker's probe, sent again) goes on on a goroutine of its own, through
// sendUntilSettled, as on a worker. A delivery is handed off only while the
// gate is open and it is not the breaker's probe, which goes on its worker,
// waiting for its part (batcher.submit).

// takePlace waits for a free place. Without batches (b is nil) it
// returns at once.
func (b *batcher) takePlace() {
	if b != nil {
		b.places <- struct{}{}
	}
}

// givePlace frees a place taken by takePlace.
func (b *batcher) givePlace() {
	if b != nil {
		<-b.places
	}
}

// handOff hands d, sent with the entry headers h and content type ct, to
// the next batch if it may go now without waiting (see above), and reports
// whether it did. Run waits for it as for a worker, until it is settled.
// ready is d's checks, made when its batch is about to be written.
func (b *batcher) handOff(d *delivery, h http.Header, ct string, span *attemptSpan, ready func() error) bool {
	if d.probe || !b.hold.open() || b.ph.requests.Err() != nil {
		return false
	}
	d.handedOff = true
	b.workers.Add(1) // a worker holds its own count: the count is above zero
	e := &batchEntry{d: d, h: h, ct: ct, span: span, ready: ready}
	b.add(e)
	return true
}

// answer gives e its part of its batch's answer: to its worker, waiting, or
// if it was handed off, settles it.
func (dc *decider) answer(e *batchEntry, res result) {
	if e.done != nil {
		e.done <- res
		return
	}
	d, h, ct, span := e.d, e.h, e.ct, e.span
	var a answered
	if errors.Is(res.err, errRefused) {
		// Its checks refused it when its batch was about to go: held or
		// ended unsent, on a goroutine of its own.
		a = answered{end: takeRefused(d), err: res.err}
	} else {
		a = answered{end: dc.decide(d, res), err: res.err}
		if a.end.kind == endSucceeded && dc.o.Success == nil || a.end.kind == endRetry && !d.claimed {
			span.setOutcome(a.end.kind.String())
			dc.settle.end(d, a.end)
			span.end(res.err)
			if a.end.kind != endSucceeded {
				dc.settle.unclaim(d)
			}
			dc.handedOffSettled(d)
			return
		}
	}
	// Its own channel from now on, should it be sent again: its worker's
	// is the worker's.
	d.batchDone = nil
	go func() {
		dc.sendUntilSettled(d, h, ct, span, &a)
		dc.handedOffSettled(d)
	}()
}

// handedOffSettled ends a delivery handed off, once settled: as its worker
// would have (probeDone), and its place given back unless detached gave it.
func (dc *decider) handedOffSettled(d *delivery) {
	dc.probeDone(d)
	if !d.detached {
		dc.batcher.givePlace()
	}
	dc.workers.Done()
}
