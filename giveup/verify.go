package giveup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natshdr"
	"github.com/courierhq/courier/internal/subject"
	"github.com/courierhq/courier/internal/verdict"
	"github.com/courierhq/courier/proxy"
)

// An advisory is a plain publish on a subject: whoever may publish there
// can write one, and nothing in it tells the server's from another's. So
// before a message is dead-lettered for it, what it claims is checked,
// first against the consumer's state as the server reports it, which no
// publisher writes (verify): the consumer exists and has a delivery limit
// (one without never gives up), it has delivered the message's sequence,
// and the message is one of its filter subjects'. A message the server
// gave up on passes every check; a forged advisory naming a message the
// consumer never delivered (its backlog, another consumer's) fails one.
//
// The server reports no more: not whether a message it delivered is still
// out (in flight, waiting out a backoff) or was acked; giving up, it may
// move the ack floor past the message as an ack does (nats-server
// consumer.go, hasMaxDeliveries). So the advisory is then checked against
// what courier itself holds of the message (ownState): one the delivery
// loop is still delivering (in progress, or awaited as its key's head), or
// whose key a delivery claims in the shared dedup store, is not given up
// on: its advisory is handled again later and checked anew then. One whose
// idempotency key the dedup store records was processed: no dead letter.
// What remains unproven is in docs/threat-model.md#advisories: a message
// another replica, or this one without order per key, NAK'd to retry later
// (no claim is held meanwhile), and one processed with dedup off or longer
// ago than the dedup TTL.

// refusal says why an advisory was refused, for the log.
type refusal struct{ why string }

func (r *refusal) Error() string { return r.why }

// verify checks advisory a, whose message is orig, against the consumer's
// state on the server. It returns a *refusal when the consumer cannot have
// given up on the message, another error when the state could not be read
// (the advisory is handled again later), nil when it may have.
func (c *Catcher) verify(ctx context.Context, a advisory, orig *jetstream.RawStreamMsg) error {
	sctx, cancel := context.WithTimeout(ctx, c.o.StepTimeout)
	defer cancel()
	stream := c.info.Config.Name
	cons, err := c.js.Consumer(sctx, stream, a.Consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return &refusal{fmt.Sprintf("stream %s has no consumer %q", stream, a.Consumer)}
	}
	if err != nil {
		return fmt.Errorf("read consumer %q of stream %s: %w", a.Consumer, stream, err)
	}
	info := cons.CachedInfo()
	cfg := info.Config
	switch {
	case cfg.MaxDeliver <= 0:
		return &refusal{fmt.Sprintf("consumer %q has no delivery limit (max_deliver %d): the server never gives up on its messages", a.Consumer, cfg.MaxDeliver)}
	case a.StreamSeq > info.Delivered.Stream:
		// A rewound consumer may report less than it once delivered:
		// it delivers the message again, which is then not lost.
		return &refusal{fmt.Sprintf("consumer %q has delivered up to stream sequence %d, not %d", a.Consumer, info.Delivered.Stream, a.StreamSeq)}
	case !filtered(cfg, orig.Subject):
		return &refusal{fmt.Sprintf("the message's subject %q is not among consumer %q's filter subjects", orig.Subject, a.Consumer)}
	}
	return nil
}

// filtered reports whether a message on subj is one the consumer with
// cfg is handed.
func filtered(cfg jetstream.ConsumerConfig, subj string) bool {
	filters := cfg.FilterSubjects
	if cfg.FilterSubject != "" {
		filters = append(slices.Clip(filters), cfg.FilterSubject)
	}
	if len(filters) == 0 {
		return true
	}
	return slices.ContainsFunc(filters, func(f string) bool { return subject.Matches(f, subj) })
}

// ownState checks advisory a, whose message is orig, against what courier
// itself holds of the message: verdict.Claimed while a delivery of it is
// under way (by says whose), verdict.Processed when the dedup store records
// its key, verdict.New when neither; an error when the store could not
// answer. The delivery loop is asked first: it records a message's key
// before it stops delivering it, so a message it settles between the two
// questions is found processed, not taken for one given up on.
func (c *Catcher) ownState(ctx context.Context, a advisory, orig *jetstream.RawStreamMsg) (v verdict.Verdict, by string, err error) {
	if c.o.Delivering != nil && c.o.Delivering(a.StreamSeq) {
		return verdict.Claimed, "this courier's delivery loop", nil
	}
	if c.o.Dedup == nil {
		return verdict.New, "", nil
	}
	sctx, cancel := context.WithTimeout(ctx, c.o.StepTimeout)
	defer cancel()
	v, err = c.o.Dedup.Peek(sctx, c.dedupKey(orig))
	if err != nil {
		return verdict.New, "", fmt.Errorf("dedup store: %w", err)
	}
	return v, "a delivery holding its key's claim in the shared dedup store", nil
}

// dedupKey is the key the delivery loop's dedup store holds for orig: its
// idempotency key, resolved from the headers, stream and sequence the
// delivery loop sees (for a copy in a work stream, Options.Origin, those of
// the message copied, as proxy/sourced.go gives them), in the store's form.
func (c *Catcher) dedupKey(orig *jetstream.RawStreamMsg) string {
	stream, created, seq := c.info.Config.Name, c.info.Created, orig.Sequence
	h := stripServerHeaders(orig, stream)
	if o := c.o.Origin; o != nil {
		created = o.Stream.Created
		if s, q, _, ok := natshdr.Source(h); ok {
			stream, seq = s, q
		}
		delete(h, natshdr.SourceHeader)
	}
	return storeKey(proxy.ResolveKey(h, c.o.IdempotencyHeader, stream, created, seq))
}

// storeKey is the form of key the delivery loop's dedup store holds: a key
// longer than 256 bytes as its SHA-256. It must make what proxy's storeKey
// (proxy/delivery.go) makes; cmd/courier's
// TestGiveUpForgedAdvisoryOfProcessedMessage holds the two together.
func storeKey(key string) string {
	if len(key) <= 256 {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}
