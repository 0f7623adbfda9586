package dlq

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"time"

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
