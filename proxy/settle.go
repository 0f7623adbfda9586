package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/retry"
	"github.com/courierhq/courier/success"
)

// Settling: every delivery ends here, in exactly one of
//
//   - acked after its 2xx, once its success record is stored (succeeded)
//     and its key recorded (recorder): acked;
//   - acked as a duplicate, its key processed already: duplicate;
//   - NAK'd with a delay, to be retried: retry;
//   - dead-lettered, its dead letter stored and the original terminated
//     (or, for a reference dead letter, kept: references.go): deadLetter;
//   - given back, NAK'd without delay, for another delivery to take it at
//     once (at shutdown, a partition handed on, a pin moved): giveBack.
//
// The settler is below the decision: it is given what it needs (the
// tracker, the dedup store, the dead-letter store, the metrics) and told
// the phases of shutdown when Run starts; it knows nothing of the runner,
// the workers, batches or the breaker. Order per key hears how each
// delivery ended through the delivery's keyLines.

// settler settles deliveries. Its methods are safe for concurrent use once
// start has run; stop waits for what it runs in the background.
type settler struct {
	o     Options
	log   *slog.Logger
	m     *metrics
	track *tracker
	// flights are the deliveries of each key running in this process
	// (checkkey.go): a settled delivery ends its key's flight.
	flights *flights
	dd      Deduper // nil: dedup off
	dl      DeadLetterer
	refs    *references
	gate    causeHolder
	make    keyer
	ph      *phases // set by start

	// recs hands delivered messages to the recorder, which lets each batch
	// gather for linger (recordLinger).
	recs      chan recJob
	linger    time.Duration
	recorders sync.WaitGroup

	released atomic.Int64 // messages given back (NAK'd without delay)

	// Dead letters and success records the streams would not store yet,
	// retried in the background (inBackground) while their messages are
	// held in progress.
	background     sync.WaitGroup
	pendingDL      atomic.Int64
	dlqErr         atomic.Pointer[error] // the last failure to store one
	pendingSuccess atomic.Int64
	successErr     atomic.Pointer[error]
}

// end ends d as e says (ending.go). An ending it does not know, or one
// that does not end a delivery (none, held), is a bug: it panics rather
// than leave d unsettled.
func (s *settler) end(d *delivery, e ending) {
	switch e.kind {
	case endSucceeded:
		s.succeeded(d, e.answer, e.took)
	case endDuplicate:
		s.duplicate(d, e.why)
	case endReferenced:
		s.giveBackReferenced(d)
	case endRetry:
		s.retry(d, e)
	case endDeadLetter:
		s.deadLetter(d, e.f)
	case endGiveBack:
		s.giveBack(d, e.back, e.why)
	default:
		panic(fmt.Sprintf("proxy: the settler cannot end a delivery as %q (%d)", e.kind, int(e.kind)))
	}
}

// causeHolder tells whether a cause holds deliveries (gate.go). Safe for
// concurrent use.
type causeHolder interface {
	isHeld(c cause) bool
}

func newSettler(o Options, log *slog.Logger, m *metrics, track *tracker, dd Deduper, dl DeadLetterer, g causeHolder) *settler {
	return &settler{
		o: o, log: log, m: m, track: track, flights: newFlights(), dd: dd, dl: dl, gate: g,
		refs:   newReferences(o, dd),
		make:   keyer{header: o.IdempotencyHeader, stream: o.Stream, created: o.StreamCreated, rewinds: o.Rewinds, log: log},
		recs:   make(chan recJob, maxRecordBatch),
		linger: recordLinger,
	}
}

// start starts the recorder; ph are the phases of the Run it settles for.
func (s *settler) start(ph *phases) {
	s.ph = ph
	s.recorders.Add(1)
	go s.recorder()
}

// stop, once nothing more is settled but what runs in the background,
// waits for the dead letters and success records still retried (they give
// their messages back: fetching has ended), then for the recorder to
// finish what it was given.
func (s *settler) stop() {
	s.background.Wait() // may still hand a delivery to the recorder
	close(s.recs)
	s.recorders.Wait()
}

// ready reports the dead letters and success records that cannot be
// stored yet, if any.
func (s *settler) ready() error {
	if n := s.pendingDL.Load(); n > 0 {
		return fmt.Errorf("%d dead letters cannot be stored (messages held, tried again): %s", n, lastErr(&s.dlqErr))
	}
	if n := s.pendingSuccess.Load(); n > 0 {
		return fmt.Errorf("%d success records cannot be stored (messages held, tried again): %s", n, lastErr(&s.successErr))
	}
	return nil
}

