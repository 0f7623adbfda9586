// The decider: one delivery from a worker taking it (take) to its ending
// (ending.go). deliver checks what ends a delivery before it is sent (a
// reference dead letter's original, its max age, the dedup check:
// checkkey.go), attempt sends it by its way (alone, or in a batch:
// batcher.go, handoff.go), and decide says the ending an answer makes of
// it (endingOf): one the settler carries out (settle.go), or held
// (hold.go) and sent again.

package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/dlq"
)

// decider decides over the deliveries the workers take: one delivery from
// its worker taking it to its ending. It holds no pointer to the Runner,
// which starts a worker in the place of one whose delivery is held apart
// (detach).
type decider struct {
	o       Options
	log     *slog.Logger
	m       *metrics
	settle  *settler
	check   keyCheck // the dedup check (checkkey.go), or unchecked
	breaker breakerTold
	hold    *holder
	gate    *gate
	way     way
	trace   *tracing
	batcher *batcher // nil: each message alone
	ph      *phases  // set by start
	// workers counts the workers and the deliveries handed off to batches
	// (handoff.go), which Run waits for.
	workers *sync.WaitGroup
	// detach gives the place of d's worker to a new worker (proxy.go).
	detach func(d *delivery)
}

// breakerTold is the breaker (breaker.go) as the decision tells it what
// came of each request, and hands on a probe that reached no app. Safe for
// concurrent use.
type breakerTold interface {
	// success: the app answered (a 2xx, or a failure that is no sign of
	// an outage).
	success()
	// failure: a transient failure of the delivery of key (fresh: its
	// first delivery), with the app's Retry-After, if any; probe: it was
	// the breaker's probe.
	failure(key string, fresh bool, retryAfter time.Duration, probe bool)
	// retryProbe: the probe's go-ahead reached no app; another comes.
	retryProbe()
	// handOn: the probe's go-ahead goes to another held message.
	handOn()
}

// take delivers q, which a worker took, or gives it back once courier is
// stopping, and reports how it left the worker.
func (dc *decider) take(q queued, ln lane) ended {
	meta, err := q.m.Metadata()
	if err != nil {
		meta = nil // a delivery without metadata is only given back
	}
	probe := false
	if dc.ph.noStart.Err() == nil && !dc.hold.open() {
		probe = dc.hold.hold(dc.ph.noStart, meta != nil && meta.NumDelivered == 1)
	}
	d := dc.settle.make.delivery(q, meta, ln, ln.noStart)
	switch {
	case dc.ph.noStart.Err() == nil && err != nil:
		dc.log.Error("message without JetStream metadata; NAK'd", "subject", q.m.Subject(), "error", err)
		dc.settle.end(d, giveBackEnding(giveBackNow, "no metadata"))
		return endedHere
	case dc.ph.noStart.Err() == nil:
		d.probe = probe
		return dc.deliver(d)
	case dc.hold.open() && lastDelivery(meta, dc.o.MaxDeliver):
		// Stopping. A message on its last allowed delivery is sent within
		// the grace period rather than given back: a NAK would make
		// JetStream give up on it without the app having seen it.
		d.wait = ln.requests
		return dc.deliver(d)
	}
	// Given back unsent at shutdown: its key's line, if any, is not told;
	// it is drained after the workers, which marks the message as its
	// key's first unsettled one (markDrained).
	d.ord, d.okey = noLines{}, ""
	dc.settle.end(d, giveBackEnding(giveBackLater, "shutting down"))
	return endedHere
}

// lastDelivery reports whether a message with metadata meta (nil: none) is
// on its last allowed delivery.
func lastDelivery(meta *jetstream.MsgMetadata, maxDeliver int) bool {
	return meta != nil && int(meta.NumDelivered) >= maxDeliver
}

