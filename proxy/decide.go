// The decision: one delivery from a worker taking it to its ending. deliver
// checks what ends a delivery before it is sent (a reference dead letter's
// original, its max age, the dedup check: checkkey.go), attempt sends it by
// its way (alone, or in a batch: batcher.go, handoff.go), decide says what
// an answer makes of it and endingOf what comes of that: an ending the
// settler carries out (settle.go), or a hold (hold.go) and another attempt.

package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/dlq"
)

// deliver runs one delivery of q's message, whose metadata m.Metadata
// returned as meta and err, to its end: ack, NAK with delay, dead letter, or
// give back at shutdown; or hands it to a batch, which settles it. wait is
// one of ln's contexts. It reports how the delivery left its worker.
func (r *Runner) deliver(q queued, meta *jetstream.MsgMetadata, err error, ln lane, wait context.Context, probe bool) (how ended) {
	m := q.m
	if err != nil {
		meta = nil // a delivery without metadata is only given back
	}
	d := r.settle.make.delivery(m, meta, ln, wait)
	if err != nil {
		r.log.Error("message without JetStream metadata; NAK'd", "subject", m.Subject(), "error", err)
		r.settle.end(d, giveBackEnding(nakNow, "no metadata"))
		return
	}
	d.probe, d.arrived, d.okey, d.oepoch, d.oseq = probe, q.at, q.okey, q.epoch, q.seq
	if q.ord != nil { // a nil *orderer is not a nil keyLines
		d.ord = q.ord
	}
	// Not only a delivery that starts as the probe: one held again (holdAgain)
	// may become it. A probe that reached no app (a duplicate, an expired
	// message) spent no request: the next candidate goes at once. A
	// delivery handed to a batch is no longer the worker's to look at.
	defer func() {
		if how == endedHandedOff {
			return
		}
		r.probeDone(d)
		if d.detached {
			how = endedDetached
		}
	}()
	if e := r.unsent(d); e.kind != endNone {
		r.settle.end(d, e)
		return
	}
	if r.attempt(d) {
		how = endedHandedOff
	}
	return
}

// unsent returns d's ending if it ends before it is sent: the original of a
// stored reference dead letter, a message over its max age, a duplicate, or
// one given back while its key was checked. No ending: d goes to the app.
func (r *Runner) unsent(d *delivery) ending {
	if r.settle.refs.referenced(d) {
		return ending{kind: endReferenced}
	}
	if f, expired := r.expired(d); expired {
		return deadLetterEnding(f)
	}
	if r.check != nil {
		return r.check.check(d)
	}
	return ending{}
}

// probeDone ends d's turn as the breaker's probe if it reached no app.
func (r *Runner) probeDone(d *delivery) {
	if d.probe && !d.answered {
		r.breaker.handOn()
	}
}

// expired reports a message older than MaxAge, as a dead letter's failure.
func (r *Runner) expired(d *delivery) (failure, bool) {
	if r.o.MaxAge <= 0 {
		return failure{}, false
	}
	age := r.o.Now().Sub(d.meta.Timestamp)
	if age <= r.o.MaxAge {
		return failure{}, false
	}
	return failure{reason: dlq.ReasonExpired,
		err: fmt.Errorf("message is %s old, over COURIER_MAX_AGE %s", age.Round(time.Millisecond), r.o.MaxAge)}, true
}

// way is how deliveries go to the app: each alone (alone), or as entries
// of batches (batcher.go). Safe for concurrent use.
type way interface {
	// headers returns the headers d is sent with, its content type (for
	// a batch's entry), and those of its own that were dropped.
	headers(d *delivery) (http.Header, string, []apphttp.DroppedHeader)
	// handOff hands d, to be sent with h and ct, to whatever settles it
	// without its worker waiting, if it may (handoff.go), and reports
	// whether it did.
	handOff(d *delivery, h http.Header, ct string, span *attemptSpan) bool
	// send sends d and returns the answer to it.
	send(d *delivery, h http.Header, ct string, span *attemptSpan) (*apphttp.Answer, time.Duration, error)
}

// alone sends each delivery in a request of its own.
type alone struct {
	s    *sender
	keep int64 // what is kept of a 2xx answer's body: with success records, all
}

// headers are BuildHeaders'.
func (a alone) headers(d *delivery) (http.Header, string, []apphttp.DroppedHeader) {
	h, dropped := BuildHeaders(d.m, d.meta, d.key)
	return h, "", dropped
}

// handOff hands off nothing: d's worker waits for its answer.
func (alone) handOff(*delivery, http.Header, string, *attemptSpan) bool { return false }

