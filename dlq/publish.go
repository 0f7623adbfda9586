package dlq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
)

// DefaultPublishTimeout bounds Publisher.Publish when its context has no
// deadline.
const DefaultPublishTimeout = 5 * time.Second

// Publisher publishes dead letters to one subject and waits for a stream to
// acknowledge each. It is safe for concurrent use; it holds no resources of
// its own, so there is nothing to close.
type Publisher struct {
	js      jetstream.JetStream
	subject string
	now     func() time.Time
}

// NewPublisher returns a Publisher of dead letters to subject, which a stream
// must capture (see EnsureStream).
func NewPublisher(js jetstream.JetStream, subject string) *Publisher {
	return &Publisher{js: js, subject: subject, now: time.Now}
}

// Subject returns the dead-letter subject p publishes to.
func (p *Publisher) Subject() string { return p.subject }

// Publish publishes l's dead letter (the headers of Envelope, the body
// unchanged) and returns once a stream has stored it. A zero l.FailedAt is
// set to the current time. If ctx has no deadline, DefaultPublishTimeout
// applies.
//
// A PubAck with Duplicate set is success: the same dead letter was already
// stored (its Nats-Msg-Id is MsgID(l)), and the returned ack carries the
// sequence it was first stored under. On error nothing is known to be stored
// and the caller must not drop the original. With no stream capturing the
// subject, the error wraps jetstream.ErrNoStreamResponse; when the server
// refused the publish for lack of permission it wraps
// nats.ErrPermissionViolation.
func (p *Publisher) Publish(ctx context.Context, l Letter) (*jetstream.PubAck, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultPublishTimeout)
		defer cancel()
	}
	if l.FailedAt.IsZero() {
		l.FailedAt = p.now()
	}
	msg := &nats.Msg{Subject: p.subject, Header: Envelope(l), Data: l.Data}
	ack, err := p.js.PublishMsg(ctx, msg)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoStreamResponse) {
			return nil, fmt.Errorf("dlq: publish dead letter to %q: no stream captures the subject: %w", p.subject, err)
		}
		if perr := jsutil.PermissionDenied(p.js, err, `"`+p.subject+`"`); perr != nil {
			return nil, fmt.Errorf("dlq: publish dead letter to %q: %w (%w)", p.subject, perr, err)
		}
		return nil, fmt.Errorf("dlq: publish dead letter to %q: %w", p.subject, err)
	}
	return ack, nil
}
