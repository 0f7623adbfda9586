package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/partition"
	"github.com/courierhq/courier/rewind"
)

// The rewind of a durable split into partitions (COURIER_ORDER_PARTITIONS).
// Its work stream is a work queue that keeps nothing acked, so there is no
// consumer to reset: the work stream copies the stream again from the
// rewind's point instead (partition.Durable.Resource), in stream order,
// each copy naming the stream's sequence, so that the couriers, which watch
// the rewind's record as for a plain durable, deliver the range again as a
// replay. What the work stream held and no partition had delivered yet
// gives way to its copy, which comes in its turn behind the key's earlier
// messages; the partitions are paused meanwhile so that none is delivered
// in between. What a courier holds of it unsent (a key's retried message,
// those behind it) is superseded by its copy once the record says where
// the work stream stood and the generation of its new source
// (rewind.Record.Copied, Generation) and the courier has confirmed both
// against the work stream (confirmRewind): acked unsent, and the key's
// replay does not wait for the retry.

// partitionedPlan is what a rewind of a partitioned durable would do.
type partitionedPlan struct {
	d                *partition.Durable
	stream, consumer string
	from, to         uint64 // the stream's sequences, both included
	messages         uint64 // the durable's messages in the range
	parts            []jetstream.ConsumerInfo
}

// planPartitionedRewind finds the range a rewind of cfg's partitioned
// durable to at (or to seq, when at is zero) covers.
func planPartitionedRewind(ctx context.Context, js jetstream.JetStream, cfg config.Config, at time.Time, seq uint64) (partitionedPlan, error) {
	p := partitionedPlan{stream: cfg.Stream, consumer: cfg.Consumer}
	d, err := partition.Find(ctx, js, cfg.Stream, cfg.Consumer)
	if err != nil {
		return p, err
	}
	if d == nil || len(d.Consumers) == 0 {
		if why := missingConsumer(ctx, js, cfg); why != nil {
			return p, why
		}
		return p, fmt.Errorf("rewind: the partitions' work stream of %s/%s is not there: start a courier of the durable first", cfg.Stream, cfg.Consumer)
	}
	p.d = d
	for _, c := range d.Consumers {
		p.parts = append(p.parts, *c.CachedInfo())
	}
	stream, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return p, fmt.Errorf("stream %q: %w", cfg.Stream, err)
	}
	st := stream.CachedInfo().State
	if at.IsZero() {
		p.from = max(seq, st.FirstSeq)
	} else if p.from, err = seqAtTime(ctx, js, cfg.Stream, at); err != nil {
		return p, err
	}
	if st.Msgs == 0 || p.from > st.LastSeq {
		return p, fmt.Errorf("rewind: stream %q holds no message at or after that point (its sequences are %d to %d)", cfg.Stream, st.FirstSeq, st.LastSeq)
	}
	// The range ends with the stream's last message: which of them each
	// partition has delivered is known only by the work stream's own
	// sequences, and a message none had delivered yet is delivered once,
	// in the range.
	p.to = st.LastSeq
	var filters []string
	for _, t := range d.Work.CachedInfo().Config.Sources[0].SubjectTransforms {
		filters = append(filters, t.Source)
	}
	p.messages = rangeCount(ctx, js, cfg.Stream, jetstream.ConsumerConfig{FilterSubjects: filters}, p.from)
	return p, nil
}

// describe says what p would do.
func (p partitionedPlan) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rewind %s/%s in %d partitions (work stream %s)\n", p.stream, p.consumer, len(p.parts), p.d.Work.CachedInfo().Config.Name)
	fmt.Fprintf(&b, "  stream sequences %d to %d: %d message(s) of the durable delivered again, marked Courier-Replay\n", p.from, p.to, p.messages)
	fmt.Fprintf(&b, "  the work stream copies the stream again from sequence %d, in stream order; every partition rewinds:\n", p.from)
	for _, c := range p.parts {
		fmt.Fprintf(&b, "    %s: pending %d, ack pending %d\n", c.Name, c.NumPending, c.NumAckPending)
	}
	b.WriteString("  what a partition had not delivered yet gives way to its copy; the couriers keep running, and what they hold is delivered once\n")
	return b.String()
}

