package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/dlq"
)

// delivery is one delivery of one message, from a worker taking it to its
// settling.
type delivery struct {
	m       jetstream.Msg
	meta    *jetstream.MsgMetadata
	attempt int      // JetStream's delivery count, 1-based
	key     string   // the resolved dedup key, as the app sees it
	skey    string   // the key as the dedup store holds it
	okey    string   // the ordering key (order.go); "" when not ordered
	ord     keyLines // the lines okey is in (of its partition, partition.go)
	oepoch  uint64   // ord's epoch when it was admitted
	// detached: held for a probe apart from the workers (detach); its
	// worker returns once it is settled.
	detached bool
	fl       *flight // own while this delivery holds the key's flight, else nil
	own      flight
	claimed  bool // the dedup store holds a claim of ours on skey
	probe    bool // sent while the breaker is open, to see if the app recovered
	// answered: the app's answer reached the breaker. A probe that ends
	// without one (a duplicate, an expired message, the app unreachable)
	// has used the breaker's token for nothing and must ask for another.
	answered bool
	arrived  time.Time // when the message reached courier
	// wait bounds waiting (for a flight of the same key, the store, the
	// app): shutdown's noStart, or the grace period for a message on its
	// last delivery, started at shutdown so that it is not given back.
	// Both are the running worker's lane, as is timer, which bounds each
	// request by the HTTP timeout and by the grace period.
	wait  context.Context
	timer *requestTimer
	log   msgLog
	// With batches: d as an entry of one, answered on its worker's
	// channel (lane.batchDone; nil: a channel of its own), or settled by
	// the batch once handed off (handedOff: its worker went on).
	entry     batchEntry
	batchDone chan batchResult
	handedOff bool
	// records, for an entry its batch's answer said succeeded: told once
	// its key is recorded and it is acked (recorder), so that the batch's
	// slot waits for it (batchRecords).
	records *batchRecords
}

// keyLines are the lines of order per key a delivery is in (order.go's
// orderer), told how it ended and asked whether its admission still holds.
// Safe for concurrent use.
type keyLines interface {
	// settled lets key go on after the message at seq was settled for
	// good, and returns how many of its messages waited behind it.
	settled(key string, seq uint64) int
	// retrying notes the message at seq is NAK'd for a retry in delay; it
	// returns what must be given back meanwhile (its partition handed on).
	retrying(key string, seq uint64, delay time.Duration) []queued
	// waitingBehind is how many of key's messages wait behind its head.
	waitingBehind(key string) int
	// outdated reports that the lines were handed on since epoch.
	outdated(epoch uint64) bool
}

// keyer makes deliveries of messages: it resolves a message's key as the
// app sees it (ResolveKey) and as the dedup store holds it (storeKey).
type keyer struct {
	header  string // Options.IdempotencyHeader
	stream  string
	created time.Time
	log     *slog.Logger
}

// delivery is a delivery of m, whose metadata m.Metadata returned as meta
// (nil: none; the delivery is then only given back), run by the worker of
// ln, waiting at most until wait ends.
func (k keyer) delivery(m jetstream.Msg, meta *jetstream.MsgMetadata, ln lane, wait context.Context) *delivery {
	if meta == nil {
		return &delivery{m: m, wait: wait, log: msgLog{l: k.log, subject: m.Subject()}}
	}
	key := ResolveKey(m.Headers(), k.header, meta.Stream, k.created, meta.Sequence.Stream)
	return &delivery{
		m: m, meta: meta, attempt: int(meta.NumDelivered), key: key, skey: storeKey(key), wait: wait, timer: ln.timer,
		batchDone: ln.batchDone,
		log:       msgLog{l: k.log, subject: m.Subject(), seq: meta.Sequence.Stream, key: key, attempt: int(meta.NumDelivered)},
	}
}

// message is a delivery of m that no worker runs, to be given back.
func (k keyer) message(m jetstream.Msg) *delivery {
	meta, err := m.Metadata()
	if err != nil {
		meta = nil
	}
	return k.delivery(m, meta, lane{}, nil)
}

// last reports whether this is the message's last allowed delivery.
func (d *delivery) last(maxDeliver int) bool { return d.attempt >= maxDeliver }

// ended is how a delivery left its worker.
type ended int

const (
	endedHere      ended = iota // settled (or given back) on the worker
	endedDetached               // detached: a new worker has the worker's place
	endedHandedOff              // in a batch, settled by it (handoff.go): the worker goes on
)