func lastErr(p *atomic.Pointer[error]) string {
	if e := p.Load(); e != nil {
		return (*e).Error()
	}
	return "unknown error"
}

// succeeded settles a 2xx: the success record (if configured) is stored
// before the key is recorded and the message acked (recorder). If the
// record cannot be stored yet, the message is held in progress and the
// record retried in the background, so that a success stream that refuses
// records does not take the worker; the app is not called again for it. If courier stops before it is stored, the message
// is given back without its key recorded: the record is not lost, the app
// sees the message again (with the same Idempotency-Key).
func (s *settler) succeeded(d *delivery, a *apphttp.Answer, took time.Duration) {
	if s.o.Success == nil {
		s.recs <- recJob{d: d, took: took}
		return
	}
	then := func() { s.recs <- recJob{d: d, took: took} }
	rec := success.Record{
		Subject: d.m.Subject(), Stream: d.meta.Stream, Consumer: s.o.Consumer,
		Sequence: d.meta.Sequence.Stream, Attempt: d.attempt, Key: d.key,
	}
	if a != nil {
		rec.Status, rec.Header, rec.Body, rec.BodyCut, rec.BodySize = a.Status, a.Header, a.Body, a.Cut, a.Size
	}
	rec.Trace = recordTrace(d, a, s.o.Tracer != nil)
	once := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err := s.o.Success.Publish(ctx, rec)
		if err != nil {
			s.m.successErrors.Inc()
			s.successErr.Store(&err)
			d.log.Error("cannot store the success record; message held and tried again", "error", err)
			return err
		}
		s.m.successRecords.Inc()
		return nil
	}
	if once(context.WithoutCancel(s.ph.requests)) == nil {
		then()
		return
	}
	s.inBackground(&s.pendingSuccess, once, then, func() {
		s.unclaim(d)
		s.giveBack(d, giveBackNow, "shutting down before its success record could be stored")
	})
}

// recordTrace is the trace context a success record keeps, as a dead letter
// keeps the message's (README, "Tracing"): with tracing on, the attempt
// span's, which attempt put on the answer's headers (inject); with tracing
// off, the message's own traceparent and tracestate, under the names the
// publisher gave them. Nil when there is none.
func recordTrace(d *delivery, a *apphttp.Answer, traced bool) nats.Header {
	src := map[string][]string(d.m.Headers())
	if traced {
		if a == nil {
			return nil
		}
		src = a.Header
	}
	var tc nats.Header
	for name, vs := range src {
		if len(vs) > 0 && (strings.EqualFold(name, "traceparent") || strings.EqualFold(name, "tracestate")) {
			if tc == nil {
				tc = make(nats.Header, 2)
			}
			tc[name] = vs
		}
	}
	return tc
}

// recJob is a delivery the app answered 2xx, waiting for its key to be
// recorded before it is acked.
type recJob struct {
	d    *delivery
	took time.Duration
}

// maxRecordBatch bounds the keys recorded in one call to the store, and the
// deliveries waiting for the recorder.
const maxRecordBatch = 256

// recordLinger is how long the recorder lets a batch gather after its first
// delivery. A commit to the store costs about the same for one key as for
// dozens (Badger hands each commit to a goroutine of its own and wakes the
// caller at the end): at 1 in flight, recording each key alone cost about a
// fifth of the drain rate. Only the ack waits; the app has answered and the
// worker has moved on.
const recordLinger = time.Millisecond

// recorder records the keys of delivered messages (dedup on), then acks
// them and ends their flights, until recs is closed. With dedup off it acks
// them in batches all the same: acks sent together leave in fewer writes to
// the connection, as nats.go flushes what is pending at once. It takes every delivery waiting
// recordLinger after the first (up to maxRecordBatch) and records their keys
// in one call, so the store commits the keys of concurrent workers and of
// successive messages together (group commit) and the batches grow with the
// load: while one commits, the next gathers. Each message is acked only
// after its key is recorded.
func (s *settler) recorder() {
	defer s.recorders.Done()
	batch := make([]recJob, 0, maxRecordBatch)
	keys := make([]string, 0, maxRecordBatch)
	for j := range s.recs {
		batch = append(batch[:0], j)
		if !keyWaits(j.d) {
			time.Sleep(s.linger)
		}
	fill:
		for len(batch) < maxRecordBatch {
			select {
			case j, ok := <-s.recs:
				if !ok {
					break fill
				}
				batch = append(batch, j)
			default:
				break fill
			}
		}
		var err error
		if s.dd != nil {
			keys = keys[:0]
			for _, j := range batch {
				keys = append(keys, j.d.skey)
				keys = s.make.alsoRecord(keys, j.d)
			}
			// Not the requests phase: a 2xx that arrived as the grace
			// period ended is recorded all the same.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ph.requests), 10*time.Second)
			err = s.dd.Record(ctx, keys...)
			cancel()
		}
		if err != nil {
			// The effect happened: calling the app again would surely
			// duplicate it, so the messages are acked anyway.
			s.m.dedupErrors.WithLabelValues("record").Add(float64(len(batch)))
		}
		for _, j := range batch {
			if err != nil {
				j.d.log.Error("dedup store could not record the key after a 2xx; acking anyway", "error", err)
			}
			s.acked(j.d, j.took)
			if b := j.d.records; b != nil {
				j.d.records = nil
				b.done()
			}
		}
		clear(batch) // drop references to settled messages
	}
}

