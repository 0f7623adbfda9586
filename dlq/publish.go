package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/internal/natshdr"
	"github.com/courierhq/courier/internal/printable"
)

// DefaultPublishTimeout bounds Publisher.Publish when its context has no
// deadline.
const DefaultPublishTimeout = 5 * time.Second

// ShortErrorLen bounds HeaderError, in bytes, in a dead letter that would not
// fit in a message the server accepts with MaxErrorLen.
const ShortErrorLen = 128

// Outcomes of Publisher.DeadLetter that are successes, for errors.Is. Use
// Stored to tell them, and nil, from failures.
var (
	// ErrDuplicate: the dead letter was stored already (same MsgID within
	// the dead-letter stream's duplicate window: the delivery loop, the
	// max-deliveries catch or another replica stored it). It is stored;
	// do not count it again.
	ErrDuplicate = errors.New("dlq: dead letter stored already (duplicate)")
	// ErrBodyOmitted: the dead letter is stored, but as a reference: the
	// original with its envelope is larger than the server accepts
	// (max_payload), so the dead letter carries the envelope without the
	// body (HeaderBody, and without the original's headers too when they
	// alone are too large: HeaderHeaders). The original must stay in its
	// stream: replay fetches it from there. Whoever terminates or deletes
	// the original must not, or must know that a work-queue or interest
	// stream removes it on Term.
	ErrBodyOmitted = errors.New("dlq: dead letter stored without the original's body, which must stay in its stream")
)

// Failures of Publisher.Publish and DeadLetter, for errors.Is. Nothing is
// stored; the original must be kept.
var (
	// ErrRefused: the dead-letter stream answered and refused the dead
	// letter (its max_msg_size, limits with discard new, storage full,
	// and the like): retrying will not help until someone changes the
	// stream or frees space. The error wraps the server's
	// *jetstream.APIError.
	ErrRefused = errors.New("dlq: the dead-letter stream refused the dead letter")
	// ErrTooLarge: even a reference dead letter, without the original's
	// body and headers, is larger than the server accepts (a subject or
	// names of extraordinary length).
	ErrTooLarge = errors.New("dlq: dead letter larger than the server accepts, even without the original's body and headers")
)

// Stored reports whether err, returned by Publisher.DeadLetter, means the
// dead letter is stored: nil, ErrDuplicate or ErrBodyOmitted.
func Stored(err error) bool {
	return err == nil || errors.Is(err, ErrDuplicate) || errors.Is(err, ErrBodyOmitted)
}

// Publisher publishes dead letters to one subject and waits for a stream to
// acknowledge each. It is safe for concurrent use; it holds no resources of
// its own, so there is nothing to close.
type Publisher struct {
	js      jetstream.JetStream
	subject string
	now     func() time.Time
}

// NewPublisher returns a Publisher of dead letters to subject, which a stream
// must capture (see EnsureStream). The largest message it publishes is the
// server's max_payload, read from js.Conn() at each publish.
func NewPublisher(js jetstream.JetStream, subject string) *Publisher {
	return &Publisher{js: js, subject: subject, now: time.Now}
}

// Subject returns the dead-letter subject p publishes to.
func (p *Publisher) Subject() string { return p.subject }

// Receipt is the acknowledgement of a stored dead letter.
type Receipt struct {
	// PubAck is the dead-letter stream's: its Duplicate is set when the
	// same dead letter was stored already, and Sequence is then the one it
	// was first stored under.
	jetstream.PubAck
	// BodyOmitted is set for a reference dead letter, stored without the
	// original's body (see ErrBodyOmitted): the original must stay in its
	// stream.
	BodyOmitted bool
}

// DeadLetter stores l's dead letter (see Publish) and returns nil once a
// stream has stored it with the original's body. The other outcomes that
// mean "stored" are errors for errors.Is, so that a caller who does not look
// closer keeps the original rather than drop it:
//   - ErrDuplicate: stored already; it is not a new dead letter (do not
//     count it twice). Terminate the original as for nil.
//   - ErrBodyOmitted: stored as a reference dead letter; the original must
//     not be removed from its stream (a Term removes it from a work-queue
//     or interest stream). Both may be set.
//
// Stored(err) is true for these three. Any other error means nothing is
// stored: ErrRefused (the stream refused it, retrying will not help until it
// is changed), ErrTooLarge, no stream capturing the subject
// (jetstream.ErrNoStreamResponse), no permission (nats.ErrPermissionViolation),
// a time-out. DeadLetter is what the delivery loop's and the max-deliveries
// catch's DeadLetterer interfaces call.
func (p *Publisher) DeadLetter(ctx context.Context, l Letter) error {
	r, err := p.Publish(ctx, l)
	switch {
	case err != nil:
		return err
	case r.Duplicate && r.BodyOmitted:
		return fmt.Errorf("%w (sequence %d); %w", ErrDuplicate, r.Sequence, ErrBodyOmitted)
	case r.Duplicate:
		return fmt.Errorf("%w (sequence %d)", ErrDuplicate, r.Sequence)
	case r.BodyOmitted:
		return fmt.Errorf("%w (sequence %d; the original is %d bytes in stream %q at sequence %d)",
			ErrBodyOmitted, r.Sequence, len(l.Data), l.Stream, l.Sequence)
	}
	return nil
}

