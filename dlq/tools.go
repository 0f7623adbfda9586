package dlq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/subject"
)

// Errors of the dead-letter tools, for errors.Is.
var (
	// ErrNoStream: no stream captures the dead-letter subject, so there
	// are no dead letters to read (the sidecar creates one on start).
	ErrNoStream = errors.New("dlq: no stream captures the dead-letter subject")
	// ErrNotFound: no dead letter at that sequence on the subject.
	ErrNotFound = errors.New("dlq: dead letter not found")
	// ErrOriginalGone: the original of a reference dead letter (see
	// ErrBodyOmitted) is no longer in its stream (deleted, expired, or the
	// stream created again since), so its body cannot be read.
	ErrOriginalGone = errors.New("dlq: the original is no longer in its stream")
)

// DefaultDeleteTimeout bounds the removal of a dead letter after its
// republish was acknowledged. The removal does not stop when the caller's
// context ends: a dead letter left behind is replayed again later (and found
// a duplicate while inside the source stream's duplicate window), but
// removing it at once is better.
const DefaultDeleteTimeout = 5 * time.Second

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
// dead letter's first, see Queue.Load).
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
// Nats-Msg-Id would be.
func (d *DeadLetter) Republish(idempotencyHeader string) *nats.Msg {
	h := d.Original()
	if idempotencyHeader != "" && headerValue(h, idempotencyHeader) == "" && h.Get(msgIDHeader) == "" && !d.StreamCreated.IsZero() {
		h.Set(idempotencyHeader, DerivedKey(d.Stream, d.StreamCreated, d.StreamSequence))
	}
	if _, ok := h[msgIDHeader]; !ok {
		if id := d.Header.Get(msgIDHeader); id != "" {
			h[msgIDHeader] = []string{id}
		}
	}
	return &nats.Msg{Subject: d.Subject, Header: h, Data: d.Data}
}

// headerValue looks a header up as sent (NATS header names are
// case-sensitive) and then in any case, as the delivery loop does.
func headerValue(h nats.Header, name string) string {
	if vs := h[name]; len(vs) > 0 {
		return vs[0]
	}
	for k, vs := range h {
		if len(vs) > 0 && strings.EqualFold(k, name) {
			return vs[0]
		}
	}
	return ""
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

// Selection chooses dead letters: those meeting every criterion set. The
// zero value selects every dead letter on the subject.
type Selection struct {
	// Stream and Consumer, when set, select the dead letters of that
	// stream's (HeaderStream) and consumer's (HeaderConsumer) originals.
	// Set both to select the dead letters of one sidecar.
	Stream, Consumer string
	// Reason, when set, selects that HeaderReason.
	Reason string
	// Subject, when set, is a subject filter the original's subject must
	// match, NATS wildcards allowed ("orders.*", "orders.>").
	Subject string
	// Since, when not zero, selects dead letters stored at or after it.
	Since time.Time
	// Sequences, when not empty, selects only dead letters at these
	// sequences of the dead-letter stream; a sequence holding none on the
	// subject is skipped.
	Sequences []uint64
	// Originals, when not empty, selects the dead letters of the originals
	// at these sequences of their stream (HeaderSequence).
	Originals []uint64
}

// Matches reports whether d is selected by s (Sequences aside).
func (s Selection) Matches(d *DeadLetter) bool {
	switch {
	case s.Stream != "" && d.Stream != s.Stream,
		s.Consumer != "" && d.Consumer != s.Consumer,
		s.Reason != "" && d.Reason != s.Reason,
		s.Subject != "" && !subject.Matches(s.Subject, d.Subject),
		!s.Since.IsZero() && d.Time.Before(s.Since),
		len(s.Originals) > 0 && !slices.Contains(s.Originals, d.StreamSequence):
		return false
	}
	return true
}

// Queue reads and operates on the dead letters published to one subject:
// listing, showing, replaying and purging them. It works beside a live
// sidecar, on a dead-letter stream shared with other subjects and on one
// with deleted messages. A Queue is safe for concurrent use; it holds no
// resources of its own, so there is nothing to close.
type Queue struct {
	js      jetstream.JetStream
	subject string
	stream  jetstream.Stream
}

// Open returns the Queue of dead letters on subject, found in the stream
// that captures it. With no such stream the error wraps ErrNoStream.
func Open(ctx context.Context, js jetstream.JetStream, subject string) (*Queue, error) {
	if err := checkSubject(subject); err != nil {
		return nil, err
	}
	name, err := js.StreamNameBySubject(ctx, subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w %q", ErrNoStream, subject)
	}
	if err != nil {
		return nil, fmt.Errorf("dlq: look up the stream capturing %q: %w", subject, err)
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("dlq: stream %q capturing %q: %w", name, subject, err)
	}
	return &Queue{js: js, subject: subject, stream: s}, nil
}

// Subject returns the dead-letter subject.
func (q *Queue) Subject() string { return q.subject }

// StreamName returns the name of the stream holding the dead letters.
func (q *Queue) StreamName() string { return q.stream.CachedInfo().Config.Name }

// Show returns the dead letter at seq. If seq holds none on the subject (it
// was removed, or holds another subject's message), the error wraps
// ErrNotFound.
func (q *Queue) Show(ctx context.Context, seq uint64) (*DeadLetter, error) {
	m, err := q.stream.GetMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, fmt.Errorf("%w: no message at sequence %d of stream %q", ErrNotFound, seq, q.StreamName())
	case err != nil:
		return nil, fmt.Errorf("dlq: get sequence %d of stream %q: %w", seq, q.StreamName(), err)
	case m.Subject != q.subject:
		return nil, fmt.Errorf("%w: sequence %d of stream %q is on %q, not the dead-letter subject %q", ErrNotFound, seq, q.StreamName(), m.Subject, q.subject)
	}
	return newDeadLetter(m), nil
}

