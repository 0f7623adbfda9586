package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/retry"
)

// Settling: every delivery ends here, in exactly one of an ack after a 2xx
// (acked), an ack of a duplicate (ackDuplicate), a NAK with a delay (nak), a
// dead letter stored and the original terminated (deadLetter), or a message
// given back without delay at shutdown (giveBack, release).

// acked acks a message the app answered 2xx (its key recorded, if dedup is
// on), and ends its flight.
func (r *Runner) acked(d *delivery, took time.Duration) {
	r.track.remove(d.m)
	if err := d.m.Ack(); err != nil {
		d.log.Warn("ack failed; the message comes back and is recognised as a duplicate", "error", err)
	}
	if d.fl != nil {
		r.flights.finish(d.skey, d.fl, true)
	}
	r.orderSettled(d)
	r.m.delivered.Inc()
	if d.log.enabled(slog.LevelDebug) {
		d.log.Debug("delivered", "status", "2xx", "took", took.Round(time.Microsecond).String())
	}
}

// ackDuplicate acks a message whose key was already processed.
func (r *Runner) ackDuplicate(d *delivery) {
	r.track.remove(d.m)
	if err := d.m.Ack(); err != nil {
		d.log.Warn("cannot ack duplicate; it comes back and is recognised again", "error", err)
	}
	r.orderSettled(d)
	r.m.duplicate.Inc()
	d.log.Debug("duplicate acked without calling the app")
}

// retryDelay is the app's Retry-After, capped, else full-jitter backoff at
// JetStream's delivery count.
func (r *Runner) retryDelay(err error, attempt int) (time.Duration, bool) {
	var ae *apphttp.AppError
	if errors.As(err, &ae) && ae.RetryAfter != "" {
		if d, ok := apphttp.RetryAfter(ae.RetryAfter, r.o.Now(), r.o.RetryAfterMax); ok {
			return d, true
		}
	}
	return Delay(attempt, r.o.BackoffInitial, r.o.BackoffMax, r.o.BackoffMultiplier, rand.Int64N), false
}

// retryAfterOf is the app's Retry-After of a failed request, if any.
func retryAfterOf(err error) string {
	var ae *apphttp.AppError
	if errors.As(err, &ae) {
		return ae.RetryAfter
	}
	return ""
}

// nak gives m back for redelivery after delay.
func (r *Runner) nak(m jetstream.Msg, delay time.Duration) {
	r.track.remove(m)
	var err error
	if delay > 0 {
		err = m.NakWithDelay(delay)
	} else {
		err = m.Nak()
	}
	if err != nil {
		r.log.Warn("NAK failed; the message comes back after the ack wait", "subject", m.Subject(), "error", err)
	}
	r.m.retried.Inc()
	r.m.retryDelay.Observe(delay.Seconds())
}

// giveBack returns a message courier will not start or finish, once fetching
// has stopped (a NAK'd message could otherwise come straight back to the
// open pull and spend another delivery). A NAK spends the delivery: on the
// message's last allowed one JetStream would give up on it without the app
// having seen it, so such a message is dead-lettered instead, saying so.
func (r *Runner) giveBack(d *delivery, why string) {
	<-r.ph.fetched.Done()
	r.giveBackDelivery(d, why)
}

// giveBackDelivery is giveBack once no pull can bring the message back.
func (r *Runner) giveBackDelivery(d *delivery, why string) {
	if !d.last(r.o.MaxDeliver) {
		r.release(d.m, why)
		return
	}
	reason := dlq.ReasonNotAttempted
	if r.gate.isHeld(causeApp) {
		reason = dlq.ReasonAppUnavailable
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ph.stopping), 5*time.Second)
	defer cancel()
	if r.deadLetterOnce(ctx, d, failure{reason: reason,
		err: fmt.Errorf("not sent to the app: %s, on the message's last allowed delivery", why)}) {
		return
	}
	r.release(d.m, why)
}

// giveBackMsg is giveBack for a message no worker has started, with its
// metadata as m.Metadata returned it.
func (r *Runner) giveBackMsg(m jetstream.Msg, meta *jetstream.MsgMetadata, err error, why string) {
	if err != nil {
		<-r.ph.fetched.Done()
		r.release(m, why)
		return
	}
	r.giveBack(r.newDelivery(m, meta, r.ph.lane0(), r.ph.noStart), why)
}

// giveBackNow is giveBackMsg for a message of a partition that no longer
// fetches (partition.go): nothing waits for the last pull.
func (r *Runner) giveBackNow(m jetstream.Msg, meta *jetstream.MsgMetadata, err error, why string) {
	if err != nil {
		r.release(m, why)
		return
	}
	r.giveBackDelivery(r.newDelivery(m, meta, r.ph.lane0(), r.ph.noStart), why)
}

// release NAKs m without delay so another instance can take it at once.
func (r *Runner) release(m jetstream.Msg, why string) {
	r.track.remove(m)
	if err := m.Nak(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		r.log.Warn("cannot NAK message; it comes back after the ack wait", "subject", m.Subject(), "error", err)
	}
	r.m.released.Inc()
	r.released.Add(1)
	r.log.Debug("message released", "subject", m.Subject(), "why", why)
}