// deliver runs delivery d to its end: ack, NAK with delay, dead letter, or
// give back at shutdown; or hands it to a batch, which settles it. It
// reports how d left its worker.
func (dc *decider) deliver(d *delivery) (how ended) {
	// Not only a delivery that starts as the probe: one held again (holdAgain)
	// may become it. A probe that reached no app (a duplicate, an expired
	// message) spent no request: the next candidate goes at once. A
	// delivery handed to a batch is no longer the worker's to look at.
	defer func() {
		if how == endedHandedOff {
			return
		}
		dc.probeDone(d)
		if d.detached {
			how = endedDetached
		}
	}()
	if e := dc.unsent(d); e.kind != endNone {
		dc.settle.end(d, e)
		return
	}
	if dc.attempt(d) {
		how = endedHandedOff
	}
	return
}

// unsent returns d's ending if it ends before it is sent: an earlier copy
// of a message a rewind copies again (superseded, acked as a duplicate:
// the rewind's copy delivers it), the original of a stored reference dead
// letter, a message over its max age, a duplicate, or one given back while
// its key was checked. No ending: d goes to the app.
func (dc *decider) unsent(d *delivery) ending {
	if copyOfMsg(d.m).superseded(dc.o.Rewinds) {
		return ending{kind: endDuplicate, why: whySuperseded}
	}
	if dc.settle.refs.referenced(d) {
		return ending{kind: endReferenced}
	}
	if f, expired := dc.expired(d); expired {
		return deadLetterEnding(f)
	}
	return dc.check.check(d)
}

// keyCheck checks a delivery's key before it is sent (checkkey.go's
// checker), returning its ending if it ends there. Safe for concurrent use.
type keyCheck interface {
	check(d *delivery) ending
}

// unchecked is the key check with dedup off: every delivery goes on.
type unchecked struct{}

func (unchecked) check(*delivery) ending { return ending{} }

// probeDone ends d's turn as the breaker's probe if it reached no app.
func (dc *decider) probeDone(d *delivery) {
	if d.probe && !d.answered {
		dc.breaker.handOn()
	}
}

// expired reports a message older than MaxAge, as a dead letter's failure.
func (dc *decider) expired(d *delivery) (failure, bool) {
	if dc.o.MaxAge <= 0 {
		return failure{}, false
	}
	age := dc.o.Now().Sub(d.meta.Timestamp)
	if age <= dc.o.MaxAge {
		return failure{}, false
	}
	return failure{reason: dlq.ReasonExpired,
		err: fmt.Errorf("message is %s old, over COURIER_MAX_AGE %s", age.Round(time.Millisecond), dc.o.MaxAge)}, true
}

// way is how deliveries go to the app: each alone (alone), or as entries
// of batches (batcher.go). Safe for concurrent use.
type way interface {
	// headers returns the headers d is sent with, its content type (for
	// a batch's entry), and those of its own that were dropped.
	headers(d *delivery) (http.Header, string, []apphttp.DroppedHeader)
	// handOff hands d, to be sent with h and ct, to whatever settles it
	// without its worker waiting, if it may (handoff.go), and reports
	// whether it did. ready is d's checks (decider.goAhead), made once
	// the request's waits are over.
	handOff(d *delivery, h http.Header, ct string, span *attemptSpan, ready func() error) bool
	// send sends d, if ready lets it once the request's waits are over,
	// and returns the answer to it (errRefused: ready refused it).
	send(d *delivery, h http.Header, ct string, span *attemptSpan, ready func() error) (*apphttp.Answer, time.Duration, error)
}

// alone sends each delivery in a request of its own.
type alone struct {
	s    *sender
	keep int64 // what is kept of a 2xx answer's body: with success records, all
}

// headers are BuildHeaders'.
func (a alone) headers(d *delivery) (http.Header, string, []apphttp.DroppedHeader) {
	h, dropped := BuildHeaders(d.m, d.meta, d.key)
	return replayHeader(h, d), "", dropped
}

