package giveup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/internal/natshdr"
	"github.com/courierhq/courier/internal/verdict"
)

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
	case a.Stream != c.info.Config.Name || a.Consumer != c.consumer && c.consumer != AllConsumers:
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

	orig, ok := c.fetchOriginal(work, m, a, tries, log)
	if !ok || c.refused(work, m, a, orig, tries, log) || c.notGivenUp(work, m, a, orig, tries, log) ||
		c.settledAsReference(work, m, a, orig, tries, log) {
		return
	}
	c.deadLetter(work, m, a, orig, tries, log)
}

// refused checks the advisory against the consumer's state (verify); it
// reports true when it terminated the advisory as one the server did not
// send, or NAK'd it because the state could not be read.
func (c *Catcher) refused(work context.Context, m jetstream.Msg, a advisory, orig *jetstream.RawStreamMsg, tries int, log *slog.Logger) bool {
	err := c.verify(work, a, orig)
	var r *refusal
	switch {
	case err == nil:
		return false
	case errors.As(err, &r):
		log.Error("max-deliveries advisory refused: the consumer's state on the server says it did not give up on that message (an advisory not sent by the server, on a subject others may publish to); nothing dead-lettered, advisory terminated",
			"why", r.why, "subject", m.Subject(), "consumer", a.Consumer)
		if err := m.TermWithReason("courier: advisory refused: " + r.why); err != nil {
			log.Warn("cannot terminate refused advisory", "error", err)
		}
		c.count(ResultRefused)
	default:
		log.Error("cannot check the max-deliveries advisory against the consumer's state; advisory handled again later", "error", err)
		c.retry(m, tries, log)
	}
	return true
}

// notGivenUp checks the advisory against what courier itself holds of the
// message (ownState); it reports true when it settled the advisory because
// the message was processed, or NAK'd it because the message is still
// being delivered or the dedup store could not answer.
func (c *Catcher) notGivenUp(work context.Context, m jetstream.Msg, a advisory, orig *jetstream.RawStreamMsg, tries int, log *slog.Logger) bool {
	v, by, err := c.ownState(work, a, orig)
	if err != nil {
		log.Error("cannot ask the dedup store whether the message JetStream is said to have given up on was processed; advisory handled again later", "error", err)
		c.retry(m, tries, log)
		return true
	}
	switch v {
	case verdict.New:
		return false
	case verdict.Claimed:
		log.Info("the message JetStream is said to have given up on is still being delivered: advisory handled again later", "by", by)
		c.retry(m, tries, log)
	case verdict.Processed:
		log.Warn("max-deliveries advisory of a message courier processed (its idempotency key is recorded in the dedup store): nothing dead-lettered, advisory acked; either the advisory is not the server's or the message's ack was lost",
			"subject", orig.Subject, "consumer", a.Consumer)
		if !c.removeOriginal(work, a.StreamSeq, tries, "processed", log) {
			c.retry(m, tries, log)
			return true
		}
		c.settle(work, m, ResultProcessed, log)
	default:
		log.Error("the dedup store gave an answer the catch does not know; advisory handled again later", "verdict", v.String())
		c.retry(m, tries, log)
	}
	return true
}

// fetchOriginal fetches the message the advisory names. When it cannot go on
// (the message is gone, or fetching it failed), it settles or NAKs the
// advisory itself and reports false.
func (c *Catcher) fetchOriginal(work context.Context, m jetstream.Msg, a advisory, tries int, log *slog.Logger) (*jetstream.RawStreamMsg, bool) {
	sctx, cancel := context.WithTimeout(work, c.o.StepTimeout)
	orig, err := c.stream.GetMsg(sctx, a.StreamSeq)
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		log.Warn("JetStream gave up on a message that is no longer in the stream (deleted or expired): nothing to dead-letter")
		c.settle(work, m, ResultGone, log)
		return nil, false
	case err != nil:
		log.Error("cannot fetch the message JetStream gave up on; advisory handled again later", "error", err)
		c.retry(m, tries, log)
		return nil, false
	}
	if !a.Time.IsZero() && orig.Time.After(a.Time) {
		// Stored after the advisory fired: the stream was deleted and
		// created again, and this sequence is another message.
		log.Warn("the message JetStream gave up on is no longer in the stream (it was created again since): nothing to dead-letter",
			"stored", orig.Time, "advisory_time", a.Time)
		c.settle(work, m, ResultGone, log)
		return nil, false
	}
	return orig, true
}