// send posts d within its worker's lane (d.requests, d.timer).
func (a alone) send(d *delivery, h http.Header, _ string, _ *attemptSpan) (*apphttp.Answer, time.Duration, error) {
	return a.s.post(d.requests, request{
		to: a.s.targetOf(d.m.Subject()), reason: reasonOf(d), keep: a.keep, h: h, body: d.m.Data(), timer: d.timer,
	})
}

// attempt sends the message to the app and settles it by the answer
// (sendUntilSettled), or hands it to the next batch, which settles it
// (way.handOff); it reports whether it did the latter.
func (r *Runner) attempt(d *delivery) (handedOff bool) {
	h, ct, dropped := r.way.headers(d)
	for _, dh := range dropped {
		r.m.dropped.Inc()
		d.log.Warn("header not passed to the app", "header", dh.Name, "reason", dh.Reason)
	}
	span := r.trace.start(d, h)
	if r.way.handOff(d, h, ct, span) {
		return true
	}
	r.sendUntilSettled(d, h, ct, span, nil)
	return false
}

// answered is what decide made of an answer (res) to d's request.
type answered struct {
	out outcome
	res batchResult
}

// sendUntilSettled sends d and settles it by the answer: decide says what
// the answer makes of the delivery, endingOf what comes of it, and the settler
// ends it (settler.end). An attempt that spent nothing (the app
// unreachable, a failed probe on the last allowed delivery) holds the
// message and sends it again. After a 2xx with dedup on, recording the key
// and the ack are handed to the recorder, so the worker takes the next
// message while the key commits. first, if not nil, is the answer to a
// request sent already (handoff.go).
func (r *Runner) sendUntilSettled(d *delivery, h http.Header, ct string, span *attemptSpan, first *answered) {
	var lastErr error
	delivered := false
	var end ending
	for end.kind == endNone {
		var a answered
		if first != nil {
			a, first = *first, nil
		} else {
			if end = r.mayStart(d, span); end.kind != endNone {
				break
			}
			span.request()
			answer, took, err := r.way.send(d, h, ct, span)
			a = answered{out: r.decide(d, err, took), res: batchResult{answer: answer, took: took, err: err}}
		}
		lastErr = a.res.err
		delivered = a.out == outDelivered
		end = r.endingOf(d, span, a.out, a.res.err, a.res.answer, a.res.took)
	}
	r.settle.end(d, end)
	span.end(lastErr)
	if !delivered {
		// After any ending but a 2xx's (whose key the recorder records),
		// the key's next delivery goes ahead.
		r.settle.unclaim(d)
	}
}

// mayStart returns no ending if d may be sent now: the gate is open, d is
// the breaker's probe, or courier is stopping (d then goes out as its
// worker decided). Otherwise (the gate closed while d waited for its key or
// the store, or d was the probe and handed that on) d is held until it
// may; it returns d's ending if it ends meanwhile, or is given back because
// the pin of the durable moved away since d's key admitted it
// (orderer.unpinned).
func (r *Runner) mayStart(d *delivery, span *attemptSpan) ending {
	for !d.probe && !r.hold.open() && r.ph.fetched.Err() == nil {
		if end := r.holdAgain(d, span, "deliveries were held"); end.kind != endNone {
			return end
		}
	}
	if d.okey != "" && d.ord != nil && d.ord.outdated(d.oepoch) {
		return giveBackEnding(pinMoved, "the durable's pin moved to another courier") // which sends it in its key's order
	}
	return ending{}
}

// outcome is what one attempt makes of a delivery.
type outcome int

const (
	outDelivered   outcome = iota // a 2xx: success record, key, ack
	outRetry                      // a transient failure: NAK with a delay
	outExhausted                  // a transient failure on the last allowed delivery: dead letter
	outRejected                   // a permanent failure: dead letter
	outUnavailable                // the app unreachable: held until it answers, then sent again
	outProbeHeld                  // a probe failed on the last allowed delivery: held for the next probe
	outNotSent                    // the grace period ended while it waited for the rate limit
	outAbandoned                  // the grace period ended during the request
)

// decide classifies the result of one request (Classify, the one place an
// answer is judged), tells the breaker, and says what it makes of d.
func (r *Runner) decide(d *delivery, err error, took time.Duration) outcome {
	if errors.Is(err, errNotSent) {
		return outNotSent
	}
	if err != nil && r.ph.requests.Err() != nil {
		return outAbandoned
	}
	r.m.request(resultLabel(err), took.Seconds())
	class := classify(err, r.o.Retryable)
	d.answered = class != apphttp.Unavailable
	switch class {
	case apphttp.Success:
		r.breaker.success()
		return outDelivered
	case apphttp.Unavailable:
		return outUnavailable
	case apphttp.Transient:
		fromApp, _ := apphttp.RetryAfter(retryAfterOf(err), r.o.Now(), r.o.RetryAfterMax)
		if se := (*splitError)(nil); errors.As(err, &se) {
			// A batch refused whole is no sign of an outage: the app
			// answered, as for a message rejected.
			r.breaker.success()
		} else {
			r.breaker.failure(d.skey, d.attempt == 1, fromApp, d.probe)
		}
		switch {
		case d.last(r.o.MaxDeliver) && d.probe:
			// A probe never spends a message's last allowed delivery.
			return outProbeHeld
		case d.last(r.o.MaxDeliver):
			return outExhausted
		}
		return outRetry
	}
	r.breaker.success()
	return outRejected
}