// All yields the selected dead letters in sequence order. It reads with
// one request per dead letter (the next message on the subject at or after
// a sequence), so gaps left by removed dead letters and other subjects'
// messages cost nothing. It stops at the stream's last sequence as it was
// when the iteration began: dead letters stored meanwhile (by a live
// sidecar, or after a replay failed again) are left for the next run. On an
// error it yields it once, with a nil DeadLetter, and stops.
func (q *Queue) All(ctx context.Context, sel Selection) iter.Seq2[*DeadLetter, error] {
	return func(yield func(*DeadLetter, error) bool) {
		if err := q.scan(ctx, sel, func(d *DeadLetter) bool { return yield(d, nil) }); err != nil {
			yield(nil, err)
		}
	}
}

// List returns the selected dead letters in sequence order (see All).
func (q *Queue) List(ctx context.Context, sel Selection) ([]*DeadLetter, error) {
	var out []*DeadLetter
	for d, err := range q.All(ctx, sel) {
		if err != nil {
			return out, err
		}
		out = append(out, d)
	}
	return out, nil
}

// scan calls f with each selected dead letter until f returns false.
func (q *Queue) scan(ctx context.Context, sel Selection, f func(*DeadLetter) bool) error {
	info, err := q.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("dlq: stream %q: %w", q.StreamName(), err)
	}
	last := info.State.LastSeq

	if len(sel.Sequences) > 0 {
		seqs := slices.Clone(sel.Sequences)
		slices.Sort(seqs)
		for _, seq := range slices.Compact(seqs) {
			d, err := q.Show(ctx, seq)
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if sel.Matches(d) && !f(d) {
				return nil
			}
		}
		return nil
	}

	for seq := max(info.State.FirstSeq, 1); seq <= last; {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, err := q.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(q.subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("dlq: read stream %q from sequence %d: %w", q.StreamName(), seq, err)
		}
		if m.Sequence > last || m.Sequence < seq {
			return nil
		}
		seq = m.Sequence + 1
		if d := newDeadLetter(m); sel.Matches(d) && !f(d) {
			return nil
		}
	}
	return nil
}

// remove deletes the dead letter at seq. One already gone (removed by a
// concurrent replay or purge) counts as removed. The removal is not
// cancelled with ctx, only bounded by DefaultDeleteTimeout: it follows a
// republish that has already happened.
func (q *Queue) remove(ctx context.Context, seq uint64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultDeleteTimeout)
	defer cancel()
	err := q.stream.DeleteMsg(ctx, seq)
	if err == nil {
		return nil
	}
	// The server's "no message found" comes back only as text: ask
	// again instead.
	if _, gerr := q.stream.GetMsg(ctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
		return nil
	}
	return fmt.Errorf("dlq: remove dead letter %d from stream %q: %w", seq, q.StreamName(), err)
}

// Outcome is what Replay did with one dead letter.
type Outcome int