// handOff hands off nothing: d's worker waits for its answer.
func (alone) handOff(*delivery, http.Header, string, *attemptSpan, func() error) bool { return false }

// send posts d within its worker's lane (d.requests, d.timer).
func (a alone) send(d *delivery, h http.Header, _ string, _ *attemptSpan, ready func() error) (*apphttp.Answer, time.Duration, error) {
	body := d.m.Data()
	return a.s.post(d.requests, request{
		to: a.s.targetOf(d.m.Subject()), reason: reasonOf(d), keep: a.keep, timer: d.timer,
		ready: func() (http.Header, []byte, error) { return h, body, ready() },
	})
}

// attempt sends the message to the app and settles it by the answer
// (sendUntilSettled), or hands it to the next batch, which settles it
// (way.handOff); it reports whether it did the latter.
func (dc *decider) attempt(d *delivery) (handedOff bool) {
	h, ct, dropped := dc.way.headers(d)
	if len(dropped) > 0 {
		// Counted per value, logged once per reason: a publisher's
		// thousands of values HTTP cannot carry make one line each.
		dc.m.dropped.Add(float64(len(dropped)))
		for _, k := range apphttp.DroppedKinds(dropped) {
			d.log.Warn("headers not passed to the app", "reason", k.Reason,
				"headers", strings.Join(k.Names, ","), "more_headers", k.More, "values", k.Values)
		}
	}
	span := dc.trace.startAttempt(d, h)
	if dc.way.handOff(d, h, ct, span, dc.goAhead(d, span)) {
		return true
	}
	dc.sendUntilSettled(d, h, ct, span, nil)
	return false
}

// answered is what came of one request for a delivery: its ending, as
// decide said it (or mayGo, if its checks refused the request), and the
// request's error (errRefused: refused).
type answered struct {
	end ending
	err error
}

// sendUntilSettled sends d and settles it by the answer: decide says the
// ending the answer makes of the delivery, and the settler carries it out
// (settler.end). An attempt that spent nothing (the app unreachable, a
// failed probe on the last allowed delivery) holds the message (endHeld)
// and sends it again; so does one that its checks refused while
// deliveries are held (mayGo). After a 2xx with dedup on, recording the key
// and the ack are handed to the recorder, so the worker takes the next
// message while the key commits. first, if not nil, is what came of a
// request sent already (handoff.go).
func (dc *decider) sendUntilSettled(d *delivery, h http.Header, ct string, span *attemptSpan, first *answered) {
	var lastErr error
	var end ending
	for end.kind == endNone {
		var a answered
		if first != nil {
			a, first = *first, nil
		} else {
			a = dc.try(d, h, ct, span)
		}
		if !errors.Is(a.err, errRefused) {
			lastErr = a.err
		}
		end = dc.follow(d, span, a.end)
	}
	span.setOutcome(end.kind.String())
	dc.settle.end(d, end)
	span.end(lastErr)
	if end.kind != endSucceeded {
		// After any ending but a 2xx's (whose key the recorder records),
		// the key's next delivery goes ahead.
		dc.settle.unclaim(d)
	}
}

// try sends d once and says what came of it.
func (dc *decider) try(d *delivery, h http.Header, ct string, span *attemptSpan) answered {
	answer, took, err := dc.way.send(d, h, ct, span, dc.goAhead(d, span))
	if errors.Is(err, errRefused) {
		return answered{end: takeRefused(d), err: err}
	}
	return answered{end: dc.decide(d, result{answer: answer, took: took, err: err}), err: err}
}

// follow does what the decider does with e, d's ending as decide or mayGo
// said it, before the settler carries it out: a delivery held is held
// (holdAgain), which returns no ending to send it again, or how it ended
// meanwhile; a success's answer takes the attempt span's context, which its
// success record keeps.
func (dc *decider) follow(d *delivery, span *attemptSpan, e ending) ending {
	switch e.kind {
	case endHeld:
		return dc.holdAgain(d, e.why)
	case endSucceeded:
		if dc.o.Success != nil && e.answer != nil {
			e.answer.Header = dc.trace.inject(span, e.answer.Header)
		}
	}
	return e
}

