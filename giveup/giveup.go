// Package giveup catches the messages JetStream gave up on outside courier's
// sight. When a message reaches its consumer's MaxDeliver without an ack
// (courier killed on every attempt, the ack wait expiring each time), the
// server stops delivering it, leaves it in the stream and announces it once
// with a max-deliveries advisory, a plain core-NATS publish that reaches only
// whoever listens at that moment. A Catcher captures those advisories in a
// stream, consumes them durably (so one fired while courier was down is
// handled after it starts), fetches each message by sequence and
// dead-letters it as dlq.ReasonMaxDeliveries; on a work-queue stream it then
// removes the original, as a Term would have
// (docs/behaviour.md#messages-jetstream-gave-up-on-are-dead-lettered). With
// partitions (Options.Origin) it follows every consumer of the work stream,
// and a dead letter names the message the work stream's copy was made of.
package giveup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/retry"
	"github.com/courierhq/courier/internal/verdict"
)

// DeadLetterer stores dead letters; *dlq.Publisher is one. DeadLetter
// reports the outcome as dlq.Publisher.DeadLetter does: nil once stored
// with the body; dlq.ErrDuplicate when stored already (not counted again);
// dlq.ErrBodyOmitted when stored as a reference dead letter, whose original
// must then stay in its stream; any other error when nothing is stored. It
// must be safe for concurrent use.
type DeadLetterer interface {
	DeadLetter(ctx context.Context, l dlq.Letter) error
}

// Dedup tells what the delivery loop's dedup store holds for an
// idempotency key without claiming it: verdict.Processed (recorded),
// verdict.Claimed (a delivery of it is under way, on this replica or
// another), verdict.New (neither). *dedup.Store, *dedup.Shared and their
// scopes are ones (Peek). It must be safe for concurrent use.
type Dedup interface {
	Peek(ctx context.Context, key string) (verdict.Verdict, error)
}

// Results of handling an advisory, the values of the result label of
// courier_giveup_advisories_total.
const (
	// ResultDeadLettered: the message's dead letter was stored.
	ResultDeadLettered = "dead_lettered"
	// ResultDuplicate: the dead letter was stored already (by another
	// replica, the delivery loop, or an earlier try), and the DLQ stream
	// said so, or Options.ReferenceStored did.
	ResultDuplicate = "duplicate"
	// ResultGone: the message was no longer in the stream (deleted,
	// expired, or the stream created again since): nothing to dead-letter.
	ResultGone = "gone"
	// ResultMalformed: the advisory could not be understood; it was
	// terminated.
	ResultMalformed = "malformed"
	// ResultRetry: fetching the message or storing its dead letter failed,
	// or the delivery loop (Options.Delivering), or another replica's
	// (Options.Dedup), is still delivering the message; the advisory was
	// NAK'd and comes back.
	ResultRetry = "retry"
	// ResultRefused: the consumer's state on the server says it did not
	// give up on the message the advisory names (it never delivered it,
	// or it is not of its filter, or it has no delivery limit): the
	// advisory was not the server's. It was terminated and nothing
	// dead-lettered.
	ResultRefused = "refused"
	// ResultProcessed: the message's idempotency key is recorded in the
	// dedup store (Options.Dedup): courier processed it, and nothing is
	// dead-lettered. Either the advisory is not the server's, or the
	// message's ack was lost after it was processed. The advisory was
	// acked and the message, on a work-queue stream, removed, as its ack
	// would have.
	ResultProcessed = "processed"
)

// maxDeleteTries bounds how often an advisory is handled again because the
// original could not be removed from a work-queue stream after its dead
// letter was stored (or it was found processed). The tries fall well within
// the DLQ's duplicate window, so they store no second dead letter; after
// them the original is left for an operator (the dead letter is safe).
const maxDeleteTries = 5

// Catcher consumes the captured max-deliveries advisories of one durable
// consumer and dead-letters the messages they name. Create it with New, call
// Setup until it succeeds, then Run once. Replicas of courier share the work
// through one durable consumer on the advisory stream, and the dead letter's
// Nats-Msg-Id (dlq.MsgID) keeps an advisory handled twice from storing two.
type Catcher struct {
	js       jetstream.JetStream
	stream   jetstream.Stream
	info     *jetstream.StreamInfo // the source stream, as given to New
	consumer string
	dl       DeadLetterer
	o        Options
	log      *slog.Logger
	handled  *prometheus.CounterVec

	mu      sync.Mutex
	cons    jetstream.Consumer // set by Setup
	capture string             // advisory stream's name, set by Setup
	durable string             // advisory consumer's name, set by Setup
	running bool
}

