package dlq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/internal/natshdr"
	"github.com/nats-io/nats.go/jetstream"
)

// serverHeaders are set by the server on a stored message or a direct get,
// never by a publisher. They are dropped from a DeadLetter's Header and from
// a republish (an original fetched with GetMsg may carry them).
var serverHeaders = []string{
	jetstream.StreamHeader,
	jetstream.SequenceHeader,
	jetstream.TimeStampHeaer,
	jetstream.SubjectHeader,
	jetstream.LastSequenceHeader,
	"Nats-Num-Pending",
	"Nats-UpTo-Sequence",
	jetstream.MarkerReasonHeader,
	jetstream.SchedulerHeader,
	jetstream.ScheduleNextHeader,
}

// DeadLetter is one dead letter as stored in the dead-letter stream, with
// the fields of its envelope parsed. Fields an envelope lacks or holds in
// an unreadable form are zero.
type DeadLetter struct {
	// Sequence is the dead letter's sequence in the dead-letter stream.
	Sequence uint64
	// Time is when the dead-letter stream stored it.
	Time time.Time
	// Reason is HeaderReason, such as ReasonRejected.
	Reason string
	// Status is HeaderStatus, the app's last HTTP status; 0 if none.
	Status int
	// Error is HeaderError, the last error; empty if none.
	Error string
	// Attempts is HeaderAttempts.
	Attempts int
	// Subject is the original's exact subject (Subject of the headers:
	// HeaderSubjectBase64, else HeaderSubject), where replay republishes
	// it. It need not be valid UTF-8: clean it before display.
	Subject string
	// Stream is the stream the original was consumed from (HeaderStream).
	Stream string
	// StreamCreated is Stream's creation time (HeaderStreamCreated); zero
	// in dead letters stored before courier wrote it.
	StreamCreated time.Time
	// StreamSequence is the original's sequence in Stream (HeaderSequence).
	StreamSequence uint64
	// Consumer is the durable that gave up on the original (HeaderConsumer).
	Consumer string
	// FailedAt is HeaderFailedAt; zero if absent.
	FailedAt time.Time
	// Published is the original's stream timestamp (HeaderPublished); zero
	// if absent.
	Published time.Time
	// Header holds the dead letter's headers as stored: the envelope
	// (Original recovers the original's headers from it), without the
	// headers the server adds to a fetched message (Nats-Stream,
	// Nats-Sequence, Nats-Time-Stamp, Nats-Subject and the like).
	Header nats.Header
	// Data is the body, the original's unchanged; empty in a reference
	// dead letter until Queue.Load reads it from the source stream.
	Data []byte
	// BodyOmitted is set for a reference dead letter (HeaderBody): it does
	// not carry the original's body, which was left in Stream at
	// StreamSequence; BodySize is the body's size (HeaderBodySize).
	BodyOmitted bool
	BodySize    int
	// HeadersOmitted is set when the dead letter does not carry the
	// original's headers either (HeaderHeaders); Queue.Load reads them.
	HeadersOmitted bool

	loaded nats.Header // the original's headers read by Load, when omitted
}

// newDeadLetter parses a stored dead letter.
func newDeadLetter(m *jetstream.RawStreamMsg) *DeadLetter {
	h := withoutServerHeaders(m.Header)
	d := &DeadLetter{
		Sequence: m.Sequence,
		Time:     m.Time,
		Reason:   h.Get(HeaderReason),
		Error:    h.Get(HeaderError),
		Subject:  Subject(h),
		Stream:   h.Get(HeaderStream),
		Consumer: h.Get(HeaderConsumer),
		Header:   h,
		Data:     m.Data,
	}
	d.Status, _ = strconv.Atoi(h.Get(HeaderStatus))
	d.Attempts, _ = strconv.Atoi(h.Get(HeaderAttempts))
	d.StreamSequence, _ = strconv.ParseUint(h.Get(HeaderSequence), 10, 64)
	d.FailedAt, _ = time.Parse(time.RFC3339Nano, h.Get(HeaderFailedAt))
	d.Published, _ = time.Parse(time.RFC3339Nano, h.Get(HeaderPublished))
	d.StreamCreated, _ = time.Parse(time.RFC3339Nano, h.Get(HeaderStreamCreated))
	d.BodyOmitted = h.Get(HeaderBody) != ""
	d.BodySize, _ = strconv.Atoi(h.Get(HeaderBodySize))
	d.HeadersOmitted = h.Get(HeaderHeaders) != ""
	return d
}

// Original returns the headers of the original message as its publisher
// sent them: Original(d.Header) without what made sense only at the first
// publish or was added by the server: Nats-Expected-* expectations,
// Nats-Batch-* (atomic batch publishing), and server headers such as
// Nats-Stream, Nats-Sequence, Nats-Time-Stamp and Nats-Subject. The
// original's Nats-Msg-Id is kept, as are Nats-TTL and Nats-Rollup.
//
// For a dead letter whose headers were omitted, they are those Queue.Load
// read from the source stream (none before it).
func (d *DeadLetter) Original() nats.Header {
	h := Original(d.Header)
	if d.HeadersOmitted {
		h = make(nats.Header, len(d.loaded))
		for name, values := range d.loaded {
			h[name] = append([]string(nil), values...)
		}
	}
	for name := range h {
		if hasPrefixFold(name, "Nats-Expected-") || hasPrefixFold(name, "Nats-Batch-") || slices.Contains(serverHeaders, name) {
			delete(h, name)
		}
	}
	return h
}

