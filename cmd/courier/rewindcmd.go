package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/partition"
	"github.com/courierhq/courier/proxy"
	"github.com/courierhq/courier/rewind"
)

const rewindUsage = `Usage:
  courier rewind --to-time RFC3339 [--yes]
  courier rewind --to-seq N [--yes]

rewind makes the durable consumer COURIER_CONSUMER deliver again every
message of COURIER_STREAM from a time or a stream sequence on (JetStream's
consumer reset, nats-server 2.14 or later), while its couriers keep
running. The messages delivered again reach the app although their keys
were recorded, once each, with the header Courier-Replay: <rewind id>.
Without --yes it prints what it would do and changes nothing (exit 2).
A durable split into partitions (COURIER_ORDER_PARTITIONS) rewinds whole:
its work stream copies the stream again from the point, in stream order.
Same environment as the sidecar; COURIER_APP_URL is not needed.
`

// rewindWatchGrace is how long rewind waits between storing its record and
// resetting the consumer: the couriers' watches hear of a record within
// milliseconds, and one that has not by then would take what is delivered
// again for duplicates.
var rewindWatchGrace = time.Second

// runRewind runs `courier rewind`.
func runRewind(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("courier rewind", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	toTime := fs.String("to-time", "", "")
	toSeq := fs.Uint64("to-seq", 0, "")
	yes := fs.Bool("yes", false, "")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, rewindUsage)
		return nil
	} else if err != nil {
		return usageError("rewind: %v (see 'courier rewind --help')", err)
	}
	if fs.NArg() > 0 {
		return usageError("rewind: unexpected argument %q (see 'courier rewind --help')", fs.Arg(0))
	}
	var at time.Time
	switch {
	case (*toTime == "") == (*toSeq == 0):
		return usageError("rewind: give --to-time or --to-seq (one of them)")
	case *toTime != "":
		t, err := time.Parse(time.RFC3339, *toTime)
		if err != nil {
			return usageError("rewind: --to-time %q is not an RFC 3339 time (e.g. 2026-12-01T08:00:00Z)", *toTime)
		}
		at = t
	}
	cfg, js, closeConn, err := consumerCommand("rewind", environ, stderr)
	if err != nil {
		return err
	}
	defer closeConn()
	if partitioned(cfg) {
		plan, err := planPartitionedRewind(ctx, js, cfg, at, *toSeq)
		if err != nil {
			return err
		}
		fmt.Fprint(stdout, plan.describe())
		if !*yes {
			return &exitError{code: 2, err: errors.New("rewind: nothing changed; run again with --yes to rewind")}
		}
		return plan.apply(ctx, js, cfg, stdout)
	}
	plan, err := planRewind(ctx, js, cfg, at, *toSeq)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, plan.describe())
	if !*yes {
		return &exitError{code: 2, err: errors.New("rewind: nothing changed; run again with --yes to rewind")}
	}
	return plan.apply(ctx, js, cfg, stdout)
}

// rewindPlan is what a rewind of the durable would do.
type rewindPlan struct {
	stream, consumer string
	from, to         uint64 // stream sequences, both included
	messages         uint64 // the durable's messages in the range
	pending          uint64 // the durable's messages after it, not delivered yet
	policy           jetstream.DeliverPolicy
}

// planRewind finds the range a rewind to at (or to seq, when at is zero)
// covers, and checks the server can reset the durable.
func planRewind(ctx context.Context, js jetstream.JetStream, cfg config.Config, at time.Time, seq uint64) (rewindPlan, error) {
	p := rewindPlan{stream: cfg.Stream, consumer: cfg.Consumer}
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		if why := missingConsumer(ctx, js, cfg); why != nil {
			return p, why
		}
		return p, fmt.Errorf("consumer %q on stream %q: %w", cfg.Consumer, cfg.Stream, err)
	}
	info := cons.CachedInfo()
	p.policy = info.Config.DeliverPolicy
	if err := resettable(info.Config, cfg); err != nil {
		return p, err
	}
	if err := resetSupported(js); err != nil {
		return p, err
	}
	stream, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return p, fmt.Errorf("stream %q: %w", cfg.Stream, err)
	}
	st := stream.CachedInfo().State
	// The range ends where the durable has delivered up to: what it has not
	// delivered yet is delivered once, as usual, not as a replay.
	p.to = info.Delivered.Stream
	if at.IsZero() {
		p.from = max(seq, st.FirstSeq)
	} else if p.from, err = seqAtTime(ctx, js, cfg.Stream, at); err != nil {
		return p, err
	}
	if st.Msgs == 0 || p.from > st.LastSeq {
		return p, fmt.Errorf("rewind: stream %q holds no message at or after that point (its sequences are %d to %d)", cfg.Stream, st.FirstSeq, st.LastSeq)
	}
	if p.from > p.to {
		return p, fmt.Errorf("rewind: consumer %q has delivered nothing from stream sequence %d on (it has delivered up to %d): there is nothing to deliver again", cfg.Consumer, p.from, p.to)
	}
	if info.Config.OptStartSeq > p.from {
		return p, fmt.Errorf("rewind: consumer %q starts at stream sequence %d (its deliver policy); the server cannot rewind it to %d, before its start", cfg.Consumer, info.Config.OptStartSeq, p.from)
	}
	p.pending = info.NumPending
	if n := rangeCount(ctx, js, cfg.Stream, info.Config, p.from); n > info.NumPending {
		p.messages = n - info.NumPending
	}
	return p, nil
}

