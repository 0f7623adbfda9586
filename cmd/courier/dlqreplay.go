package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/courierhq/courier/dlq"
)

// replayProgressEvery is how often a replay reports progress on stderr,
// besides its line per dead letter: every so many dead letters or every
// second, whichever comes first.
const replayProgressEvery = 100

// dlqReplay replays the selection: a line per dead letter and periodic
// progress on stderr, the summary on stdout. A dry run writes its plan, a
// line per dead letter, to stdout.
func dlqReplay(ctx context.Context, q *dlq.Queue, sel dlq.Selection, opts dlq.ReplayOptions, stdout, stderr io.Writer) error {
	handled := 0
	var counts dlq.ReplaySummary
	lastReport := time.Now()
	opts.Progress = func(r dlq.ReplayResult) {
		handled++
		d := r.Letter
		subject := cell(d.Subject, 1<<10)
		switch r.Outcome {
		case dlq.WouldReplay:
			fmt.Fprintf(stdout, "would replay %d (%s sequence %d) to %s (%s, %s)\n", d.Sequence, d.Stream, d.StreamSequence, subject, d.Reason, plural(d.Attempts, "attempt"))
			return
		case dlq.Replayed:
			counts.Replayed++
			if r.Earlier {
				fmt.Fprintf(stderr, "removed %d: already republished to %s by an earlier, interrupted replay (%s sequence %d)\n",
					d.Sequence, subject, r.Ack.Stream, r.Ack.Sequence)
			} else {
				fmt.Fprintf(stderr, "replayed %d to %s (%s sequence %d)\n", d.Sequence, subject, r.Ack.Stream, r.Ack.Sequence)
			}
		case dlq.Kept:
			counts.Kept++
			fmt.Fprintf(stderr, "kept %d: %s; %s\n", d.Sequence, r.Why, retryHint(r.RetryAt))
		case dlq.Failed:
			counts.Failed++
			fmt.Fprintf(stderr, "failed %d: %v\n", d.Sequence, r.Err)
		}
		if handled%replayProgressEvery == 0 || time.Since(lastReport) >= time.Second {
			lastReport = time.Now()
			fmt.Fprintf(stderr, "progress: %d handled so far: replayed %d, kept %d, failed %d\n", handled, counts.Replayed, counts.Kept, counts.Failed)
		}
	}
	sum, err := q.Replay(ctx, sel, opts)
	if opts.DryRun {
		fmt.Fprintf(stdout, "dry run: would replay %d, nothing changed\n", sum.WouldReplay)
	} else {
		fmt.Fprintf(stdout, "replayed %d, kept %d (duplicate window), failed %d\n", sum.Replayed, sum.Kept, sum.Failed)
		if sum.Kept > 1 {
			fmt.Fprintf(stderr, "the kept dead letters can be replayed again %s\n", strings.TrimPrefix(retryHint(sum.RetryAt), "retry "))
		}
	}
	switch {
	case err != nil:
		return err
	case sum.Kept+sum.Failed > 0:
		return &exitError{code: 1, err: fmt.Errorf("dlq replay: %d kept, %d failed", sum.Kept, sum.Failed)}
	case missingSequences(sel, opts.Limit, handled):
		return &exitError{code: 1, err: fmt.Errorf("dlq replay: %d of the %d sequences given hold no dead letter of this consumer matching the filters",
			len(sel.Sequences)-handled, len(sel.Sequences))}
	}
	return nil
}

// dlqPurge purges the selection, a line per dead letter on stderr and the
// summary on stdout.
func dlqPurge(ctx context.Context, q *dlq.Queue, sel dlq.Selection, limit int, stdout, stderr io.Writer) error {
	handled := 0
	sum, err := q.Purge(ctx, sel, dlq.PurgeOptions{Limit: limit, Progress: func(r dlq.PurgeResult) {
		handled++
		if r.Err != nil {
			fmt.Fprintf(stderr, "failed %d: %v\n", r.Letter.Sequence, r.Err)
			return
		}
		fmt.Fprintf(stderr, "purged %d (%s, %s)\n", r.Letter.Sequence, r.Letter.Reason, r.Letter.Subject)
	}})
	fmt.Fprintf(stdout, "purged %d, failed %d\n", sum.Purged, sum.Failed)
	switch {
	case err != nil:
		return err
	case sum.Failed > 0:
		return &exitError{code: 1, err: fmt.Errorf("dlq purge: %d failed", sum.Failed)}
	case missingSequences(sel, limit, handled):
		return &exitError{code: 1, err: fmt.Errorf("dlq purge: %d of the %d sequences given hold no dead letter of this consumer matching the filters",
			len(sel.Sequences)-handled, len(sel.Sequences))}
	}
	return nil
}

// missingSequences reports whether sequences were given and fewer dead
// letters than that were handled, without a limit to explain it.
func missingSequences(sel dlq.Selection, limit, handled int) bool {
	n := len(sel.Sequences)
	return n > 0 && handled < n && (limit == 0 || handled < limit)
}

// retryHint says when a kept dead letter can be replayed.
func retryHint(at time.Time) string {
	if at.IsZero() {
		return "retry later (the duplicate window is unknown)"
	}
	in := time.Until(at).Round(time.Second)
	if in <= 0 {
		return "retry now: the window has passed (" + at.UTC().Format(time.RFC3339) + ")"
	}
	return "retry after " + at.UTC().Format(time.RFC3339) + " (in " + in.String() + ")"
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}
