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
		// Every field of a dead letter is as its writer chose: cleaned.
		subject := cell(d.Subject, 1<<10)
		switch {
		case r.Outcome == dlq.WouldReplay:
			fmt.Fprintf(stdout, "would replay %d (%s sequence %d) to %s (%s, %s)\n", d.Sequence, cell(d.Stream, 64), d.StreamSequence, subject, cell(d.Reason, 64), plural(d.Attempts, "attempt"))
			return
		case r.Outcome == dlq.Refused && opts.DryRun:
			fmt.Fprintf(stdout, "would refuse %d: %s\n", d.Sequence, r.Why)
			return
		}
		switch r.Outcome {
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
			fmt.Fprintf(stderr, "failed %d: %s\n", d.Sequence, cell(r.Err.Error(), 0))
		case dlq.Refused:
			counts.Refused++
			fmt.Fprintf(stderr, "refused %d: %s; courier writes no such dead letter: it is kept and never republished (look at it with 'courier dlq show %d', remove it with 'courier dlq purge --yes %d')\n",
				d.Sequence, r.Why, d.Sequence, d.Sequence)
		}
		if handled%replayProgressEvery == 0 || time.Since(lastReport) >= time.Second {
			lastReport = time.Now()
			fmt.Fprintf(stderr, "progress: %d handled so far: replayed %d, kept %d, failed %d%s\n", handled, counts.Replayed, counts.Kept, counts.Failed, refusedCount(counts.Refused))
		}
	}
	sum, err := q.Replay(ctx, sel, opts)
	if opts.DryRun {
		fmt.Fprintf(stdout, "dry run: would replay %d%s, nothing changed\n", sum.WouldReplay, refusedCount(sum.Refused))
	} else {
		fmt.Fprintf(stdout, "replayed %d, kept %d (duplicate window), failed %d%s\n", sum.Replayed, sum.Kept, sum.Failed, refusedCount(sum.Refused))
		if sum.Kept > 1 {
			fmt.Fprintf(stderr, "the kept dead letters can be replayed again %s\n", strings.TrimPrefix(retryHint(sum.RetryAt), "retry "))
		}
	}
	switch {
	case err != nil:
		return err
	case sum.Kept+sum.Failed+sum.Refused > 0:
		return &exitError{code: 1, err: fmt.Errorf("dlq replay: %d kept, %d failed%s", sum.Kept, sum.Failed, refusedCount(sum.Refused))}
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
		fmt.Fprintf(stderr, "purged %d (%s, %s)\n", r.Letter.Sequence, cell(r.Letter.Reason, 64), cell(r.Letter.Subject, 1<<10))
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

// refusedCount is ", refused N" for the summaries, or "" when none was
// refused (the usual case, whose summary stays as it was).
func refusedCount(n int) string {
	if n == 0 {
		return ""
	}
	return ", refused " + strconv.Itoa(n)
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