// Publish publishes l's dead letter (the headers of Envelope, the body
// unchanged) and returns once a stream has stored it. A zero l.FailedAt is
// set to the current time. If ctx has no deadline, DefaultPublishTimeout
// applies.
//
// When the dead letter would exceed the server's max_payload, courier's
// additions shrink first (HeaderError cut to ShortErrorLen); if that is not
// enough a reference dead letter is stored, without the body (Receipt.
// BodyOmitted, see ErrBodyOmitted).
//
// A PubAck with Duplicate set is success: the same dead letter was already
// stored (its Nats-Msg-Id is MsgID(l)), and the returned ack carries the
// sequence it was first stored under; Receipt.BodyOmitted is then also set
// when that first dead letter is a reference (or cannot be read to tell).
// On error nothing is known to be stored and the caller must not drop the
// original; the errors are DeadLetter's.
func (p *Publisher) Publish(ctx context.Context, l Letter) (*Receipt, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultPublishTimeout)
		defer cancel()
	}
	if l.FailedAt.IsZero() {
		l.FailedAt = p.now()
	}
	var limit int64
	if nc := p.js.Conn(); nc != nil {
		limit = nc.MaxPayload()
	}
	msg, omitted, err := fit(p.subject, l, limit)
	if err != nil {
		return nil, fmt.Errorf("dlq: dead letter of %q sequence %d: %w", l.Stream, l.Sequence, err)
	}
	ack, err := p.js.PublishMsg(ctx, msg)
	if err != nil {
		return nil, p.publishError(err)
	}
	if ack.Duplicate && !omitted {
		// What is stored is the first dead letter, which may be a
		// reference although this one fits (a shorter error, another
		// reason): its original must stay where replay reads it.
		omitted = p.storedWithoutBody(ctx, ack)
	}
	return &Receipt{PubAck: *ack, BodyOmitted: omitted}, nil
}

// storedWithoutBody reports whether the dead letter ack names as stored
// before is a reference dead letter (HeaderBody), or may be one: when it
// cannot be read, the answer keeps the original. One no longer there
// (replayed or purged since) is not.
func (p *Publisher) storedWithoutBody(ctx context.Context, ack *jetstream.PubAck) bool {
	s, err := p.js.Stream(ctx, ack.Stream)
	if err != nil {
		return !errors.Is(err, jetstream.ErrStreamNotFound)
	}
	m, err := s.GetMsg(ctx, ack.Sequence)
	if err != nil {
		return !errors.Is(err, jetstream.ErrMsgNotFound)
	}
	return m.Header.Get(HeaderBody) != ""
}

func (p *Publisher) publishError(err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		return fmt.Errorf("dlq: publish dead letter to %q: no stream captures the subject: %w", p.subject, err)
	case errors.As(err, &apiErr):
		return fmt.Errorf("dlq: publish dead letter to %q: %w: %w", p.subject, ErrRefused, err)
	case errors.Is(err, nats.ErrMaxPayload):
		// The server's limit is lower than the connection last learned.
		return fmt.Errorf("dlq: publish dead letter to %q: %w: %w", p.subject, ErrTooLarge, err)
	}
	if perr := jsutil.PermissionDenied(p.js, err, `"`+p.subject+`"`); perr != nil {
		return fmt.Errorf("dlq: publish dead letter to %q: %w (%w)", p.subject, perr, err)
	}
	return fmt.Errorf("dlq: publish dead letter to %q: %w", p.subject, err)
}

// fit returns l's dead letter on subject as a message of at most limit bytes
// of headers and body (no limit when limit <= 0), and whether it omits the
// body. It tries, in turn: the full dead letter; with HeaderError cut to
// ShortErrorLen; without the body (a reference); without the body and the
// original's headers. Past that the error wraps ErrTooLarge.
func fit(subject string, l Letter, limit int64) (*nats.Msg, bool, error) {
	h := Envelope(l)
	fits := func(h nats.Header, body []byte) bool {
		return limit <= 0 || int64(natshdr.Size(h)+len(body)) <= limit
	}
	if fits(h, l.Data) {
		return &nats.Msg{Subject: subject, Header: h, Data: l.Data}, false, nil
	}
	if l.Error != "" {
		h.Set(HeaderError, printable.Line(l.Error, ShortErrorLen))
	}
	if fits(h, l.Data) {
		return &nats.Msg{Subject: subject, Header: h, Data: l.Data}, false, nil
	}
	h.Set(HeaderBody, BodyOmittedTooLarge)
	h.Set(HeaderBodySize, strconv.Itoa(len(l.Data)))
	if fits(h, nil) {
		return &nats.Msg{Subject: subject, Header: h}, true, nil
	}
	bare := l
	bare.Header = nil
	h = Envelope(bare)
	if l.Error != "" {
		h.Set(HeaderError, printable.Line(l.Error, ShortErrorLen))
	}
	h.Set(HeaderBody, BodyOmittedTooLarge)
	h.Set(HeaderBodySize, strconv.Itoa(len(l.Data)))
	h.Set(HeaderHeaders, BodyOmittedTooLarge)
	if fits(h, nil) {
		return &nats.Msg{Subject: subject, Header: h}, true, nil
	}
	return nil, false, fmt.Errorf("%w (%d bytes of headers, the server accepts %d)", ErrTooLarge, natshdr.Size(h), limit)
}