// keyWaits reports whether later messages of d's ordering key wait for d's
// ack (order.go): the recorder then lets no batch gather, as each of them
// would wait for it in turn.
func keyWaits(d *delivery) bool {
	return d.ord.waitingBehind(d.okey) > 0
}

// acked acks a message the app answered 2xx (its key recorded, if dedup is
// on), and ends its flight.
func (s *settler) acked(d *delivery, took time.Duration) {
	s.track.remove(d.m)
	if err := d.m.Ack(); err != nil {
		d.log.Warn("ack failed; the message comes back and is recognised as a duplicate", "error", err)
	}
	s.endFlight(d, true)
	s.told(d, endSucceeded, 0)
	s.m.ended[endSucceeded].Inc()
	if d.log.enabled(slog.LevelDebug) {
		d.log.Debug("delivered", "status", "2xx", "took", took.Round(time.Microsecond).String())
	}
}

// duplicate acks a message whose key was already processed, or, as why
// says, one that another copy delivers (whySuperseded), and ends its
// flight.
func (s *settler) duplicate(d *delivery, why string) {
	s.endFlight(d, true)
	s.track.remove(d.m)
	if err := d.m.Ack(); err != nil {
		d.log.Warn("cannot ack duplicate; it comes back and is recognised again", "error", err)
	}
	s.told(d, endDuplicate, 0)
	s.m.ended[endDuplicate].Inc()
	if why != "" {
		d.log.Info("acked without calling the app", "why", why)
		return
	}
	d.log.Debug("duplicate acked without calling the app")
}

// retry NAKs d for redelivery after the app's Retry-After, capped, else
// full-jitter backoff at JetStream's delivery count, as e, its ending,
// says; e.err is its attempt's.
func (s *settler) retry(d *delivery, e ending) {
	delay := e.retryAfter
	if !e.fromApp {
		delay = Delay(d.attempt, s.o.BackoffInitial, s.o.BackoffMax, s.o.BackoffMultiplier, rand.Int64N)
	}
	s.told(d, endRetry, delay)
	s.track.remove(d.m)
	var nerr error
	if delay > 0 {
		nerr = d.m.NakWithDelay(delay)
	} else {
		nerr = d.m.Nak()
	}
	if nerr != nil {
		s.log.Warn("NAK failed; the message comes back after the ack wait", "subject", d.m.Subject(), "error", nerr)
	}
	if d.meta != nil {
		s.track.retried(streamSeq(d.m, d.meta), delay)
	}
	s.m.ended[endRetry].Inc()
	s.m.retryDelay.Observe(delay.Seconds())
	d.log.Info("retry scheduled", statusAttr(e.err), "error", e.err.Error(),
		"delay", delay.Round(time.Millisecond).String(), "retry_after", e.fromApp)
}

// giveBack gives d back without delay, so that another delivery (another
// courier's, or this one's after a restart) can take it at once, as mode
// says; why is for the log.
func (s *settler) giveBack(d *delivery, mode giveBackMode, why string) {
	if mode == giveBackLater {
		<-s.ph.fetched.Done()
	}
	if (mode == giveBackLater || mode == giveBackUnpulled) && d.last(s.o.MaxDeliver) && s.deadLetterUnsent(d, why) {
		return
	}
	s.track.remove(d.m)
	if err := d.m.Nak(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		s.log.Warn("cannot NAK message; it comes back after the ack wait", "subject", d.m.Subject(), "error", err)
	}
	s.m.ended[endGiveBack].Inc()
	s.released.Add(1)
	s.log.Debug("message released", "subject", d.m.Subject(), "why", why)
	if mode == giveBackMoved {
		// Only after the pin moved do its lines hear of it: at shutdown
		// they are drained instead.
		s.told(d, endGiveBack, 0)
	}
}