// settledAsReference asks Options.ReferenceStored whether the original is
// that of a reference dead letter stored before; it reports true when it
// settled the advisory for that reason, or NAK'd it because it could not tell.
func (c *Catcher) settledAsReference(work context.Context, m jetstream.Msg, a advisory, orig *jetstream.RawStreamMsg, tries int, log *slog.Logger) bool {
	if c.o.ReferenceStored == nil {
		return false
	}
	sctx, cancel := context.WithTimeout(work, c.o.StepTimeout)
	ref, err := c.o.ReferenceStored(sctx, c.originSeq(orig, a.StreamSeq))
	cancel()
	switch {
	case err != nil:
		log.Error("cannot tell whether the delivery loop stored a reference dead letter of the message JetStream gave up on; advisory handled again later",
			"error", err)
		c.retry(m, tries, log)
		return true
	case ref:
		log.Info("JetStream gave up on the original of a reference dead letter stored before: no second dead letter; the original is left in its stream, where replay reads it",
			"subject", orig.Subject)
		c.settle(work, m, ResultDuplicate, log)
		return true
	}
	return false
}

// deadLetter stores the original's dead letter, removes the original from a
// work-queue stream, and settles the advisory (NAKs it when either failed).
func (c *Catcher) deadLetter(work context.Context, m jetstream.Msg, a advisory, orig *jetstream.RawStreamMsg, tries int, log *slog.Logger) {
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
	if c.o.Origin != nil {
		c.asOrigin(&letter)
	}
	if letter.FailedAt.IsZero() {
		letter.FailedAt = c.o.Now()
	}
	sctx, cancel := context.WithTimeout(work, c.o.StepTimeout)
	err := c.dl.DeadLetter(sctx, letter)
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

	if reference && c.o.Origin == nil {
		// The dead letter refers to the original for its body: it must
		// stay, even in a work-queue stream.
		log.Warn("dead letter stored without the original's body (too large with its envelope); the original is left in its stream, where replay reads it",
			"size", len(orig.Data))
	} else if !c.removeOriginal(work, a.StreamSeq, tries, "dead-lettered", log) {
		c.retry(m, tries, log)
		return
	}
	log.Info("dead-lettered a message JetStream gave up on", "reason", dlq.ReasonMaxDeliveries, "duplicate", duplicate)
	if !duplicate && c.o.OnDeadLetter != nil {
		c.o.OnDeadLetter()
	}
	c.settle(work, m, result, log)
}

// removeOriginal removes the original, dead-lettered or processed (what),
// from a work-queue stream, as a Term or an ack would have; on other
// streams it leaves it. It reports false when the advisory should be
// handled again to try once more.
func (c *Catcher) removeOriginal(ctx context.Context, seq uint64, tries int, what string, log *slog.Logger) bool {
	log = log.With("original", what)
	cfg := c.info.Config
	switch cfg.Retention {
	case jetstream.InterestPolicy:
		log.Info("original left in its interest-retention stream: other consumers may still need it")
		return true
	case jetstream.WorkQueuePolicy:
	default:
		log.Debug("original left in its limits-retention stream")
		return true
	}
	if cfg.DenyDelete {
		log.Warn("original left in its work-queue stream, which denies deletes: remove it by hand",
			"how", fmt.Sprintf("nats stream rmm %s %d", cfg.Name, seq))
		return true
	}
	sctx, cancel := context.WithTimeout(ctx, c.o.StepTimeout)
	err := c.stream.DeleteMsg(sctx, seq)
	cancel()
	if err == nil {
		log.Info("original removed from its work-queue stream")
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
		log.Warn("cannot remove the original from its work-queue stream; trying again", "error", err)
		return false
	}
	log.Error("cannot remove the original from its work-queue stream; giving up (its dead letter is stored, or it was processed): remove it by hand",
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

// asOrigin makes l, the dead letter of a message of the work stream, that
// of the message it copies (Options.Origin): its subject, stream and
// sequence, without the header that named them.
func (c *Catcher) asOrigin(l *dlq.Letter) {
	o := c.o.Origin
	l.Stream, l.StreamCreated, l.Consumer = o.Stream.Config.Name, o.Stream.Created, o.Consumer
	if stream, seq, subject, ok := natshdr.Source(l.Header); ok {
		l.Stream, l.Sequence, l.Subject = stream, seq, subject
	}
	delete(l.Header, natshdr.SourceHeader)
}

// originSeq is the sequence ReferenceStored is asked of for orig: the
// original's, for a copy (Options.Origin).
func (c *Catcher) originSeq(orig *jetstream.RawStreamMsg, seq uint64) uint64 {
	if c.o.Origin == nil {
		return seq
	}
	if _, s, _, ok := natshdr.Source(orig.Header); ok {
		return s
	}
	return seq
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