// resettable says plainly why the server would refuse to reset the durable
// made as c: it resets only those that deliver all, or from a start
// sequence or time.
func resettable(c jetstream.ConsumerConfig, cfg config.Config) error {
	switch c.DeliverPolicy {
	case jetstream.DeliverAllPolicy, jetstream.DeliverByStartSequencePolicy, jetstream.DeliverByStartTimePolicy:
		return nil
	}
	return fmt.Errorf("rewind: consumer %q on stream %q delivers %s messages only (made with COURIER_DELIVER_POLICY=%s), and the server resets only a durable that delivers all, or from a start sequence or time. "+
		"A durable's deliver policy cannot change in place: stop its couriers, remove the consumer (nats consumer rm %s %s), and start them again with COURIER_DELIVER_POLICY=all; "+
		"the durable they make delivers the whole stream once, dedup skips what was processed, and rewind works on it from then on",
		cfg.Consumer, cfg.Stream, c.DeliverPolicy, cfg.DeliverPolicy, cfg.Stream, cfg.Consumer)
}

// resetSupported refuses a server older than 2.14, which has no consumer
// reset.
func resetSupported(js jetstream.JetStream) error {
	v := js.Conn().ConnectedServerVersion()
	if v == "" || versionAtLeast(v, 2, 14) {
		return nil
	}
	return fmt.Errorf("rewind: the server is nats-server %s; rewinding a consumer needs JetStream's consumer reset, nats-server 2.14 or later", v)
}

// versionAtLeast reports whether v (major.minor.patch, perhaps with a
// suffix) is major.minor or later.
func versionAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return true // unknown: the server's own answer decides
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return true
	}
	return ma > major || ma == major && mi >= minor
}