// mayGo is the one place that decides whether d may be sent now. The
// sender asks it (through goAhead) once every wait of the request is over
// (d's key's turn and the dedup check came before; the rate limit and a
// slot of the in-flight limit are the sender's), and nothing between it
// and the write can block, so what it says still holds when the request
// goes. It does not block. It returns no ending for d to go, else, in
// order:
//   - courier is stopping: d goes only on its last allowed delivery with
//     the gate open (a NAK would let JetStream give up on it unseen), else
//     it is given back;
//   - the gate is closed (the app or the store unavailable, the breaker
//     open, a pause) and d is not the breaker's probe: held;
//   - the durable's pin moved to another courier since d's key admitted
//     it: given back, for the courier pinned now sends it in its key's
//     order;
//   - d outlived COURIER_MAX_AGE: dead-lettered.
func (dc *decider) mayGo(d *delivery) ending {
	stopping := dc.ph.noStart.Err() != nil
	switch {
	case stopping && !(dc.hold.open() && d.last(dc.o.MaxDeliver)):
		return giveBackEnding(giveBackLater, "shutting down before it was sent")
	case !stopping && !d.probe && !dc.hold.open():
		return heldEnding("deliveries were held")
	case d.ord.outdated(d.oepoch):
		return giveBackEnding(giveBackMoved, "the durable's pin moved to another courier")
	}
	if f, expired := dc.expired(d); expired {
		return deadLetterEnding(f)
	}
	return ending{}
}

// goAhead is d's checks as the sender makes them once the request's waits
// are over: mayGo, its ending kept on d if it refuses (errRefused; taken
// by takeRefused), and the request counted on d's span if it goes.
func (dc *decider) goAhead(d *delivery, span *attemptSpan) func() error {
	return func() error {
		if d.sending != nil {
			// Before the checks: a request that passes them is kept in
			// progress from then on, whatever the tracker asks meanwhile.
			d.sending.Store(true)
		}
		if e := dc.mayGo(d); e.kind != endNone {
			if d.sending != nil {
				d.sending.Store(false)
			}
			d.refused = e
			return errRefused
		}
		span.request()
		return nil
	}
}

// takeRefused takes what mayGo said of d when it refused its request.
func takeRefused(d *delivery) ending {
	e := d.refused
	d.refused = ending{}
	return e
}

// decide classifies the result of one request (classify, the one place an
// answer is judged), tells the breaker and the gate, and returns the
// ending it makes of d (endingOf): held (endHeld) if the attempt spent
// nothing, to send d again once it may.
func (dc *decider) decide(d *delivery, res result) ending {
	if errors.Is(res.err, errNotSent) {
		// On its last allowed delivery a NAK would let JetStream give up
		// on it unseen, so giveBack dead-letters it.
		return giveBackEnding(giveBackLater, "shutdown grace period over while waiting for the rate limit")
	}
	if res.err != nil && dc.ph.requests.Err() != nil {
		return abandoned(res.err, d.last(dc.o.MaxDeliver))
	}
	dc.m.request(resultLabel(res.err), res.took.Seconds())
	class := classify(res.err, dc.o.Retryable)
	d.answered = class != apphttp.Unavailable
	last := d.last(dc.o.MaxDeliver)
	var retryAfter time.Duration
	var fromApp bool
	switch class {
	case apphttp.Unavailable:
		// The outage spent nothing: d is held (the tracker keeps it in
		// progress), and sent again once the app is back.
		if dc.ph.fetched.Err() != nil {
			return giveBackEnding(giveBackLater, "shutting down during an app outage")
		}
		dc.gate.hold(causeApp, res.err.Error())
		if d.probe {
			// The breaker's go-ahead reached no app: another one comes
			// after its wait.
			dc.breaker.retryProbe()
		}
	case apphttp.Transient:
		retryAfter, fromApp = apphttp.RetryAfter(retryAfterOf(res.err), dc.o.Now(), dc.o.RetryAfterMax)
		if se := (*splitError)(nil); errors.As(res.err, &se) {
			// A batch refused whole is no sign of an outage: the app
			// answered, as for a message rejected.
			dc.breaker.success()
		} else {
			dc.breaker.failure(d.skey, d.attempt == 1, retryAfter, d.probe)
		}
		if last && d.probe {
			d.log.Debug("probe failed on the message's last allowed delivery; held for the next probe",
				statusAttr(res.err), "error", res.err.Error())
			if d.attempt > 1 && !d.detached && dc.ph.fetched.Err() == nil {
				dc.detach(d)
			}
		}
	default:
		dc.breaker.success()
	}
	return endingOf(class, res, retryAfter, fromApp, last, d.probe)
}