// deadLetterUnsent tries once to dead-letter d, on its last allowed
// delivery and given back unsent, and reports whether it did.
func (s *settler) deadLetterUnsent(d *delivery, why string) bool {
	reason := dlq.ReasonNotAttempted
	if s.gate.isHeld(causeApp) {
		reason = dlq.ReasonAppUnavailable
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ph.stopping), 5*time.Second)
	defer cancel()
	return s.deadLetterOnce(ctx, d, failure{reason: reason,
		err: fmt.Errorf("not sent to the app: %s, on the message's last allowed delivery", why)})
}

// nakNow is giveBack for a message no worker took, NAK'd at once
// (giveBackNow): what the fetcher is given, to give back what it holds
// (fetch.go, pin.go).
func (s *settler) nakNow(m jetstream.Msg, why string) {
	s.giveBack(s.make.message(m), giveBackNow, why)
}

// unclaim ends the delivery's flight and its claim in the store after an
// outcome other than a 2xx, so that the next delivery of the key goes ahead.
func (s *settler) unclaim(d *delivery) {
	if d.fl == nil {
		return
	}
	s.endFlight(d, false)
	if !d.claimed {
		return
	}
	d.claimed = false
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ph.requests), 5*time.Second)
	defer cancel()
	if err := s.dd.Release(ctx, d.skey); err != nil {
		// The claim lapses by itself after about the ack wait.
		d.log.Warn("cannot release the key's claim; it lapses by itself", "error", err)
	}
}

// endFlight ends d's flight of its key in this process (checkkey.go) with
// its outcome (ok: a 2xx or a duplicate), waking the deliveries of the key
// that wait for it.
func (s *settler) endFlight(d *delivery, ok bool) {
	s.flights.finish(d.fkey, d.fl, ok)
	d.fl = nil
}

// giveBackReferenced NAKs the original of a stored reference dead letter
// with BackoffMax; it was counted and logged when its dead letter was stored.
func (s *settler) giveBackReferenced(d *delivery) {
	s.track.remove(d.m)
	s.told(d, endReferenced, 0) // its dead letter is stored: its key goes on
	if err := d.m.NakWithDelay(s.o.BackoffMax); err != nil {
		s.log.Warn("cannot NAK the original of a reference dead letter", "subject", d.m.Subject(), "error", err)
	}
	d.log.Debug("original of a stored reference dead letter given back without calling the app")
}

// failure is why a message is dead-lettered.
type failure struct {
	reason string
	err    error
}

// deadLetter stores the message's dead letter, then terminates it. If the
// dead letter cannot be stored, the message is held in progress and the
// store is retried in the background, so that a dead-letter stream that
// refuses letters does not take the worker; at shutdown it is given back
// instead, never dropped.
func (s *settler) deadLetter(d *delivery, f failure) {
	// Not bounded by the grace period: a dead letter due at shutdown (a
	// request abandoned on its last delivery) is still stored.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ph.requests), 10*time.Second)
	ok := s.deadLetterOnce(ctx, d, f)
	cancel()
	if ok {
		return
	}
	s.inBackground(&s.pendingDL, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if s.deadLetterOnce(ctx, d, f) {
			return nil
		}
		return errors.New("not stored")
	}, nil, func() { s.giveBack(d, giveBackNow, "shutting down before its dead letter could be stored") })
}

// backgroundRetry is the schedule on which a dead letter or a success
// record that could not be stored is tried again, in the background, while
// its message is held.
var backgroundRetry = retry.Policy{Initial: 200 * time.Millisecond, Max: 30 * time.Second}

// inBackground tries store again on backgroundRetry while the message is
// held (pending counts it, for /readyz), until it succeeds (then stored runs,
// if not nil) or courier stops fetching (then gaveUp runs). stop waits for
// it before it hands the last deliveries to the recorder.
func (s *settler) inBackground(pending *atomic.Int64, store func(context.Context) error, stored, gaveUp func()) {
	pending.Add(1)
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		defer pending.Add(-1)
		if retry.Do(s.ph.fetched, backgroundRetry, store, nil) != nil {
			gaveUp()
			return
		}
		if stored != nil {
			stored()
		}
	}()
}