// New returns a Catcher for the durable consumer named consumer on stream,
// the source stream handle the delivery loop uses: its CachedInfo supplies the
// stream's name, creation time (part of every dead letter's Nats-Msg-Id, so
// it must be the value the delivery loop uses) and retention. dl stores the
// dead letters. New does no I/O; it registers the metrics on o.Registerer.
// Invalid options are an error naming the field.
func New(js jetstream.JetStream, stream jetstream.Stream, consumer string, dl DeadLetterer, o Options) (*Catcher, error) {
	if js == nil || stream == nil || dl == nil || consumer == "" {
		return nil, errors.New("giveup: JetStream, stream, consumer and dead-letterer are required")
	}
	if (consumer == AllConsumers) != (o.Origin != nil && o.Origin.Stream != nil) {
		return nil, errors.New("giveup: AllConsumers goes with Options.Origin (a work stream), and only with it")
	}
	info := stream.CachedInfo()
	if info == nil || info.Config.Name == "" {
		return nil, errors.New("giveup: the stream handle carries no info")
	}
	if err := o.defaults(); err != nil {
		return nil, err
	}
	handled := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "courier_giveup_advisories_total",
		Help: "Max-deliveries advisories (JetStream gave up on a message) handled, by result: dead_lettered, duplicate (dead letter already stored), gone (message no longer in the stream), malformed (terminated), retry (NAK'd, comes back: a step failed, or the message is still being delivered), refused (the consumer's state says it did not give up on the message: terminated), processed (the dedup store records the message processed: nothing dead-lettered).",
	}, []string{"result"})
	for _, r := range []string{ResultDeadLettered, ResultDuplicate, ResultGone, ResultMalformed, ResultRetry, ResultRefused, ResultProcessed} {
		handled.WithLabelValues(r)
	}
	if err := o.Registerer.Register(handled); err != nil {
		return nil, fmt.Errorf("giveup: register metrics: %w", err)
	}
	return &Catcher{
		js: js, stream: stream, info: info, consumer: consumer, dl: dl, o: o,
		log:     o.Logger.With("component", "giveup", "stream", info.Config.Name, "consumer", consumer),
		handled: handled,
	}, nil
}

// Setup makes sure a stream captures the consumer's max-deliveries advisories
// (EnsureStream) and creates or updates the durable consumer on it that the
// replicas share. It may be called again after an error; errors wrapping
// ErrUnsuitableStream or ErrCannotCreate will not go away by retrying, others
// (time-outs, a lost connection) may.
func (c *Catcher) Setup(ctx context.Context) error {
	name := c.info.Config.Name
	info, created, err := EnsureStream(ctx, c.js, name, c.consumer, c.o.Replicas, c.o.MaxAge)
	if err != nil {
		return err
	}
	if created {
		c.log.Info("created stream capturing max-deliveries advisories", "advisory_stream", info.Config.Name,
			"subject", AdvisorySubject(name, c.consumer), "replicas", info.Config.Replicas, "max_age", info.Config.MaxAge.String())
	} else {
		warnings, _ := CheckStream(info.Config)
		for _, w := range warnings {
			c.log.Warn("advisory stream may drop max-deliveries advisories", "advisory_stream", info.Config.Name, "warning", w)
		}
	}
	durable, err := c.durableName(ctx, info.Config.Name)
	if err != nil {
		return err
	}
	cons, err := ensureConsumer(ctx, c.js, info.Config.Name, consumerConfig(durable, name, c.consumer, c.o.AckWait))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.cons, c.capture, c.durable = cons, info.Config.Name, durable
	c.mu.Unlock()
	return nil
}

