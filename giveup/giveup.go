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
// (docs/behaviour.md#messages-jetstream-gave-up-on-are-dead-lettered).
package giveup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/internal/retry"
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

// Options configures a Catcher. Zero values take the documented defaults;
// negative durations or counts are refused by New.
type Options struct {
	// Replicas is the replica count of the advisory stream, when courier
	// creates it (COURIER_STREAM_REPLICAS). Default 1.
	Replicas int
	// MaxAge bounds how long the advisory stream courier creates keeps
	// advisories. Default DefaultMaxAge (7 days).
	MaxAge time.Duration
	// AckWait is the ack wait of the durable consumer on the advisory
	// stream: how long an advisory whose handler vanished waits before
	// another replica gets it. Default 30s.
	AckWait time.Duration
	// RetryInitial and RetryMax bound the delay before an advisory whose
	// dead letter could not be stored is handled again; the delay doubles
	// with each try. Defaults 1s and 1m (RetryInitial when larger); a
	// RetryMax below RetryInitial is refused.
	RetryInitial, RetryMax time.Duration
	// StepTimeout bounds each request to JetStream while an advisory is
	// handled. Default 10s.
	StepTimeout time.Duration
	// Logger receives logs, narrowed with component=giveup; default
	// discards.
	Logger *slog.Logger
	// Registerer receives the metrics; default a private registry.
	Registerer prometheus.Registerer
	// Now is the clock; default time.Now.
	Now func() time.Time
	// OnDeadLetter, when set, is called once for each dead letter the
	// Catcher stores (not for one already stored), so it can be counted
	// with the others.
	OnDeadLetter func()
	// ReferenceStored, when set, reports whether the message at seq of the
	// stream is the original of a reference dead letter the delivery loop
	// stored and left in its stream (proxy.Runner.ReferenceStored). An
	// advisory for such a message is settled as a duplicate: no second
	// dead letter is stored (past the DLQ's duplicate window, the
	// Nats-Msg-Id would no longer stop one) and the original stays where
	// replay reads it. An error means it cannot tell: the advisory is
	// handled again later. Nil: only the DLQ's duplicate window guards. It
	// must be safe for concurrent use.
	ReferenceStored func(ctx context.Context, seq uint64) (bool, error)
}

