package giveup

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/subject"
)

// An advisory is a plain publish on a subject: whoever may publish there
// can write one, and nothing in it tells the server's from another's. So
// before a message is dead-lettered for it, what it claims is checked
// against the consumer's state as the server reports it, which no
// publisher writes: the consumer exists and has a delivery limit (one
// without never gives up), it has delivered the message's sequence, and
// the message is one of its filter subjects'. A message the server gave up
// on passes every check; a forged advisory naming a message the consumer
// never delivered (its backlog, another consumer's) fails one.
//
// What this cannot tell apart, the server reporting no more: a message the
// consumer delivered and still holds (waiting out a backoff, in flight),
// or has acked (still in a limits or interest stream). The advisory
// subject is kept to the server by permissions (docs/threat-model.md).

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
