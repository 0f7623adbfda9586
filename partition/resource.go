package partition

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natshdr"
	"github.com/courierhq/courier/internal/retry"
	"github.com/courierhq/courier/internal/subject"
)

// Re-sourcing a work stream from an earlier message of the consumed stream
// (`courier rewind` of a partitioned durable; docs/operations.md,
// "Reprocess after a bad deploy"). The work stream is a work queue: it
// keeps nothing that was acked, so a rewind cannot reset the partitions'
// consumers as it resets a plain durable. Instead the work stream copies the
// consumed stream again from the rewind's point, in stream order, through
// its one source: each message it copies names the consumed stream's
// sequence (Nats-Stream-Source), so the couriers know the copies of the
// rewind's range for what they are.
//
// A source restarts only under a new identity: the server keeps each
// source's position under its index name (its stream, filters and
// transform destinations, nats-server stream.go composeIName), and a source
// added back under a name it knew resumes where that name's last copy in
// the work stream stands, whatever its start says. So each re-sourcing
// writes the partition count of the transforms with one more leading zero
// ("{{partition(04,2)}}", then "{{partition(004,2)}}"): the same function
// to the server (it reads the count as a number), a new index name, never
// used before. Its generation is that count of zeros; SamePartitioning
// reads past it.

// Generation is how many times the work stream cfg was re-sourced: the
// zeros in front of the partition count of its source's transforms
// (subject.Generation).
func Generation(cfg jetstream.StreamConfig) int {
	if len(cfg.Sources) != 1 || len(cfg.Sources[0].SubjectTransforms) == 0 {
		return 0
	}
	return subject.Generation(cfg.Sources[0].SubjectTransforms[0].Destination)
}

// atGeneration is the transforms trs written for generation gen.
func atGeneration(trs []jetstream.SubjectTransformConfig, gen int) []jetstream.SubjectTransformConfig {
	out := make([]jetstream.SubjectTransformConfig, len(trs))
	for i, t := range trs {
		t.Destination = subject.AtGeneration(t.Destination, gen)
		out[i] = t
	}
	return out
}

// Resourced is what Resource did: the generation of the work stream's new
// source, and where the work stream stood just before (its last sequence,
// and when it stored that message): every copy the new source makes comes
// after it.
type Resourced struct {
	Generation int
	Last       uint64
	LastAt     time.Time
}

// Resource makes the work stream copy the consumed stream again from its
// sequence from on, under a new generation of its source. The copies come
// after what the work stream holds; the source goes on with the messages
// stored later, as before. The partitions' consumers, their pins and the
// couriers are left as they are.
func (d *Durable) Resource(ctx context.Context, js jetstream.JetStream, from uint64) (Resourced, error) {
	info, err := d.Work.Info(ctx)
	if err != nil {
		return Resourced{}, fmt.Errorf("reading the partitions' work stream: %w", err)
	}
	cfg := info.Config
	if len(cfg.Sources) != 1 || cfg.Sources[0].Name != d.stream {
		return Resourced{}, fmt.Errorf("the partitions' work stream %s does not copy stream %s alone (%s): courier did not make it so, and will not re-source it", cfg.Name, d.stream, describeSources(cfg))
	}
	r := Resourced{Generation: Generation(cfg) + 1, Last: info.State.LastSeq, LastAt: info.State.LastTime}
	src := *cfg.Sources[0]
	src.SubjectTransforms = atGeneration(src.SubjectTransforms, r.Generation)
	src.OptStartSeq, src.OptStartTime = from, nil
	cfg.Sources = []*jetstream.StreamSource{&src}
	// A work stream made by an earlier courier kept its stream's
	// duplicate window: the copies of messages with a Nats-Msg-Id stored
	// within it would be dropped as duplicates, and never delivered.
	cfg.Duplicates = 0
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return Resourced{}, fmt.Errorf("re-sourcing the partitions' work stream %s from sequence %d of %s: %w", cfg.Name, from, d.stream, err)
	}
	return r, nil
}