// defaults fills the zero values of o with the defaults. A negative value,
// or a RetryMax set below RetryInitial, is an error naming the field: it is
// a mistake to report, not to replace silently.
func (o *Options) defaults() error {
	var problems []string
	for _, f := range []struct {
		name string
		neg  bool
	}{
		{"Replicas", o.Replicas < 0},
		{"MaxAge", o.MaxAge < 0},
		{"AckWait", o.AckWait < 0},
		{"RetryInitial", o.RetryInitial < 0},
		{"RetryMax", o.RetryMax < 0},
		{"StepTimeout", o.StepTimeout < 0},
	} {
		if f.neg {
			problems = append(problems, "Options."+f.name+" must not be negative (0 takes the default)")
		}
	}
	if o.RetryMax > 0 && o.RetryInitial > 0 && o.RetryMax < o.RetryInitial {
		problems = append(problems, fmt.Sprintf("Options.RetryMax (%s) must not be less than Options.RetryInitial (%s)", o.RetryMax, o.RetryInitial))
	}
	if len(problems) > 0 {
		return errors.New("giveup: " + strings.Join(problems, "; "))
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.MaxAge == 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.AckWait == 0 {
		o.AckWait = 30 * time.Second
	}
	if o.RetryInitial == 0 {
		o.RetryInitial = time.Second
	}
	if o.RetryMax == 0 {
		o.RetryMax = max(time.Minute, o.RetryInitial)
	}
	if o.StepTimeout == 0 {
		o.StepTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
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
	// ResultRetry: fetching the message or storing its dead letter failed;
	// the advisory was NAK'd and comes back.
	ResultRetry = "retry"
)

// maxDeleteTries bounds how often an advisory is handled again because the
// original could not be removed from a work-queue stream after its dead letter
// was stored. The tries fall well within the DLQ's duplicate window, so they
// store no second dead letter; after them the original is left for an
// operator (the dead letter is safe).
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
	info := stream.CachedInfo()
	if info == nil || info.Config.Name == "" {
		return nil, errors.New("giveup: the stream handle carries no info")
	}
	if err := o.defaults(); err != nil {
		return nil, err
	}
	handled := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "courier_giveup_advisories_total",
		Help: "Max-deliveries advisories (JetStream gave up on a message) handled, by result: dead_lettered, duplicate (dead letter already stored), gone (message no longer in the stream), malformed (terminated), retry (NAK'd, comes back).",
	}, []string{"result"})
	for _, r := range []string{ResultDeadLettered, ResultDuplicate, ResultGone, ResultMalformed, ResultRetry} {
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

// advisory is the part of JetStream's JSConsumerDeliveryExceededAdvisory
// courier reads.
type advisory struct {
	Type       string    `json:"type"`
	ID         string    `json:"id"`
	Time       time.Time `json:"timestamp"`
	Stream     string    `json:"stream"`
	Consumer   string    `json:"consumer"`
	StreamSeq  uint64    `json:"stream_seq"`
	Deliveries uint64    `json:"deliveries"`
}

// parse decodes and checks an advisory for c's consumer.
func (c *Catcher) parse(data []byte) (advisory, error) {
	var a advisory
	if err := json.Unmarshal(data, &a); err != nil {
		return a, fmt.Errorf("not JSON: %w", err)
	}
	switch {
	case a.Type != AdvisoryType:
		return a, fmt.Errorf("type %q, want %q", a.Type, AdvisoryType)
	case a.Stream != c.info.Config.Name || a.Consumer != c.consumer:
		return a, fmt.Errorf("advisory of consumer %q on stream %q, want %q on %q", a.Consumer, a.Stream, c.consumer, c.info.Config.Name)
	case a.StreamSeq == 0:
		return a, errors.New("no stream_seq")
	}
	return a, nil
}

// handle settles one advisory: it is acked once the message it names is
// dead-lettered (and, on a work-queue stream, removed) or known to be gone,
// NAK'd with a delay when that failed, and terminated when malformed.
func (c *Catcher) handle(ctx context.Context, m jetstream.Msg) {
	// A handler that has started finishes (each step bounded) even if ctx
	// ends meanwhile: a half-handled advisory would only come back later.
	work := context.WithoutCancel(ctx)
	tries := 1
	if meta, err := m.Metadata(); err == nil {
		tries = int(meta.NumDelivered)
	}

	a, err := c.parse(m.Data())
	if err != nil {
		c.log.Error("malformed max-deliveries advisory; terminated", "subject", m.Subject(), "error", err, "data", truncate(m.Data(), 512))
		if err := m.TermWithReason("courier: malformed advisory"); err != nil {
			c.log.Warn("cannot terminate malformed advisory", "error", err)
		}
		c.count(ResultMalformed)
		return
	}
	log := c.log.With("seq", a.StreamSeq, "deliveries", a.Deliveries, "advisory", a.ID)

	sctx, cancel := context.WithTimeout(work, c.o.StepTimeout)
	orig, err := c.stream.GetMsg(sctx, a.StreamSeq)
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		log.Warn("JetStream gave up on a message that is no longer in the stream (deleted or expired): nothing to dead-letter")
		c.settle(work, m, ResultGone, log)
		return
	case err != nil:
		log.Error("cannot fetch the message JetStream gave up on; advisory handled again later", "error", err)
		c.retry(m, tries, log)
		return
	}
	if !a.Time.IsZero() && orig.Time.After(a.Time) {
		// Stored after the advisory fired: the stream was deleted and
		// created again, and this sequence is another message.
		log.Warn("the message JetStream gave up on is no longer in the stream (it was created again since): nothing to dead-letter",
			"stored", orig.Time, "advisory_time", a.Time)
		c.settle(work, m, ResultGone, log)
		return
	}

	if c.o.ReferenceStored != nil {
		sctx, cancel = context.WithTimeout(work, c.o.StepTimeout)
		ref, err := c.o.ReferenceStored(sctx, a.StreamSeq)
		cancel()
		switch {
		case err != nil:
			log.Error("cannot tell whether the delivery loop stored a reference dead letter of the message JetStream gave up on; advisory handled again later",
				"error", err)
			c.retry(m, tries, log)
			return
		case ref:
			log.Info("JetStream gave up on the original of a reference dead letter stored before: no second dead letter; the original is left in its stream, where replay reads it",
				"subject", orig.Subject)
			c.settle(work, m, ResultDuplicate, log)
			return
		}
	}

	letter := dlq.Letter{
		Subject:       orig.Subject,
		Data:          orig.Data,
		Header:        stripServerHeaders(orig, c.info.Config.Name),
		Stream:        c.info.Config.Name,
		StreamCreated: c.info.Created,
		Sequence:      a.StreamSeq,
		Published:     orig.Time,
		Consumer:      c.consumer,
		Reason:        dlq.ReasonMaxDeliveries,
		Error:         fmt.Sprintf("JetStream gave up after %d deliveries without an ack (ack wait expired each time)", a.Deliveries),
		Attempts:      int(a.Deliveries),
		FailedAt:      a.Time,
	}
	if letter.FailedAt.IsZero() {
		letter.FailedAt = c.o.Now()
	}
	sctx, cancel = context.WithTimeout(work, c.o.StepTimeout)
	err = c.dl.DeadLetter(sctx, letter)
	cancel()
	if !dlq.Stored(err) {
		log.Error("cannot store the dead letter of a message JetStream gave up on; advisory handled again later",
			"subject", orig.Subject, "error", err)
		c.retry(m, tries, log)
		return
	}
	duplicate, reference := errors.Is(err, dlq.ErrDuplicate), errors.Is(err, dlq.ErrBodyOmitted)
	result := ResultDeadLettered
	if duplicate {
		result = ResultDuplicate
	}
	log = log.With("subject", orig.Subject)

	if reference {
		// The dead letter refers to the original for its body: it must
		// stay, even in a work-queue stream.
		log.Warn("dead letter stored without the original's body (too large with its envelope); the original is left in its stream, where replay reads it",
			"size", len(orig.Data))
	} else if !c.removeOriginal(work, a.StreamSeq, tries, log) {
		c.retry(m, tries, log)
		return
	}
	log.Info("dead-lettered a message JetStream gave up on", "reason", dlq.ReasonMaxDeliveries, "duplicate", duplicate)
	if !duplicate && c.o.OnDeadLetter != nil {
		c.o.OnDeadLetter()
	}
	c.settle(work, m, result, log)
}