const (
	// Replayed: republished and acknowledged, and the dead letter removed.
	// Also when the source stream called the republish a duplicate of a
	// copy stored by an earlier, interrupted replay (ReplayResult.Earlier).
	Replayed Outcome = iota + 1
	// Kept: the source stream called the republish a duplicate and it
	// cannot be shown to be an earlier replay's copy: of the original
	// itself, whose Nats-Msg-Id is still inside its duplicate window, or of
	// another message stored under the same id, or of one no longer there
	// to compare. The republish stored nothing and the dead letter is kept
	// (ReplayResult.Why says which, RetryAt when to try again).
	Kept
	// Failed: the republish or the removal failed (ReplayResult.Err). When
	// the republish was acknowledged but the removal failed, a later
	// replay within the source stream's duplicate window removes it.
	Failed
	// WouldReplay: a dry run; nothing was published or removed.
	WouldReplay
)

// String returns "replayed", "kept", "failed" or "would replay".
func (o Outcome) String() string {
	switch o {
	case Replayed:
		return "replayed"
	case Kept:
		return "kept"
	case Failed:
		return "failed"
	case WouldReplay:
		return "would replay"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// ReplayResult is the fate of one dead letter in Replay.
type ReplayResult struct {
	// Letter is the dead letter.
	Letter *DeadLetter
	// Outcome is what happened to it.
	Outcome Outcome
	// Ack is the source stream's acknowledgement of the republish; nil on
	// a dry run or when the republish failed.
	Ack *jetstream.PubAck
	// Earlier is set when the republish was a duplicate of a copy stored
	// by an earlier, interrupted replay (Ack.Sequence is that copy's, and
	// it holds the same body and headers).
	Earlier bool
	// Why, for Kept, says why the duplicate was not taken for an earlier
	// replay's copy, in a phrase such as "stream ORDERS calls the
	// republish a duplicate of the original (sequence 7), whose
	// Nats-Msg-Id is still inside its duplicate window".
	Why string
	// RetryAt, for Kept, is when the Nats-Msg-Id leaves the source
	// stream's duplicate window: the stream timestamp of the message
	// stored under it plus the window (now plus the window, an upper
	// bound, when that message is gone). Zero if the window could not be
	// learned.
	RetryAt time.Time
	// Err, for Failed, says why.
	Err error
}

// ReplayOptions tunes Replay. The zero value replays every selected dead
// letter as fast as the server acknowledges. Negative values are refused.
type ReplayOptions struct {
	// Limit, when more than 0, stops after that many selected dead
	// letters (whatever their outcome).
	Limit int
	// Rate, when more than 0, limits republishes to that many per second.
	Rate float64
	// IdempotencyHeader is the header that carries the dedup key
	// (COURIER_IDEMPOTENCY_HEADER): an original whose key was derived is
	// republished with it there (see DeadLetter.Republish). Empty adds
	// none.
	IdempotencyHeader string
	// DryRun selects and reports without publishing or removing anything.
	DryRun bool
	// Progress, when set, is called after each dead letter is handled, on
	// Replay's goroutine.
	Progress func(ReplayResult)
}

// ReplaySummary counts the outcomes of a Replay.
type ReplaySummary struct {
	// Replayed, Kept, Failed and WouldReplay count the dead letters of
	// each Outcome.
	Replayed, Kept, Failed, WouldReplay int
	// RetryAt is the latest RetryAt of the kept dead letters: after it,
	// all of them can be replayed. Zero when none was kept.
	RetryAt time.Time
}

// Replay republishes each selected dead letter (its Republish message:
// original subject, body and headers) with a JetStream publish and, only
// once the source stream has acknowledged it, removes the dead letter from
// the dead-letter stream. It handles dead letters one at a time, in
// sequence order, up to the stream's last sequence when it began.
//
// A reference dead letter (BodyOmitted) is republished with the body read
// from the source stream (Load); when the original is gone it fails with
// ErrOriginalGone and is kept.
//
// When the source stream calls a republish a duplicate (same Nats-Msg-Id
// within its duplicate window), the republish stored nothing, and the
// acknowledged sequence decides: if it is the original's own
// (HeaderSequence in HeaderStream), the original's id is still inside the
// window and the dead letter is kept (Kept, with RetryAt). Otherwise the
// message stored there is read and compared with the republish: the same
// body and headers make it a copy stored by an earlier replay that was
// interrupted before removing the dead letter, and the dead letter is
// removed (Replayed, Earlier); a different message (its publisher reused
// the id), or none left to compare, keeps the dead letter (Kept, with Why).
// So an interrupted replay, run again within the duplicate window, neither
// loses nor doubles a message.
//
// A failure with one dead letter is counted and reported, and Replay goes
// on with the next. The error is for what stops the whole run: ctx ending,
// reading the dead-letter stream failing, the connection closed.
func (q *Queue) Replay(ctx context.Context, sel Selection, opts ReplayOptions) (ReplaySummary, error) {
	switch {
	case opts.Limit < 0:
		return ReplaySummary{}, fmt.Errorf("dlq: ReplayOptions.Limit %d must not be negative (0: no limit)", opts.Limit)
	case opts.Rate < 0:
		return ReplaySummary{}, fmt.Errorf("dlq: ReplayOptions.Rate %g must not be negative (0: no limit)", opts.Rate)
	}
	var (
		sum     ReplaySummary
		pace    = newPacer(opts.Rate)
		windows = map[string]time.Duration{}
		stopErr error
		n       int
	)
	err := q.scan(ctx, sel, func(d *DeadLetter) bool {
		if opts.Limit > 0 && n >= opts.Limit {
			return false
		}
		n++
		var r ReplayResult
		if opts.DryRun {
			r = ReplayResult{Letter: d, Outcome: WouldReplay}
		} else {
			if err := pace.wait(ctx); err != nil {
				stopErr = err
				return false
			}
			r = q.replayOne(ctx, d, opts.IdempotencyHeader, windows)
		}
		switch r.Outcome {
		case Replayed:
			sum.Replayed++
		case Kept:
			sum.Kept++
			if r.RetryAt.After(sum.RetryAt) {
				sum.RetryAt = r.RetryAt
			}
		case Failed:
			sum.Failed++
		case WouldReplay:
			sum.WouldReplay++
		}
		if opts.Progress != nil {
			opts.Progress(r)
		}
		if r.Outcome == Failed && (ctx.Err() != nil || errors.Is(r.Err, nats.ErrConnectionClosed)) {
			stopErr = r.Err
			return false
		}
		return true
	})
	if err == nil {
		err = stopErr
	}
	if err != nil {
		return sum, fmt.Errorf("dlq: replay stopped: %w", err)
	}
	return sum, nil
}

// replayOne republishes d and removes it as Replay describes. windows caches
// the source streams' duplicate windows.
func (q *Queue) replayOne(ctx context.Context, d *DeadLetter, idempotencyHeader string, windows map[string]time.Duration) ReplayResult {
	r := ReplayResult{Letter: d}
	fail := func(err error) ReplayResult {
		r.Outcome, r.Err = Failed, err
		return r
	}
	if d.Subject == "" {
		return fail(fmt.Errorf("dlq: dead letter %d has no %s: nowhere to republish it", d.Sequence, HeaderSubject))
	}
	if err := q.Load(ctx, d); err != nil {
		return fail(fmt.Errorf("dlq: dead letter %d cannot be replayed, it is kept: %w", d.Sequence, err))
	}
	msg := d.Republish(idempotencyHeader)
	ack, err := q.js.PublishMsg(ctx, msg)
	if err != nil {
		return fail(fmt.Errorf("dlq: republish dead letter %d to %q: %w", d.Sequence, d.Subject, err))
	}
	r.Ack = ack
	if ack.Duplicate {
		if keep := q.checkDuplicate(ctx, d, msg, ack, windows, &r); keep {
			r.Outcome = Kept
			return r
		}
		r.Earlier = true
	}
	if err := q.remove(ctx, d.Sequence); err != nil {
		return fail(fmt.Errorf("republished to %q (stream %q sequence %d) but not removed, a later replay will remove it: %w",
			d.Subject, ack.Stream, ack.Sequence, err))
	}
	r.Outcome = Replayed
	return r
}

// checkDuplicate decides whether the republish msg of d, which the source
// stream called a duplicate, was stored by an earlier replay (false) or
// stored nothing and d must be kept (true, with r.Why and r.RetryAt set).
func (q *Queue) checkDuplicate(ctx context.Context, d *DeadLetter, msg *nats.Msg, ack *jetstream.PubAck, windows map[string]time.Duration, r *ReplayResult) bool {
	// Kept even if the window cannot be learned: the republish stored
	// nothing.
	retryAt := func(stored time.Time) {
		if window, err := q.duplicateWindow(ctx, ack.Stream, windows); err == nil {
			r.RetryAt = stored.Add(window)
		}
	}
	if ack.Stream == d.Stream && ack.Sequence == d.StreamSequence {
		r.Why = fmt.Sprintf("stream %s calls the republish a duplicate of the original (sequence %d), whose Nats-Msg-Id is still inside its duplicate window",
			ack.Stream, ack.Sequence)
		published := d.Published
		if published.IsZero() {
			published = time.Now() // an upper bound
		}
		retryAt(published)
		return true
	}
	id := msg.Header.Get(msgIDHeader)
	stored, err := q.storedAt(ctx, ack.Stream, ack.Sequence)
	if err != nil {
		r.Why = fmt.Sprintf("stream %s calls the republish a duplicate of sequence %d (Nats-Msg-Id %q), which cannot be read to check that it is an earlier replay's copy (%v); if it was, the sidecar's dedup recognises a later replay",
			ack.Stream, ack.Sequence, id, err)
		retryAt(time.Now()) // the id is inside the window now: an upper bound
		return true
	}
	if !bytes.Equal(stored.Data, msg.Data) || !sameHeaders(withoutServerHeaders(stored.Header), msg.Header) {
		r.Why = fmt.Sprintf("stream %s holds another message under the same Nats-Msg-Id %q at sequence %d (its publisher reused the id), so the republish stored nothing",
			ack.Stream, id, ack.Sequence)
		retryAt(stored.Time)
		return true
	}
	return false
}

// storedAt reads the message at seq of stream.
func (q *Queue) storedAt(ctx context.Context, stream string, seq uint64) (*jetstream.RawStreamMsg, error) {
	s, err := q.js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, errors.New("it is no longer in the stream")
	}
	return m, err
}

// sameHeaders reports whether a and b hold the same names with the same
// values in the same order.
func sameHeaders(a, b nats.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for name, values := range a {
		if !slices.Equal(values, b[name]) {
			return false
		}
	}
	return true
}

// duplicateWindow returns the duplicate window of stream, cached in windows.
func (q *Queue) duplicateWindow(ctx context.Context, stream string, windows map[string]time.Duration) (time.Duration, error) {
	if w, ok := windows[stream]; ok {
		return w, nil
	}
	s, err := q.js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("dlq: stream %q: %w", stream, err)
	}
	w := s.CachedInfo().Config.Duplicates
	windows[stream] = w
	return w, nil
}

