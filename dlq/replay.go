package dlq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/subject"
)

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
	// Refused: the dead letter names a target replay never publishes to
	// (ReplayResult.Why says which): a subject NATS reserves (subject
	// Reserved: its API, stores, system account, inboxes), one that is
	// not among the subjects of the stream the dead letter names as
	// read from the server, or none at all. Nothing is published and the
	// dead letter is kept, for an operator to inspect (dlq show) and
	// remove (dlq purge); every later replay refuses it again. Courier
	// writes no such dead letter: one was written by someone else who
	// may publish on the dead-letter subject, or altered. A dry run
	// reports it too.
	Refused
)

// String returns "replayed", "kept", "failed", "would replay" or
// "refused".
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
	case Refused:
		return "refused"
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
	// it holds the same body and headers, or it is gone and the republish
	// carries the dead letter's own Nats-Msg-Id, which only a replay of it
	// publishes).
	Earlier bool
	// Why, for Kept, says why the duplicate was not taken for an earlier
	// replay's copy, in a phrase such as "stream ORDERS calls the
	// republish a duplicate of the original (sequence 7), whose
	// Nats-Msg-Id is still inside its duplicate window"; for Refused, why
	// the target was refused, in a phrase such as "its subject
	// "$JS.API.STREAM.DELETE.ORDERS" starts with $JS., which NATS
	// reserves". Subjects in it are quoted with %q: it holds no control
	// character of the dead letter's.
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
	// Replayed, Kept, Failed, WouldReplay and Refused count the dead
	// letters of each Outcome.
	Replayed, Kept, Failed, WouldReplay, Refused int
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
// A dead letter is what anyone allowed to publish on the dead-letter
// subject wrote, so its target is checked before anything is published:
// sel.Stream is required (the stream whose dead letters are replayed, not
// a header the writer chose), and the subject must not be one NATS
// reserves and must be among the subjects of that stream as the server
// reports them (streams' subjects do not overlap, so the republish lands
// there). A dead letter that fails these checks is Refused: kept,
// reported, never published.
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
// removed (Replayed, Earlier), as it is when none is left to compare but
// the republish carries the dead letter's own id (MsgID, given to an
// original that had none), which only a replay of it publishes; a different
// message (its publisher reused the id), or none left to compare under the
// original's own id, keeps the dead letter (Kept, with Why).
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
	case sel.Stream == "":
		return ReplaySummary{}, errors.New("dlq: Replay needs Selection.Stream, the stream whose dead letters are replayed: a dead letter's own Courier-Stream is written by whoever published it")
	}
	var (
		sum     ReplaySummary
		pace    = newPacer(opts.Rate)
		streams = streamCache{}
		stopErr error
		n       int
	)
	err := q.scan(ctx, sel, func(d *DeadLetter) bool {
		if opts.Limit > 0 && n >= opts.Limit {
			return false
		}
		n++
		r, checked := q.checkTarget(ctx, d, streams)
		switch {
		case !checked:
		case opts.DryRun:
			r = ReplayResult{Letter: d, Outcome: WouldReplay}
		default:
			if err := pace.wait(ctx); err != nil {
				stopErr = err
				return false
			}
			r = q.replayOne(ctx, d, opts.IdempotencyHeader, streams)
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
		case Refused:
			sum.Refused++
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

// streamCache holds the info of the source streams a replay has read,
// by name.
type streamCache map[string]*jetstream.StreamInfo

// streamInfo returns the info of the stream named name, read from the
// server once per replay.
func (q *Queue) streamInfo(ctx context.Context, name string, c streamCache) (*jetstream.StreamInfo, error) {
	if info, ok := c[name]; ok {
		return info, nil
	}
	s, err := q.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	info := s.CachedInfo()
	c[name] = info
	return info, nil
}

// checkTarget checks where d would be republished, as Replay describes.
// It reports true when d may be replayed; otherwise the result says why
// not: Refused, or Failed when the stream could not be read.
func (q *Queue) checkTarget(ctx context.Context, d *DeadLetter, streams streamCache) (ReplayResult, bool) {
	r := ReplayResult{Letter: d, Outcome: Refused}
	refuse := func(format string, args ...any) (ReplayResult, bool) {
		r.Why = fmt.Sprintf(format, args...)
		return r, false
	}
	subj := d.Subject
	if subj == "" {
		return refuse("it has no %s: nowhere to republish it", HeaderSubject)
	}
	if p := subject.Reserved(subj); p != "" {
		return refuse("its subject %q starts with %s, which NATS reserves for itself (an API call, a store's write, a reply): replay never publishes there", subj, p)
	}
	if !publishable(subj) {
		return refuse("its subject %q is not one a message is published to (an empty token, a wildcard, or white space)", subj)
	}
	info, err := q.streamInfo(ctx, d.Stream, streams)
	if err != nil {
		r.Outcome, r.Err = Failed, fmt.Errorf("dlq: dead letter %d names stream %q, which cannot be read to check its subject, it is kept: %w", d.Sequence, d.Stream, err)
		return r, false
	}
	if !slices.ContainsFunc(info.Config.Subjects, func(f string) bool { return subject.Matches(f, subj) }) {
		return refuse("its subject %q is not among the subjects of stream %s (%s), which it names", subj, d.Stream, strings.Join(info.Config.Subjects, ", "))
	}
	return ReplayResult{}, true
}

// publishable reports whether subj can be published to as it is: no
// empty token, no wildcard token, no white space or line break (which
// would end the subject in the protocol).
func publishable(subj string) bool {
	if strings.ContainsAny(subj, " \t\r\n") {
		return false
	}
	for t := range strings.SplitSeq(subj, ".") {
		if t == "" || t == "*" || t == ">" {
			return false
		}
	}
	return true
}

// replayOne republishes d, whose target checkTarget accepted, and removes
// it as Replay describes. streams caches the source streams' info.
func (q *Queue) replayOne(ctx context.Context, d *DeadLetter, idempotencyHeader string, streams streamCache) ReplayResult {
	r := ReplayResult{Letter: d}
	fail := func(err error) ReplayResult {
		r.Outcome, r.Err = Failed, err
		return r
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
		if keep := q.checkDuplicate(ctx, d, msg, ack, streams, &r); keep {
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
func (q *Queue) checkDuplicate(ctx context.Context, d *DeadLetter, msg *nats.Msg, ack *jetstream.PubAck, streams streamCache, r *ReplayResult) bool {
	// Kept even if the window cannot be learned: the republish stored
	// nothing.
	retryAt := func(stored time.Time) {
		if info, err := q.streamInfo(ctx, ack.Stream, streams); err == nil {
			r.RetryAt = stored.Add(info.Config.Duplicates)
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
	if errors.Is(err, jetstream.ErrMsgNotFound) && id != "" && id == d.Header.Get(msgIDHeader) {
		// The republish carries the dead letter's own id (its original
		// had none), which only a replay of it publishes to the source
		// stream: the copy stored under it was an earlier replay's, since
		// consumed from a work queue or deleted.
		return false
	}
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
		return nil, fmt.Errorf("it is no longer in the stream (%w)", err)
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