// removeOriginal removes the dead-lettered original from a work-queue
// stream, as a Term would have; on other streams it leaves it. It reports
// false when the advisory should be handled again to try once more.
func (c *Catcher) removeOriginal(ctx context.Context, seq uint64, tries int, log *slog.Logger) bool {
	cfg := c.info.Config
	switch cfg.Retention {
	case jetstream.InterestPolicy:
		log.Info("dead-lettered original left in its interest-retention stream: other consumers may still need it")
		return true
	case jetstream.WorkQueuePolicy:
	default:
		log.Debug("dead-lettered original left in its limits-retention stream")
		return true
	}
	if cfg.DenyDelete {
		log.Warn("dead-lettered original left in its work-queue stream, which denies deletes: remove it by hand",
			"how", fmt.Sprintf("nats stream rmm %s %d", cfg.Name, seq))
		return true
	}
	sctx, cancel := context.WithTimeout(ctx, c.o.StepTimeout)
	err := c.stream.DeleteMsg(sctx, seq)
	cancel()
	if err == nil {
		log.Info("dead-lettered original removed from its work-queue stream")
		return true
	}
	// Gone already (another replica removed it)? nats.go reports a delete
	// of a missing message only as text, so ask.
	sctx, cancel = context.WithTimeout(ctx, c.o.StepTimeout)
	_, gerr := c.stream.GetMsg(sctx, seq)
	cancel()
	if errors.Is(gerr, jetstream.ErrMsgNotFound) {
		return true
	}
	if tries < maxDeleteTries {
		log.Warn("cannot remove the dead-lettered original from its work-queue stream; trying again", "error", err)
		return false
	}
	log.Error("cannot remove the dead-lettered original from its work-queue stream; giving up (the dead letter is stored): remove it by hand",
		"error", err, "how", fmt.Sprintf("nats stream rmm %s %d", cfg.Name, seq))
	return true
}