// Confirm checks r, what a rewind's record says Resource did for a rewind
// of stream from its sequence from on (package rewind, Record.Copied),
// against the work stream as it is now: its one source copies stream from
// from on at generation r.Generation, and it has stored r.Last by r.LastAt.
// Whoever can write the rewinds' bucket can write any record, and couriers
// ack unsent the copies a record's copy point names: confirmed, it names
// only copies of an earlier generation of messages from from on, which the
// current source copies again (docs/threat-model.md). A read of the work
// stream that fails is tried again a few times, briefly, then refuses.
func (d *Durable) Confirm(ctx context.Context, stream string, from uint64, r Resourced) error {
	if r.Generation < 1 {
		return errors.New("it names no generation of the work stream's source (written before records named one, or by no rewind)")
	}
	if stream != d.stream {
		return fmt.Errorf("it is of stream %s, and the work stream copies %s", stream, d.stream)
	}
	var info *jetstream.StreamInfo
	tries := 0
	err := retry.Do(ctx, retry.Policy{Initial: 100 * time.Millisecond, Max: 500 * time.Millisecond}, func(ctx context.Context) error {
		var err error
		info, err = d.Work.Info(ctx)
		if tries++; err != nil && tries >= confirmTries {
			return retry.Permanent(err)
		}
		return err
	}, nil)
	if err != nil {
		return fmt.Errorf("reading the partitions' work stream: %w", err)
	}
	cfg := info.Config
	switch {
	case len(cfg.Sources) != 1 || cfg.Sources[0].Name != d.stream:
		return fmt.Errorf("the work stream %s does not copy stream %s alone (%s)", cfg.Name, d.stream, describeSources(cfg))
	case Generation(cfg) != r.Generation:
		return fmt.Errorf("it names generation %d of the work stream's source, which is at generation %d", r.Generation, Generation(cfg))
	case cfg.Sources[0].OptStartSeq != from:
		return fmt.Errorf("it starts at sequence %d of %s, and the work stream's source at %d", from, d.stream, cfg.Sources[0].OptStartSeq)
	case r.Last > info.State.LastSeq:
		return fmt.Errorf("it says the work stream stood at sequence %d, past its last, %d", r.Last, info.State.LastSeq)
	case r.LastAt.After(info.State.LastTime):
		return fmt.Errorf("it says the work stream stood there at %s, after its last message, stored %s",
			r.LastAt.UTC().Format(time.RFC3339Nano), info.State.LastTime.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// confirmTries is how many times Confirm reads the work stream before it
// refuses.
const confirmTries = 4

// Copy is a message of the work stream as Resource sees it: where it is in
// the work stream, and the consumed stream's message it copies.
type Copy struct {
	// Seq is its sequence in the work stream, Origin the consumed
	// stream's sequence it copies.
	Seq, Origin uint64
	// Generation is the generation of the source that copied it.
	Generation int
}

// Undelivered returns the messages of partition i of the work stream that
// its consumer has not delivered yet (after its delivered sequence, as read
// now), in the work stream's order.
func (d *Durable) Undelivered(ctx context.Context, i int) ([]Copy, error) {
	name := ConsumerName(d.consumer, i)
	c, err := d.Work.Consumer(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("consumer %q of partition %d: %w", name, i, err)
	}
	var out []Copy
	subj := FilterSubject(i)
	for seq := c.CachedInfo().Delivered.Stream + 1; ; {
		m, err := d.Work.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("reading partition %d of the work stream at %d: %w", i, seq, err)
		}
		cp := Copy{Seq: m.Sequence}
		if _, origin, _, ok := natshdr.Source(m.Header); ok {
			cp.Origin = origin
			cp.Generation = generationOf(m.Header)
		}
		out = append(out, cp)
		seq = m.Sequence + 1
	}
}

// generationOf reads the generation of the source that copied a message
// from its Nats-Stream-Source header h.
func generationOf(h nats.Header) int {
	return subject.Generation(natshdr.SourceDestinations(h))
}

// Delete removes the message at seq from the work stream; one already gone
// (acked meanwhile) is no error.
func (d *Durable) Delete(ctx context.Context, seq uint64) error {
	err := d.Work.DeleteMsg(ctx, seq)
	if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) || errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		return nil
	}
	return fmt.Errorf("deleting message %d of the work stream: %w", seq, err)
}

// Position is how far the work stream has come with the consumed stream:
// the consumed stream's sequence of its first message (0 when it holds
// none), and whether its source has copied all there is (a lag of 0).
func (d *Durable) Position(ctx context.Context) (first uint64, caughtUp bool, err error) {
	info, err := d.Work.Info(ctx)
	if err != nil {
		return 0, false, err
	}
	caughtUp = len(info.Sources) == 1 && info.Sources[0].Lag == 0
	if info.State.Msgs == 0 {
		return 0, caughtUp, nil
	}
	m, err := d.Work.GetMsg(ctx, info.State.FirstSeq, jetstream.WithGetMsgSubject(">"))
	if err != nil {
		return 0, caughtUp, err
	}
	_, origin, _, _ := natshdr.Source(m.Header)
	return origin, caughtUp, nil
}