// durableName returns the name of the advisory consumer in the stream named
// capture: ConsumerName in the stream courier creates; in another,
// SharedConsumerName, unless a consumer named ConsumerName there already
// filters this consumer's advisories (set up before the names differed),
// which is kept so that it does not replay what it has handled.
func (c *Catcher) durableName(ctx context.Context, capture string) (string, error) {
	stream := c.info.Config.Name
	legacy := ConsumerName(c.consumer)
	if capture == StreamName(stream, c.consumer) {
		return legacy, nil
	}
	cons, err := c.js.Consumer(ctx, capture, legacy)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
	case err != nil:
		return "", fmt.Errorf("giveup: look up consumer %q on stream %q: %w", legacy, capture, err)
	default:
		cfg := cons.CachedInfo().Config
		if cfg.FilterSubject == AdvisorySubject(stream, c.consumer) && len(cfg.FilterSubjects) == 0 {
			return legacy, nil
		}
	}
	return SharedConsumerName(stream, c.consumer), nil
}

// Run consumes advisories until ctx ends; Setup must have succeeded. Each
// advisory is handled to its end (a step of it takes at most StepTimeout)
// before Run returns; advisories fetched but not started are NAK'd so another
// replica takes them at once. Run returns nil when ctx ends, and an error only
// when misused (before Setup, or called twice). Losing the server or the
// consumer is logged and retried, re-creating the consumer if needed.
func (c *Catcher) Run(ctx context.Context) error {
	c.mu.Lock()
	cons, capture, durable, running := c.cons, c.capture, c.durable, c.running
	if cons != nil {
		c.running = true
	}
	c.mu.Unlock()
	if cons == nil {
		return errors.New("giveup: Run before Setup succeeded")
	}
	if running {
		return errors.New("giveup: Run called twice")
	}
	c.log.Info("catching max-deliveries advisories", "advisory_stream", capture, "advisory_consumer", durable)

	// Losing the server or the consumer ends consume with an error: wait,
	// create the consumer again (it may have been deleted) and go on. A
	// consume that had been working for a while starts a fresh schedule.
	policy := retry.Policy{Initial: 100 * time.Millisecond, Max: 10 * time.Second}
	failed := false
	op := func(ctx context.Context) error {
		if failed {
			sctx, cancel := context.WithTimeout(ctx, c.o.StepTimeout)
			again, err := ensureConsumer(sctx, c.js, capture, consumerConfig(durable, c.info.Config.Name, c.consumer, c.o.AckWait))
			cancel()
			if err != nil {
				return fmt.Errorf("cannot re-create the advisory consumer: %w", err)
			}
			cons, failed = again, false
		}
		began := time.Now()
		err := c.consume(ctx, cons)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		failed = true
		if time.Since(began) > time.Minute {
			return retry.Permanent(err)
		}
		return err
	}
	notify := func(err error, wait time.Duration) {
		c.log.Warn("consuming advisories failed; retrying", "error", err, "in", wait.String())
	}
	for ctx.Err() == nil {
		if err := retry.Do(ctx, policy, op, notify); err != nil && ctx.Err() == nil {
			c.log.Warn("consuming advisories failed after working a while; retrying", "error", err)
		}
	}
	return nil
}

// consume handles advisories from one message iterator until ctx ends (nil)
// or the iterator fails (its error).
func (c *Catcher) consume(ctx context.Context, cons jetstream.Consumer) error {
	// One advisory at a time, a buffer of one: the replicas share the
	// advisories rather than one holding them all.
	it, err := cons.Messages(jetstream.PullMaxMessages(1))
	if err != nil {
		return fmt.Errorf("giveup: start consuming advisories: %w", err)
	}
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			if m != nil {
				c.release(m)
			}
			break
		}
		if err != nil {
			it.Stop()
			return fmt.Errorf("giveup: next advisory: %w", err)
		}
		c.handle(ctx, m)
	}
	// Stopping: what was fetched but not handled goes back at once.
	it.Drain()
	for {
		m, err := it.Next(jetstream.NextMaxWait(time.Second))
		if err != nil {
			it.Stop()
			return nil
		}
		c.release(m)
	}
}

// release NAKs an advisory without delay so another replica handles it.
func (c *Catcher) release(m jetstream.Msg) {
	if err := m.Nak(); err != nil {
		c.log.Debug("cannot NAK advisory at shutdown; it comes back after the ack wait", "error", err)
	}
}