// settle acks a handled advisory, waiting for the server's confirmation so
// that it does not come back.
func (c *Catcher) settle(ctx context.Context, m jetstream.Msg, result string, log *slog.Logger) {
	sctx, cancel := context.WithTimeout(ctx, c.o.StepTimeout)
	defer cancel()
	if err := m.DoubleAck(sctx); err != nil {
		c.mu.Lock()
		acks := "$JS.ACK." + c.capture + "."
		c.mu.Unlock()
		if perr := jsutil.PermissionDenied(c.js, err, acks); perr != nil {
			// Every advisory would come back for ever: say what to grant.
			log.Error("no permission to ack advisories: grant courier's user publish to "+acks+">", "error", perr)
		} else {
			// It comes back after the ack wait and is handled again: the
			// dead letter's Nats-Msg-Id stores it once.
			log.Warn("cannot ack handled advisory; it comes back and is handled again", "error", err)
		}
	}
	c.count(result)
}

// retry NAKs an advisory with a delay doubling with each try.
func (c *Catcher) retry(m jetstream.Msg, tries int, log *slog.Logger) {
	// JetStream's delivery count is the one counter: the delay is computed
	// from it, and the advisory waits on the server, not here.
	delay := c.o.RetryMax
	if shift := max(tries-1, 0); shift < 63 && c.o.RetryInitial <= c.o.RetryMax>>shift {
		delay = c.o.RetryInitial << shift
	}
	if err := m.NakWithDelay(delay); err != nil {
		log.Warn("cannot NAK advisory; it comes back after the ack wait", "error", err)
	}
	log.Debug("advisory NAK'd", "delay", delay.String(), "tries", tries)
	c.count(ResultRetry)
}

func (c *Catcher) count(result string) {
	c.handled.WithLabelValues(result).Inc()
}

// stripServerHeaders returns the headers of m as its publisher stored them,
// without those the server added to the answer of a direct get (appended
// after the stored ones): for each, the last value is removed when it is the
// one the server would have set, so that an original that carried such a
// header itself (a republished message) keeps it.
func stripServerHeaders(m *jetstream.RawStreamMsg, stream string) nats.Header {
	if len(m.Header) == 0 {
		return nil
	}
	h := make(nats.Header, len(m.Header))
	for k, v := range m.Header {
		h[k] = append([]string(nil), v...)
	}
	added := []struct{ name, value string }{
		{jetstream.StreamHeader, stream},
		{jetstream.SubjectHeader, m.Subject},
		{jetstream.SequenceHeader, strconv.FormatUint(m.Sequence, 10)},
		{jetstream.TimeStampHeaer, m.Time.UTC().Format(time.RFC3339Nano)},
	}
	for _, a := range added {
		name := a.name
		values := h[name]
		if len(values) == 0 || values[len(values)-1] != a.value {
			continue
		}
		if len(values) == 1 {
			delete(h, name)
		} else {
			h[name] = values[:len(values)-1]
		}
	}
	if len(h) == 0 {
		return nil
	}
	return h
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
}