// endingOf is the ending an answer of class makes of a delivery: res is its
// request's result, retryAfter the app's Retry-After, capped (fromApp: it
// gave one), last that the delivery is the message's last allowed one,
// probe that it was the breaker's probe.
func endingOf(class apphttp.Class, res result, retryAfter time.Duration, fromApp, last, probe bool) ending {
	switch class {
	case apphttp.Success:
		return ending{kind: endSucceeded, answer: res.answer, took: res.took}
	case apphttp.Unavailable:
		return heldEnding("the app was unavailable")
	case apphttp.Transient:
		switch {
		case last && probe:
			// A probe never spends a message's last allowed delivery.
			return heldEnding("the breaker was open")
		case last:
			return deadLetterEnding(failure{reason: dlq.ReasonExhausted, err: res.err})
		}
		return ending{kind: endRetry, err: res.err, retryAfter: retryAfter, fromApp: fromApp}
	}
	return deadLetterEnding(failure{reason: dlq.ReasonRejected, err: res.err})
}

// retryAfterOf is the app's Retry-After of a failed request, if any.
func retryAfterOf(err error) string {
	var ae *apphttp.AppError
	if errors.As(err, &ae) {
		return ae.RetryAfter
	}
	return ""
}

// abandoned is the ending of a delivery after the grace period ended
// during its request (err): the app may have acted, so the attempt is
// spent; on the message's last allowed delivery (last) it is
// dead-lettered, as a timeout would be. (A 2xx that came in, its body cut
// off by the cancel, is not abandoned: decide finds no error.)
func abandoned(err error, last bool) ending {
	if last {
		return deadLetterEnding(failure{reason: dlq.ReasonExhausted,
			err: fmt.Errorf("request abandoned when the shutdown grace period ended: %w", err)})
	}
	return giveBackEnding(giveBackNow, "shutdown grace period over")
}

// holdAgain holds d (in progress, spending nothing) as a worker holds a
// message it took while the gate is closed: until the gate opens, or, while
// the breaker alone holds, until d is its probe. It returns no ending to
// send d again. Otherwise d ends: dead-lettered if it outlived
// COURIER_MAX_AGE meanwhile, given back if courier stopped fetching; while
// says what held it, for the dead letter and the log.
func (dc *decider) holdAgain(d *delivery, while string) ending {
	probe := dc.hold.hold(dc.ph.fetched, d.attempt == 1)
	if dc.ph.fetched.Err() != nil {
		return giveBackEnding(giveBackLater, "shutting down while "+while)
	}
	// A new go-ahead: no answer has reached the breaker for it yet.
	d.probe, d.answered = probe, false
	f, expired := dc.expired(d)
	if !expired {
		return ending{}
	}
	f.err = fmt.Errorf("message exceeded COURIER_MAX_AGE %s while %s", dc.o.MaxAge, while)
	return deadLetterEnding(f)
}