// failure is why a message is dead-lettered.
type failure struct {
	reason string
	err    error
}

// deadLetter stores the message's dead letter, then terminates it. If the
// dead letter cannot be stored, the message is held in progress and the
// store is retried in the background, so that a dead-letter stream that
// refuses letters does not take the worker; at shutdown it is released
// instead, never dropped.
func (r *Runner) deadLetter(d *delivery, f failure) {
	// Not bounded by the grace period: a dead letter due at shutdown (a
	// request abandoned on its last delivery) is still stored.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ph.requests), 10*time.Second)
	ok := r.deadLetterOnce(ctx, d, f)
	cancel()
	if ok {
		return
	}
	r.inBackground(&r.pendingDL, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if r.deadLetterOnce(ctx, d, f) {
			return nil
		}
		return errors.New("not stored")
	}, nil, func() { r.release(d.m, "shutting down before its dead letter could be stored") })
}

// backgroundRetry is the schedule on which a dead letter or a success
// record that could not be stored is tried again, in the background, while
// its message is held.
var backgroundRetry = retry.Policy{Initial: 200 * time.Millisecond, Max: 30 * time.Second}

// inBackground tries store again on backgroundRetry while the message is
// held (pending counts it, for /readyz), until it succeeds (then stored runs,
// if not nil) or courier stops fetching (then gaveUp runs). Run waits for it
// (background) before it hands the last deliveries to the recorder.
func (r *Runner) inBackground(pending *atomic.Int64, store func(context.Context) error, stored, gaveUp func()) {
	pending.Add(1)
	r.background.Add(1)
	go func() {
		defer r.background.Done()
		defer pending.Add(-1)
		if retry.Do(r.ph.fetched, backgroundRetry, store, nil) != nil {
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
func (r *Runner) deadLetterOnce(ctx context.Context, d *delivery, f failure) bool {
	if ok, _ := r.marked(ctx, d); ok {
		r.giveBackReferenced(d)
		return true
	}
	l := dlq.Letter{
		Subject: d.m.Subject(), Data: d.m.Data(), Header: d.m.Headers(),
		Stream: d.meta.Stream, StreamCreated: r.o.StreamCreated, Sequence: d.meta.Sequence.Stream,
		Published: d.meta.Timestamp, Consumer: r.o.Consumer,
		Reason: f.reason, Attempts: d.attempt, FailedAt: r.o.Now(),
		OrderKey: d.okey,
	}
	if d.okey != "" && d.ord != nil {
		l.OrderWaiting = d.ord.waitingBehind(d.okey)
	}
	if f.err != nil {
		l.Error = f.err.Error()
		var ae *apphttp.AppError
		if errors.As(f.err, &ae) {
			l.Status = ae.Status
		}
	}
	err := r.dl.DeadLetter(ctx, l)
	if !dlq.Stored(err) {
		r.m.dlqErrors.Inc()
		r.dlqErr.Store(&err)
		r.log.Error("cannot store dead letter; message kept and tried again",
			"subject", l.Subject, "seq", l.Sequence, "reason", f.reason, "error", err)
		return false
	}
	r.track.remove(d.m)
	if errors.Is(err, dlq.ErrBodyOmitted) && !r.o.TermKeepsMessage {
		// The dead letter refers to the original, too large to copy: a
		// Term would remove it from a work-queue or interest stream. It is
		// marked (references.go) and given back with a long delay until
		// JetStream's budget is spent, after which JetStream keeps it in
		// the stream; its redeliveries are given back unsent.
		d.log.Warn("dead letter stored without the body (too large to copy); the original stays in its stream, not terminated, and is not sent to the app again",
			"reason", f.reason)
		r.markReference(ctx, d)
		if err := d.m.NakWithDelay(r.o.BackoffMax); err != nil {
			r.log.Warn("cannot NAK the original of a reference dead letter", "subject", l.Subject, "error", err)
		}
	} else if err := d.m.TermWithReason(f.reason); err != nil {
		// The dead letter is stored; if the original comes back, its dead
		// letter's Nats-Msg-Id keeps the DLQ from storing it twice.
		r.log.Warn("cannot terminate dead-lettered message", "subject", l.Subject, "error", err)
	}
	r.m.deadLettered.Inc()
	if n := r.orderSettled(d); n > 0 {
		d.log.Info("dead letter lets its key go on", "order_key", d.okey, "waiting", n)
	}
	if errors.Is(err, dlq.ErrDuplicate) {
		// Stored by an earlier delivery: counted then.
		d.log.Debug("dead letter was stored already", "reason", f.reason)
		return true
	}
	r.m.deadLetters.WithLabelValues(f.reason).Inc()
	attrs := []any{"reason", f.reason}
	if f.err != nil {
		attrs = append(attrs, statusAttr(f.err), "error", f.err.Error())
	}
	d.log.Info("dead-lettered", attrs...)
	return true
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
