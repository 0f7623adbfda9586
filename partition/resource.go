package partition

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natshdr"
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

// partitionArg is where a destination's partition count starts, with the
// zeros a re-sourcing put in front of it.
var partitionArg = regexp.MustCompile(`\{\{partition\((0*)`)

// Generation is how many times the work stream cfg was re-sourced: the
// zeros in front of the partition count of its source's transforms.
func Generation(cfg jetstream.StreamConfig) int {
	if len(cfg.Sources) != 1 || len(cfg.Sources[0].SubjectTransforms) == 0 {
		return 0
	}
	m := partitionArg.FindStringSubmatch(cfg.Sources[0].SubjectTransforms[0].Destination)
	if m == nil {
		return 0
	}
	return len(m[1])
}

// atGeneration is the transforms trs written for generation gen.
func atGeneration(trs []jetstream.SubjectTransformConfig, gen int) []jetstream.SubjectTransformConfig {
	out := make([]jetstream.SubjectTransformConfig, len(trs))
	for i, t := range trs {
		t.Destination = partitionArg.ReplaceAllString(t.Destination, "{{partition("+strings.Repeat("0", gen))
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
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return Resourced{}, fmt.Errorf("re-sourcing the partitions' work stream %s from sequence %d of %s: %w", cfg.Name, from, d.stream, err)
	}
	return r, nil
}

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
			cp.Generation = generationOf(m.Header.Get(natshdr.SourceHeader))
		}
		out = append(out, cp)
		seq = m.Sequence + 1
	}
}

// generationOf reads the generation from a Nats-Stream-Source header, whose
// fourth field is the source's transform destinations.
func generationOf(h string) int {
	f := strings.Split(h, " ")
	if len(f) < 4 {
		return 0
	}
	m := partitionArg.FindStringSubmatch(f[3])
	if m == nil {
		return 0
	}
	return len(m[1])
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