// Republish returns the message Replay publishes for d: to the original
// subject, the original body, and the headers of Original (load a reference
// dead letter's first, see Queue.Load) but NATS's own (Nats-*), of which
// only Nats-Msg-Id and Nats-TTL are kept. The others act when the message
// is published, beyond the message itself, and a replay is not its first
// publish: Nats-Rollup would remove the messages stored on its subject (or
// in its stream) since the original, Nats-Schedule-* would make new
// messages on a schedule, Nats-Trace-Dest would have the server publish a
// trace to a subject of the header's choosing, Nats-Incr would count again.
//
// An original whose dedup key courier derived, having neither a non-empty
// idempotencyHeader (looked up as the delivery loop does: as sent, then in
// any case) nor a Nats-Msg-Id, is given that derived key (DerivedKey) in
// idempotencyHeader, so that the app sees the Idempotency-Key of the failed
// attempts; this needs HeaderStreamCreated (dead letters stored before
// courier wrote it are republished without). An empty idempotencyHeader
// adds no key. An original that carried no Nats-Msg-Id is given the dead
// letter's own (MsgID), so that publishing it again after an interrupted
// replay is recognised as a duplicate by the source stream, as an original
// Nats-Msg-Id would be. So is an original whose Nats-Msg-Id is such an id,
// given by the replay that stored it: the same id again would be, within
// the source stream's duplicate window, a duplicate of that very copy, and
// a replay of a replay would store nothing.
func (d *DeadLetter) Republish(idempotencyHeader string) *nats.Msg {
	h := d.Original()
	for name := range h {
		if hasPrefixFold(name, "Nats-") && name != msgIDHeader && name != ttlHeader {
			delete(h, name)
		}
	}
	if idempotencyHeader != "" && natshdr.Get(h, idempotencyHeader) == "" && h.Get(msgIDHeader) == "" && !d.StreamCreated.IsZero() {
		h.Set(idempotencyHeader, DerivedKey(d.Stream, d.StreamCreated, d.StreamSequence))
	}
	if vs, ok := h[msgIDHeader]; !ok || len(vs) > 0 && strings.HasPrefix(vs[0], msgIDPrefix) {
		if id := d.Header.Get(msgIDHeader); id != "" {
			if ok && idempotencyHeader != "" && natshdr.Get(h, idempotencyHeader) == "" {
				// The replay id was the copy's key: the app keeps seeing it.
				h.Set(idempotencyHeader, vs[0])
			}
			h[msgIDHeader] = []string{id}
		}
	}
	return &nats.Msg{Subject: d.Subject, Header: h, Data: d.Data}
}

// Load reads what a reference dead letter left in the source stream: the
// original's body into d.Data and, when HeadersOmitted, its headers (for
// Original). It does nothing for a dead letter that carries its body. The
// message read must be the original: same subject, same stream timestamp,
// from the stream created at StreamCreated; otherwise, or when it is not
// there, the error wraps ErrOriginalGone.
func (q *Queue) Load(ctx context.Context, d *DeadLetter) error {
	if !d.BodyOmitted {
		return nil
	}
	m, err := q.source(ctx, d)
	if err != nil {
		return err
	}
	d.Data = m.Data
	if d.HeadersOmitted {
		d.loaded = withoutServerHeaders(m.Header)
	}
	return nil
}

// source fetches the original of a reference dead letter.
func (q *Queue) source(ctx context.Context, d *DeadLetter) (*jetstream.RawStreamMsg, error) {
	where := fmt.Sprintf("stream %q sequence %d", d.Stream, d.StreamSequence)
	gone := func(why string) error {
		return fmt.Errorf("%w: the body of dead letter %d was left in %s, which %s", ErrOriginalGone, d.Sequence, where, why)
	}
	s, err := q.js.Stream(ctx, d.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, gone("no longer exists")
	}
	if err != nil {
		return nil, fmt.Errorf("dlq: read the original of dead letter %d from %s: %w", d.Sequence, where, err)
	}
	if created := s.CachedInfo().Created; !d.StreamCreated.IsZero() && !created.Equal(d.StreamCreated) {
		return nil, gone("was deleted and created again since")
	}
	m, err := s.GetMsg(ctx, d.StreamSequence)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, gone("no longer holds it (deleted, expired or removed from a work queue)")
	case err != nil:
		return nil, fmt.Errorf("dlq: read the original of dead letter %d from %s: %w", d.Sequence, where, err)
	case m.Subject != d.Subject && utf8.ValidString(d.Subject), // the API's JSON mangles others
		!d.Published.IsZero() && !m.Time.Equal(d.Published):
		return nil, gone("holds another message there")
	}
	return m, nil
}

// withoutServerHeaders returns a copy of h without serverHeaders.
func withoutServerHeaders(h nats.Header) nats.Header {
	out := make(nats.Header, len(h))
	for name, values := range h {
		if !slices.Contains(serverHeaders, name) {
			out[name] = append([]string(nil), values...)
		}
	}
	return out
}