// endingOf says what comes of what decide said: d's ending, or none to send
// d again.
func (r *Runner) endingOf(d *delivery, span *attemptSpan, out outcome, err error, answer *apphttp.Answer, took time.Duration) ending {
	switch out {
	case outDelivered:
		span.setOutcome("delivered")
		if r.o.Success != nil && answer != nil {
			// The success record keeps the attempt span's context.
			answer.Header = r.trace.inject(span, answer.Header)
		}
		return ending{kind: endSucceeded, answer: answer, took: took}
	case outRetry:
		span.setOutcome("retried")
		return ending{kind: endRetry, err: err}
	case outExhausted:
		span.setOutcome("dead_lettered")
		return deadLetterEnding(failure{reason: dlq.ReasonExhausted, err: err})
	case outRejected:
		span.setOutcome("dead_lettered")
		return deadLetterEnding(failure{reason: dlq.ReasonRejected, err: err})
	case outUnavailable:
		return r.heldForApp(d, span, err)
	case outProbeHeld:
		d.log.Debug("probe failed on the message's last allowed delivery; held for the next probe",
			statusAttr(err), "error", err.Error())
		if d.attempt > 1 && !d.detached && r.ph.fetched.Err() == nil {
			r.detach(d)
		}
		return r.holdAgain(d, span, "the breaker was open")
	case outNotSent:
		// On its last allowed delivery a NAK would let JetStream give up
		// on it unseen, so giveBack dead-letters it.
		span.setOutcome("released")
		return giveBackEnding(afterLastPull, "shutdown grace period over while waiting for the rate limit")
	}
	return r.abandoned(d, span, err) // outAbandoned
}

// heldForApp holds d after its request found the app unreachable (the
// tracker keeps it in progress): the outage spent nothing. It returns no
// ending to send d again once the app is back.
func (r *Runner) heldForApp(d *delivery, span *attemptSpan, err error) ending {
	if r.ph.fetched.Err() != nil {
		span.setOutcome("released")
		return giveBackEnding(afterLastPull, "shutting down during an app outage")
	}
	r.gate.hold(causeApp, err.Error())
	if d.probe {
		// The breaker's go-ahead reached no app: another one comes
		// after its wait.
		r.breaker.retryProbe()
	}
	return r.holdAgain(d, span, "the app was unavailable")
}

// abandoned is d's ending after the grace period ended during its request:
// the app may have acted, so the attempt is spent; a message on its last
// delivery is dead-lettered, as a timeout would be. (A 2xx that came in,
// its body cut off by the cancel, is not abandoned: decide finds no error.)
func (r *Runner) abandoned(d *delivery, span *attemptSpan, err error) ending {
	if d.last(r.o.MaxDeliver) {
		span.setOutcome("dead_lettered")
		return deadLetterEnding(failure{reason: dlq.ReasonExhausted,
			err: fmt.Errorf("request abandoned when the shutdown grace period ended: %w", err)})
	}
	span.setOutcome("released")
	return giveBackEnding(nakNow, "shutdown grace period over")
}

// holdAgain holds d (in progress, spending nothing) as a worker holds a
// message it took while the gate is closed: until the gate opens, or, while
// the breaker alone holds, until d is its probe. It returns no ending to
// send d again. Otherwise d ends: dead-lettered if it outlived
// COURIER_MAX_AGE meanwhile, given back if courier stopped fetching; while
// says what held it, for the dead letter and the log.
func (r *Runner) holdAgain(d *delivery, span *attemptSpan, while string) ending {
	probe := r.hold.hold(r.ph.fetched, d.attempt == 1)
	if r.ph.fetched.Err() != nil {
		span.setOutcome("released")
		return giveBackEnding(afterLastPull, "shutting down while "+while)
	}
	// A new go-ahead: no answer has reached the breaker for it yet.
	d.probe, d.answered = probe, false
	f, expired := r.expired(d)
	if !expired {
		return ending{}
	}
	f.err = fmt.Errorf("message exceeded COURIER_MAX_AGE %s while %s", r.o.MaxAge, while)
	span.setOutcome("dead_lettered")
	return deadLetterEnding(f)
}
