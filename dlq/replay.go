package dlq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	// it holds the same body and headers, or it is gone and the republish
	// carries the dead letter's own Nats-Msg-Id, which only a replay of it
	// publishes).
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