// apply, with the partitions paused, stores p's rewind record, for the
// couriers' watches, re-sources the work stream from p.from, stores where
// the work stream stood before and the generation of its new source
// (Record.Copied, Generation: what it held of the range is superseded by
// the copies) and removes what no partition had delivered of the range
// (its copy follows). The partitions resume once the watches have heard of
// Copied and confirmed it: a key's retried message that comes back then is
// acked unsent, and its copy goes in its key's order.
func (p partitionedPlan) apply(ctx context.Context, js jetstream.JetStream, cfg config.Config, stdout io.Writer) error {
	kv, err := rewind.Open(ctx, js, cfg.Stream, cfg.Consumer, cfg.StreamReplicas)
	if err != nil {
		return err
	}
	// Paused first: no retry comes back between the record and Copied,
	// to be delivered as a replay before its key's earlier copies.
	resume, err := p.pause(ctx, stdout)
	if err != nil {
		return err
	}
	defer resume()
	now := time.Now()
	rec := rewind.Record{ID: rewind.NewID(now), Stream: p.stream, From: p.from, To: p.to, At: now.UTC()}
	if err := rewind.Write(ctx, kv, rec); err != nil {
		return err
	}
	if err := watchGrace(ctx); err != nil {
		_ = kv.Delete(context.WithoutCancel(ctx), rec.ID) // nothing is delivered again
		return err
	}
	res, err := p.d.Resource(ctx, js, p.from)
	if err != nil {
		_ = kv.Delete(context.WithoutCancel(ctx), rec.ID)
		return fmt.Errorf("rewind: %w", err)
	}
	// Only now that the copies come: a message superseded is acked unsent.
	rec.Copied, rec.CopiedAt, rec.Generation = res.Last, res.LastAt, res.Generation
	copiedErr := rewind.Write(ctx, kv, rec)
	gaveWay, err := p.giveWay(ctx, cfg.OrderPartitions, res.Generation)
	if copiedErr == nil {
		if err := watchGrace(ctx); err != nil {
			return err
		}
	}
	switch {
	case copiedErr != nil:
		// The range is delivered again all the same; a key's message
		// retried at the rewind is delivered before its key's copies.
		return fmt.Errorf("rewind %s: the work stream copies the range again, but storing where it stood failed (a key's message retried at the rewind goes before its key's replay): %w", rec.ID, copiedErr)
	case err != nil:
		// What was not removed is superseded by its copy all the same.
		return fmt.Errorf("rewind %s: the work stream copies the range again, but removing what the partitions had not delivered failed (each is acked unsent, its copy delivered): %w", rec.ID, err)
	}
	fmt.Fprintf(stdout, "rewound %s/%s (%d partitions) to stream sequence %d: rewind %s delivers sequences %d to %d again (Courier-Replay: %s); %d message(s) not delivered yet come in their turn\n",
		p.stream, p.consumer, len(p.parts), p.from, rec.ID, p.from, p.to, rec.ID, gaveWay)
	return nil
}

// watchGrace waits rewindWatchGrace, for the couriers' watches to hear of a
// rewind record stored.
func watchGrace(ctx context.Context) error {
	select {
	case <-time.After(rewindWatchGrace):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// rewindPauseFor bounds the pause of the partitions during a rewind: should
// the command die, they resume by themselves.
const rewindPauseFor = time.Minute

// pause pauses every partition for the rewind, unless one is paused
// already (an operator's courier pause, which the rewind leaves as it is);
// the returned resume undoes it.
func (p partitionedPlan) pause(ctx context.Context, stdout io.Writer) (resume func(), err error) {
	for _, c := range p.parts {
		if c.Paused {
			return func() {}, nil
		}
	}
	if err := p.d.Pause(ctx, time.Now().Add(rewindPauseFor)); err != nil {
		return nil, fmt.Errorf("rewind: pausing the partitions: %w", err)
	}
	return func() {
		if err := p.d.Pause(context.WithoutCancel(ctx), time.Time{}); err != nil {
			fmt.Fprintf(stdout, "rewind: resuming the partitions: %v (they resume by themselves within %s)\n", err, rewindPauseFor)
		}
	}, nil
}

// giveWay removes from the work stream what no partition had delivered of
// the range, copied before the source's generation gen: its copy of gen
// comes in stream order, behind its key's earlier messages. It returns how
// many it removed.
func (p partitionedPlan) giveWay(ctx context.Context, partitions, gen int) (int, error) {
	n := 0
	var errs []error
	for i := range partitions {
		copies, err := p.d.Undelivered(ctx, i)
		if err != nil {
			errs = append(errs, err)
		}
		for _, c := range copies {
			if c.Generation >= gen || c.Origin < p.from {
				continue
			}
			if err := p.d.Delete(ctx, c.Seq); err != nil {
				errs = append(errs, err)
				continue
			}
			n++
		}
	}
	return n, errors.Join(errs...)
}

// partitionedRewindProgress says how far r has come on d's work stream:
// every message of the stream before the first it holds is settled.
func partitionedRewindProgress(ctx context.Context, d *partition.Durable, r rewind.Record) string {
	first, caughtUp, err := d.Position(ctx)
	switch {
	case err != nil:
		return fmt.Sprintf("%s (asked %s): sequences %d to %d, progress unknown: %v", r.ID, r.At.UTC().Format(time.RFC3339), r.From, r.To, err)
	case first == 0 && caughtUp:
		return rewindProgress(r, r.To)
	case first == 0:
		return rewindProgress(r, 0)
	}
	return rewindProgress(r, first-1)
}

// printPartitionedRewind adds the durable's last rewind, if any, to courier
// status.
func printPartitionedRewind(ctx context.Context, js jetstream.JetStream, cfg config.Config, d *partition.Durable, w io.Writer) {
	if r := lastRewind(ctx, js, cfg); r != nil {
		fmt.Fprintf(w, "rewind\t%s\n", partitionedRewindProgress(ctx, d, *r))
	}
}