// PurgeResult is the fate of one dead letter in Purge.
type PurgeResult struct {
	// Letter is the dead letter.
	Letter *DeadLetter
	// Err is nil when it was removed.
	Err error
}

// PurgeOptions tunes Purge. The zero value purges every selected dead
// letter; a negative Limit is refused.
type PurgeOptions struct {
	// Limit, when more than 0, stops after that many selected dead letters.
	Limit int
	// Progress, when set, is called after each dead letter is handled, on
	// Purge's goroutine.
	Progress func(PurgeResult)
}

// PurgeSummary counts the outcomes of a Purge.
type PurgeSummary struct {
	// Purged counts the dead letters removed; Failed those that were not.
	Purged, Failed int
}

// Purge removes the selected dead letters for good, in sequence order, up
// to the stream's last sequence when it began. A failure with one dead
// letter is counted and reported, and Purge goes on; the error is for what
// stops the whole run (ctx ending, reading the stream failing).
func (q *Queue) Purge(ctx context.Context, sel Selection, opts PurgeOptions) (PurgeSummary, error) {
	if opts.Limit < 0 {
		return PurgeSummary{}, fmt.Errorf("dlq: PurgeOptions.Limit %d must not be negative (0: no limit)", opts.Limit)
	}
	var (
		sum     PurgeSummary
		n       int
		stopErr error
	)
	err := q.scan(ctx, sel, func(d *DeadLetter) bool {
		if opts.Limit > 0 && n >= opts.Limit {
			return false
		}
		if stopErr = ctx.Err(); stopErr != nil {
			return false
		}
		n++
		err := q.remove(ctx, d.Sequence)
		if err != nil {
			sum.Failed++
		} else {
			sum.Purged++
		}
		if opts.Progress != nil {
			opts.Progress(PurgeResult{Letter: d, Err: err})
		}
		return true
	})
	if err == nil {
		err = stopErr
	}
	if err != nil {
		return sum, fmt.Errorf("dlq: purge stopped: %w", err)
	}
	return sum, nil
}

// pacer spaces out calls to wait to at most rate per second; a rate of 0 or
// less does not wait.
type pacer struct {
	every time.Duration
	next  time.Time
}

func newPacer(rate float64) *pacer {
	if rate <= 0 {
		return &pacer{}
	}
	return &pacer{every: time.Duration(float64(time.Second) / rate)}
}

func (p *pacer) wait(ctx context.Context) error {
	if p.every <= 0 {
		return ctx.Err()
	}
	now := time.Now()
	if d := p.next.Sub(now); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		now = p.next
	}
	p.next = now.Add(p.every)
	return nil
}