// deadLetterOnce tries once to store the message's dead letter and terminate
// the message. The original of a reference dead letter stored before is
// given back again instead: its one dead letter is stored.
func (s *settler) deadLetterOnce(ctx context.Context, d *delivery, f failure) bool {
	if ok, _ := s.refs.marked(ctx, d); ok {
		s.giveBackReferenced(d)
		return true
	}
	l := dlq.Letter{
		Subject: d.m.Subject(), Data: d.m.Data(), Header: d.m.Headers(),
		Stream: d.meta.Stream, StreamCreated: s.o.StreamCreated, Sequence: d.meta.Sequence.Stream,
		Published: d.meta.Timestamp, Consumer: s.o.Consumer,
		Reason: f.reason, Attempts: d.attempt, FailedAt: s.o.Now(),
		OrderKey: d.okey, Replay: d.replay,
	}
	l.OrderWaiting = d.ord.waitingBehind(d.okey)
	if f.err != nil {
		l.Error = f.err.Error()
		var ae *apphttp.AppError
		if errors.As(f.err, &ae) {
			l.Status = ae.Status
		}
	}
	err := s.dl.DeadLetter(ctx, l)
	if !dlq.Stored(err) {
		s.m.dlqErrors.Inc()
		s.dlqErr.Store(&err)
		s.log.Error("cannot store dead letter; message kept and tried again",
			"subject", l.Subject, "seq", l.Sequence, "reason", f.reason, "error", err)
		return false
	}
	s.track.remove(d.m)
	if errors.Is(err, dlq.ErrBodyOmitted) && !s.o.TermKeepsMessage {
		// The dead letter refers to the original, too large to copy: a
		// Term would remove it from a work-queue or interest stream. It is
		// marked (references.go) and given back with a long delay until
		// JetStream's budget is spent, after which JetStream keeps it in
		// the stream; its redeliveries are given back unsent.
		d.log.Warn("dead letter stored without the body (too large to copy); the original stays in its stream, not terminated, and is not sent to the app again",
			"reason", f.reason)
		s.refs.mark(ctx, d)
		if err := d.m.NakWithDelay(s.o.BackoffMax); err != nil {
			s.log.Warn("cannot NAK the original of a reference dead letter", "subject", l.Subject, "error", err)
		}
	} else if err := d.m.TermWithReason(f.reason); err != nil {
		// The dead letter is stored; if the original comes back, its dead
		// letter's Nats-Msg-Id keeps the DLQ from storing it twice.
		s.log.Warn("cannot terminate dead-lettered message", "subject", l.Subject, "error", err)
	}
	s.m.ended[endDeadLetter].Inc()
	if n := s.told(d, endDeadLetter, 0); n > 0 {
		d.log.Info("dead letter lets its key go on", "order_key", d.okey, "waiting", n)
	}
	if errors.Is(err, dlq.ErrDuplicate) {
		// Stored by an earlier delivery: counted then.
		d.log.Debug("dead letter was stored already", "reason", f.reason)
		return true
	}
	s.m.deadLetters.WithLabelValues(f.reason).Inc()
	attrs := []any{"reason", f.reason}
	if f.err != nil {
		attrs = append(attrs, statusAttr(f.err), "error", f.err.Error())
	}
	d.log.Info("dead-lettered", attrs...)
	return true
}

// told tells d's lines of order per key, if its key has one, how d ended
// (the one place they hear it), and gives back what they return; it
// returns how many of its key's messages waited behind d. Settled for good
// (acked, a duplicate, dead-lettered, the original of a stored reference
// dead letter), its key goes on; NAK'd for a retry after delay, its key
// awaits the redelivery, and while the partition is handed on, its key's
// later messages are given back, in stream order, for the next courier;
// given back after the lines were handed on (giveBackMoved), they await it
// as a retried head, should the pin come back.
func (s *settler) told(d *delivery, how endKind, delay time.Duration) int {
	switch how {
	case endSucceeded, endDuplicate, endReferenced, endDeadLetter:
		return d.ord.settled(d.okey, d.oseq)
	case endRetry:
		for _, m := range d.ord.retrying(d.okey, d.oseq, delay) {
			s.giveBack(s.make.message(m), giveBackUnpulled, "its partition is handed to another courier, and an earlier message of its key is retried")
		}
		return 0
	case endGiveBack:
		d.ord.gaveBack(d.okey, d.oseq)
		return 0
	}
	panic(fmt.Sprintf("proxy: order per key cannot hear of a delivery ended as %q (%d)", how, int(how)))
}

func statusAttr(err error) slog.Attr {
	var ae *apphttp.AppError
	if errors.As(err, &ae) && ae.Kind == apphttp.KindStatus {
		return slog.Int("status", ae.Status)
	}
	if errors.As(err, &ae) {
		return slog.String("status", ae.Kind.String())
	}
	return slog.String("status", "error")
}