// seqAtTime is the sequence of the first message stored in stream at or
// after t: a message get by start_time (nats-server 2.11+), which nats.go
// has no option for.
func seqAtTime(ctx context.Context, js jetstream.JetStream, stream string, t time.Time) (uint64, error) {
	prefix := js.Options().APIPrefix
	if prefix == "" {
		prefix = jetstream.DefaultAPIPrefix
	}
	if !strings.HasSuffix(prefix, ".") {
		prefix += "."
	}
	req, err := json.Marshal(struct {
		StartTime time.Time `json:"start_time"`
		NoHeaders bool      `json:"no_hdr"`
	}{t.UTC(), true})
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	msg, err := js.Conn().RequestWithContext(ctx, prefix+"STREAM.MSG.GET."+stream, req)
	if err != nil {
		return 0, fmt.Errorf("rewind: finding the message of stream %q at %s: %w", stream, t.UTC().Format(time.RFC3339), err)
	}
	var resp struct {
		Message *struct {
			Seq uint64 `json:"seq"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("rewind: finding the message of stream %q at %s: %w", stream, t.UTC().Format(time.RFC3339), err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return 0, fmt.Errorf("rewind: stream %q holds no message stored at or after %s", stream, t.UTC().Format(time.RFC3339))
		}
		return 0, fmt.Errorf("rewind: finding the message of stream %q at %s: %w", stream, t.UTC().Format(time.RFC3339), resp.Error)
	}
	if resp.Message == nil {
		return 0, fmt.Errorf("rewind: finding the message of stream %q at %s: an empty answer", stream, t.UTC().Format(time.RFC3339))
	}
	return resp.Message.Seq, nil
}

// rangeCount counts the messages of stream from from on that the durable
// made as c delivers: those of its filter subjects. 0 if the server cannot
// say.
func rangeCount(ctx context.Context, js jetstream.JetStream, stream string, c jetstream.ConsumerConfig, from uint64) uint64 {
	// A short-lived consumer from `from`, whose pending count is what it
	// would deliver of the stream's messages up to now. It goes at once.
	ec, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		FilterSubjects: filtersOf(c), DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from,
		AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: 5 * time.Second, MemoryStorage: true,
	})
	if err != nil {
		return 0
	}
	n := ec.CachedInfo().NumPending
	_ = js.DeleteConsumer(ctx, stream, ec.CachedInfo().Name)
	return n
}

// filtersOf are c's filter subjects, one or many.
func filtersOf(c jetstream.ConsumerConfig) []string {
	if c.FilterSubject != "" {
		return []string{c.FilterSubject}
	}
	return c.FilterSubjects
}

// describe says what p would do.
func (p rewindPlan) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rewind %s/%s (deliver policy %s)\n", p.stream, p.consumer, p.policy)
	fmt.Fprintf(&b, "  stream sequences %d to %d: %d message(s) of the durable delivered again, marked Courier-Replay\n", p.from, p.to, p.messages)
	fmt.Fprintf(&b, "  after them, %d message(s) not delivered yet are delivered once, as usual\n", p.pending)
	b.WriteString("  the couriers keep running; what they hold is delivered once\n")
	return b.String()
}

// apply stores p's rewind record, for the couriers' watches, then resets
// the durable to p.from.
func (p rewindPlan) apply(ctx context.Context, js jetstream.JetStream, cfg config.Config, stdout io.Writer) error {
	kv, err := rewind.Open(ctx, js, cfg.Stream, cfg.Consumer, cfg.StreamReplicas)
	if err != nil {
		return err
	}
	now := time.Now()
	rec := rewind.Record{ID: rewind.NewID(now), Stream: p.stream, From: p.from, To: p.to, At: now.UTC()}
	if err := rewind.Write(ctx, kv, rec); err != nil {
		return err
	}
	if err := watchGrace(ctx); err != nil {
		return err
	}
	resp, err := js.ResetConsumerToSequence(ctx, p.stream, p.consumer, p.from)
	if err != nil {
		_ = kv.Delete(context.WithoutCancel(ctx), rec.ID) // nothing is delivered again
		var apiErr *jetstream.APIError
		switch {
		case errors.Is(err, jetstream.ErrConsumerInvalidReset):
			return fmt.Errorf("rewind: the server refused to reset consumer %q to stream sequence %d (deliver policy %s): %w", p.consumer, p.from, p.policy, err)
		case errors.As(err, &apiErr):
			return fmt.Errorf("rewind: resetting consumer %q on stream %q: %w", p.consumer, p.stream, err)
		}
		return fmt.Errorf("rewind: resetting consumer %q on stream %q (consumer reset needs nats-server 2.14 or later): %w", p.consumer, p.stream, err)
	}
	fmt.Fprintf(stdout, "rewound %s/%s to stream sequence %d: rewind %s delivers sequences %d to %d again (Courier-Replay: %s)\n",
		p.stream, p.consumer, resp.ResetSeq, rec.ID, p.from, p.to, rec.ID)
	return nil
}

// lastRewind is the durable's newest rewind, nil if it has had none.
func lastRewind(ctx context.Context, js jetstream.JetStream, cfg config.Config) *rewind.Record {
	kv, err := js.KeyValue(ctx, rewind.BucketName(cfg.Stream, cfg.Consumer))
	if err != nil {
		return nil
	}
	recs, err := rewind.Read(ctx, kv)
	if err != nil || len(recs) == 0 {
		return nil
	}
	return &recs[len(recs)-1]
}

// rewindProgress says how far r has come, the durable's ack floor being at
// floor: every message up to it is settled.
func rewindProgress(r rewind.Record, floor uint64) string {
	what := fmt.Sprintf("%s (asked %s): sequences %d to %d", r.ID, r.At.UTC().Format(time.RFC3339), r.From, r.To)
	switch {
	case floor >= r.To:
		return what + ", done"
	case floor < r.From:
		return what + ", in progress: none settled yet"
	}
	return fmt.Sprintf("%s, in progress: settled up to %d (%d of %d)", what, floor, floor-r.From+1, r.To-r.From+1)
}

// watchRewinds keeps the view of the durable's rewinds for the delivery
// loop. A courier that cannot (a server or permissions without the bucket)
// runs without: a rewind's messages are then duplicates to it, as the
// warning says.
func (p *path) watchRewinds(ctx context.Context) {
	kv, err := rewind.Open(ctx, p.js, p.cfg.Stream, p.cfg.Consumer, p.cfg.StreamReplicas)
	if err == nil {
		p.rewinds, p.stopRewinds, err = rewind.Watch(ctx, kv, p.confirmRewind, p.log.With("component", "rewind"))
	}
	if err != nil {
		p.log.Warn("cannot watch the durable's rewinds: messages a rewind delivers again will be taken for duplicates", "error", err)
	}
}

// confirmRewind checks a rewind record's copy point (rewind.Confirm)
// against the partitions' work stream (partition.Durable.Confirm). A
// durable without partitions has no work stream, and its rewinds name no
// copy point.
func (p *path) confirmRewind(ctx context.Context, r rewind.Record) error {
	if p.parts == nil {
		return errors.New("the durable is not split into partitions")
	}
	return p.parts.Confirm(ctx, r.Stream, r.From, partition.Resourced{Generation: r.Generation, Last: r.Copied, LastAt: r.CopiedAt})
}

// rewindsView is the view for the delivery loop; nil when there is none.
func (p *path) rewindsView() proxy.Rewinds {
	if p.rewinds == nil {
		return nil
	}
	return p.rewinds
}