// deliver runs one delivery of q's message, whose metadata m.Metadata
// returned as meta and err, to its end: ack, NAK with delay, dead letter, or
// give back at shutdown; or hands it to a batch, which settles it. wait is
// one of ln's contexts. It reports how the delivery left its worker.
func (r *Runner) deliver(q queued, meta *jetstream.MsgMetadata, err error, ln lane, wait context.Context, probe bool) (how ended) {
	m := q.m
	if err != nil {
		r.log.Error("message without JetStream metadata; NAK'd", "subject", m.Subject(), "error", err)
		r.settle.giveBack(r.settle.make.delivery(m, nil, ln, wait), nakNow, "no metadata")
		return
	}
	d := r.settle.make.delivery(m, meta, ln, wait)
	d.probe, d.arrived, d.okey, d.oepoch = probe, q.at, q.okey, q.epoch
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
	if r.settle.referenced(d) {
		return
	}
	if f, expired := r.expired(d); expired {
		r.settle.deadLetter(d, f)
		return
	}
	if r.dd != nil && !r.checkKey(d) {
		return
	}
	if r.attempt(d) {
		how = endedHandedOff
	}
	return
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

// attempt sends the message to the app and settles it by the answer
// (sendUntilSettled), or with batches on hands it to the next batch, which
// settles it (handOff); it reports whether it did the latter.
func (r *Runner) attempt(d *delivery) (handedOff bool) {
	h, ct, dropped := r.requestHeaders(d)
	for _, dh := range dropped {
		r.m.dropped.Inc()
		d.log.Warn("header not passed to the app", "header", dh.Name, "reason", dh.Reason)
	}
	span := r.startSpan(d, h)
	if r.handOff(d, h, ct, span) {
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
// the answer makes of the delivery, settleAnswer does it. An attempt that
// spent nothing (the app unreachable, a failed probe on the last allowed
// delivery) holds the message and sends it again. After a 2xx with dedup
// on, recording the key and the ack are handed to the recorder, so the
// worker takes the next message while the key commits. first, if not nil,
// is the answer to a request sent already (handoff.go).
func (r *Runner) sendUntilSettled(d *delivery, h http.Header, ct string, span *attemptSpan, first *answered) {
	var lastErr error
	delivered := false
	defer func() {
		span.end(lastErr)
		if !delivered {
			r.settle.unclaim(d)
		}
	}()
	for first != nil || r.mayStart(d, span) {
		var a answered
		if first != nil {
			a, first = *first, nil
		} else {
			span.request()
			answer, took, err := r.send(d, h, ct, span)
			a = answered{out: r.decide(d, err, took), res: batchResult{answer: answer, took: took, err: err}}
		}
		lastErr = a.res.err
		delivered = a.out == outDelivered
		if !r.settleAnswer(d, span, a.out, a.res.err, a.res.answer, a.res.took) {
			return
		}
	}
}

// mayStart reports whether d may be sent now: the gate is open, d is the
// breaker's probe, or courier is stopping (d then goes out as its worker
// decided). Otherwise (the gate closed while d waited for its key or the
// store, or d was the probe and handed that on) d is held until it may; it
// reports false if d was settled meanwhile, or given back because the pin
// of the durable moved away since d's key admitted it (orderer.unpinned).
func (r *Runner) mayStart(d *delivery, span *attemptSpan) bool {
	for !d.probe && !r.open() && r.ph.fetched.Err() == nil {
		if !r.holdAgain(d, span, "deliveries were held") {
			return false
		}
	}
	if d.okey != "" && d.ord != nil && d.ord.outdated(d.oepoch) {
		r.settle.giveBack(d, nakNow, "the durable's pin moved to another courier") // which sends it in its key's order
		return false
	}
	return true
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
	class := r.classify(err)
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

// settleAnswer does what decide said, and reports whether to send d again.
func (r *Runner) settleAnswer(d *delivery, span *attemptSpan, out outcome, err error, answer *apphttp.Answer, took time.Duration) (again bool) {
	switch out {
	case outDelivered:
		span.setOutcome("delivered")
		r.succeeded(d, span, answer, took)
	case outRetry:
		span.setOutcome("retried")
		r.settle.retry(d, err)
	case outExhausted:
		span.setOutcome("dead_lettered")
		r.settle.deadLetter(d, failure{reason: dlq.ReasonExhausted, err: err})
	case outRejected:
		span.setOutcome("dead_lettered")
		r.settle.deadLetter(d, failure{reason: dlq.ReasonRejected, err: err})
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
		r.settle.giveBack(d, afterLastPull, "shutdown grace period over while waiting for the rate limit")
	case outAbandoned:
		r.abandoned(d, span, err)
	}
	return false
}

// succeeded settles a 2xx (settler.succeeded), its answer's headers
// carrying the attempt span's context for the success record.
func (r *Runner) succeeded(d *delivery, span *attemptSpan, answer *apphttp.Answer, took time.Duration) {
	if r.o.Success != nil && answer != nil {
		answer.Header = r.inject(span, answer.Header)
	}
	r.settle.succeeded(d, answer, took)
}

// heldForApp holds d after its request found the app unreachable (the
// tracker keeps it in progress): the outage spent nothing. It reports
// whether to send d again once the app is back.
func (r *Runner) heldForApp(d *delivery, span *attemptSpan, err error) bool {
	if r.ph.fetched.Err() != nil {
		span.setOutcome("released")
		r.settle.giveBack(d, afterLastPull, "shutting down during an app outage")
		return false
	}
	r.gate.hold(causeApp, err.Error())
	if d.probe {
		// The breaker's go-ahead reached no app: another one comes
		// after its wait.
		r.breaker.retryProbe()
	}
	return r.holdAgain(d, span, "the app was unavailable")
}

// abandoned settles d after the grace period ended during its request: the
// app may have acted, so the attempt is spent; a message on its last
// delivery is dead-lettered, as a timeout would be. (A 2xx that came in,
// its body cut off by the cancel, is not abandoned: decide finds no error.)
func (r *Runner) abandoned(d *delivery, span *attemptSpan, err error) {
	if d.last(r.o.MaxDeliver) {
		span.setOutcome("dead_lettered")
		r.settle.deadLetter(d, failure{reason: dlq.ReasonExhausted,
			err: fmt.Errorf("request abandoned when the shutdown grace period ended: %w", err)})
		return
	}
	span.setOutcome("released")
	r.settle.giveBack(d, nakNow, "shutdown grace period over")
}

// requestHeaders returns the headers d is sent with (BuildHeaders), or with
// batches on those of its entry and its content type (entryHeaders), and
// those of its own that were dropped.
func (r *Runner) requestHeaders(d *delivery) (http.Header, string, []apphttp.DroppedHeader) {
	if r.batcher != nil {
		return entryHeaders(d.m, r.o.Tracer != nil)
	}
	h, dropped := BuildHeaders(d.m, d.meta, d.key)
	return h, "", dropped
}

// send sends d with headers h: on its own (sender.post), or in a batch (batcher)
// when batches are on, with content type ct; span is d's attempt span (nil:
// tracing off).
func (r *Runner) send(d *delivery, h http.Header, ct string, span *attemptSpan) (*apphttp.Answer, time.Duration, error) {
	if r.batcher != nil {
		res := r.batcher.submit(d, h, ct, span)
		return res.answer, res.took, res.err
	}
	var keep int64
	if r.o.Success != nil {
		keep = r.o.MaxPayload // the answer makes the success record
	}
	return r.sender.post(r.ph.requests, request{
		to: r.sender.targetOf(d.m.Subject()), reason: reasonOf(d), keep: keep, h: h, body: d.m.Data(), timer: d.timer,
	})
}

// batchRecords counts the entries of one batch answered 2xx whose keys are
// not yet recorded and acked; all is closed when none is left.
type batchRecords struct {
	left atomic.Int64
	all  chan struct{}
}

// done tells b one more entry was recorded and acked.
func (b *batchRecords) done() {
	if b.left.Add(-1) == 0 {
		close(b.all)
	}
}

// holdAgain holds d (in progress, spending nothing) as a worker holds a
// message it took while the gate is closed: until the gate opens, or, while
// the breaker alone holds, until d is its probe. It reports whether to send
// d again. Otherwise d is settled: dead-lettered if it outlived
// COURIER_MAX_AGE meanwhile, given back if courier stopped fetching; while
// says what held it, for the dead letter and the log.
func (r *Runner) holdAgain(d *delivery, span *attemptSpan, while string) bool {
	var probe bool
	r.countHeld(func() { probe = r.waitToSend(r.ph.fetched, d.attempt == 1) })
	if r.ph.fetched.Err() != nil {
		span.setOutcome("released")
		r.settle.giveBack(d, afterLastPull, "shutting down while "+while)
		return false
	}
	// A new go-ahead: no answer has reached the breaker for it yet.
	d.probe, d.answered = probe, false
	f, expired := r.expired(d)
	if !expired {
		return true
	}
	f.err = fmt.Errorf("message exceeded COURIER_MAX_AGE %s while %s", r.o.MaxAge, while)
	span.setOutcome("dead_lettered")
	r.settle.deadLetter(d, f)
	return false
}
