package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/orderkey"
	"github.com/courierhq/courier/ordermark"
	"github.com/courierhq/courier/partition"
	"github.com/courierhq/courier/proxy"
)

// A durable split into partitions by its ordering key
// (COURIER_ORDER_PARTITIONS; package partition, README "Order per key"):
// its set-up beside the stream, the membership each courier keeps while it
// runs, and what status, pause and cleanup do with it.

// partitioned reports whether cfg splits the durable into partitions.
func partitioned(cfg config.Config) bool { return cfg.OrderPartitions >= 2 }

// partitions is what a partitioned durable's courier holds on the server.
type partitions struct {
	work      jetstream.Stream
	consumers []jetstream.Consumer
	marks     *ordermark.Store
	members   *partition.Members
}

// ensurePartitions creates or checks the work stream that sources stream
// with each message's partition in front of its subject, and creates or
// updates the partitions' durable consumers on it. A work stream it
// creates starts as COURIER_DELIVER_POLICY says, or, if the durable of
// COURIER_CONSUMER exists on the stream from before partitions, after its
// ack floor (what it acked out of order is delivered again, and dedup,
// whose keys are the same, recognises it).
func ensurePartitions(ctx context.Context, js jetstream.JetStream, cfg config.Config, stream jetstream.Stream, log *slog.Logger) (jetstream.Stream, []jetstream.Consumer, error) {
	token, _ := orderkey.SubjectToken(cfg.OrderKey) // config.Load checked it
	o := partition.StreamOptions{Source: stream.CachedInfo().Config, Consumer: cfg.Consumer, Filters: cfg.Subjects,
		Token: token, Partitions: cfg.OrderPartitions}
	if cfg.DeliverPolicy == "new" {
		o.StartAt = time.Now()
	}
	old, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err == nil {
		o.StartAfter = old.CachedInfo().AckFloor.Stream
	}
	want, err := partition.StreamConfig(o)
	if err != nil {
		return nil, nil, err
	}
	work, created, err := partition.EnsureStream(ctx, js, want)
	if err != nil {
		if transientSetupError(err) {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("COURIER_ORDER_PARTITIONS: %w", err)
	}
	switch {
	case created && old != nil:
		log.Info("created the partitions' work stream, starting after the ack floor of the durable it replaces (courier no longer reads that durable; `courier cleanup` removes it)",
			"stream", want.Name, "partitions", cfg.OrderPartitions, "after", o.StartAfter, "durable", cfg.Consumer)
	case created:
		log.Info("created the partitions' work stream", "stream", want.Name, "partitions", cfg.OrderPartitions,
			"replicas", want.Replicas)
	}
	consumers := make([]jetstream.Consumer, cfg.OrderPartitions)
	for i := range consumers {
		cc := partitionConsumerConfig(cfg, i)
		if existing, err := js.Consumer(ctx, want.Name, cc.Durable); err == nil {
			keepOperatorSettings(&cc, existing.CachedInfo().Config)
		}
		if consumers[i], err = js.CreateOrUpdateConsumer(ctx, want.Name, cc); err != nil {
			if transientSetupError(err) {
				return nil, nil, err
			}
			return nil, nil, fmt.Errorf("cannot create or update consumer %q of partition %d on stream %q: %w", cc.Durable, i, want.Name, err)
		}
	}
	return work, consumers, nil
}

// setUpPartitions sets up the work stream and the partitions' consumers
// (ensurePartitions), and joins the membership, kept until the stop
// signal (runMembers).
func (p *path) setUpPartitions(ctx context.Context) error {
	parts := &partitions{marks: p.marks}
	err := retrySetup(ctx, p.log, "the partitions' work stream and consumers", func(ctx context.Context) error {
		var err error
		parts.work, parts.consumers, err = ensurePartitions(ctx, p.js, p.cfg, p.stream, p.log)
		return err
	})
	if err != nil {
		return err
	}
	err = retrySetup(ctx, p.log, "the partitions' membership", func(ctx context.Context) error {
		var err error
		parts.members, err = joinMembers(ctx, p.js, p.cfg, p.log, &p.runner)
		return err
	})
	if err != nil {
		return err
	}
	p.parts = parts
	p.stopMembers = runMembers(ctx, parts.members)
	p.log.Info("sharing the durable's partitions with the other couriers", "partitions", p.cfg.OrderPartitions,
		"instance", parts.members.Instance(), "work_stream", parts.work.CachedInfo().Config.Name)
	return nil
}

// partitionConsumerConfig is partition i's durable: the sidecar's durable
// (consumerConfig) on the partition's subjects of the work stream, from
// its first message.
func partitionConsumerConfig(cfg config.Config, i int) jetstream.ConsumerConfig {
	cc := consumerConfig(cfg)
	cc.Durable = partition.ConsumerName(cfg.Consumer, i)
	cc.DeliverPolicy = jetstream.DeliverAllPolicy
	cc.FilterSubject, cc.FilterSubjects = partition.FilterSubject(i), nil
	return cc
}

// memberInterval is how often a courier renews its membership, and
// memberTTL how long it lasts without: a killed courier's partitions are
// taken by the others within memberTTL, or the consumer's PinnedTTL if that
// is longer (the pin must lapse too).
const (
	memberInterval = 2 * time.Second
	memberTTL      = 6 * time.Second
)

// joinMembers joins the durable's membership, which names this courier's
// partitions; its heartbeat carries the pins the runner holds (pins, set
// once the runner exists).
func joinMembers(ctx context.Context, js jetstream.JetStream, cfg config.Config, log *slog.Logger, pins *atomic.Pointer[proxy.Runner]) (*partition.Members, error) {
	return partition.Join(ctx, js, partition.MembersBucket(cfg.Stream, cfg.Consumer), partition.Options{
		Partitions: cfg.OrderPartitions, Interval: memberInterval, TTL: memberTTL, Replicas: cfg.StreamReplicas, Logger: log,
		Pins: func() map[int]string {
			if r := pins.Load(); r != nil {
				return r.Pins()
			}
			return nil
		},
	})
}

// runMembers keeps the membership until ctx ends (the stop signal), then
// leaves it; the returned stop, for close, waits for that (and ends it if
// start-up failed first). It may be called more than once.
func runMembers(ctx context.Context, m *partition.Members) (stop func()) {
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); m.Run(mctx) }()
	return sync.OnceFunc(func() { cancel(); <-done })
}

// runnerPartitions is the runner's view of the partitions; nil without.
func (p *path) runnerPartitions() *proxy.Partitions {
	parts, consumer := p.parts, p.cfg.Consumer
	if parts == nil {
		return nil
	}
	return &proxy.Partitions{
		Consumers:  parts.consumers,
		Assignment: parts.members,
		Marks:      func(i int) proxy.OrderMarks { return parts.marks.Partition(i) },
		Unpin: func(ctx context.Context, i int) error {
			return parts.work.UnpinConsumer(ctx, partition.ConsumerName(consumer, i), orderGroup)
		},
		HandedOn: parts.members.HandedOn,
		Clean:    parts.members.TakeHandedOn,
	}
}

// giveupStream is the stream whose advisories the max-deliveries catch
// follows: the consumed stream, or with partitions the work stream (and the
// stream it copies, which the dead letters name).
func (p *path) giveupStream() (jetstream.Stream, *giveup.Origin) {
	if p.parts == nil {
		return p.stream, nil
	}
	return p.parts.work, &giveup.Origin{Stream: p.stream.CachedInfo(), Consumer: p.cfg.Consumer}
}

// partitionsOf finds the work stream and the partitions' consumers of cfg's
// durable, for status, pause and cleanup; nil when there is no work stream.
func partitionsOf(ctx context.Context, js jetstream.JetStream, cfg config.Config) (jetstream.Stream, []jetstream.Consumer, error) {
	name := partition.StreamName(cfg.Stream, cfg.Consumer)
	work, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("looking up the partitions' work stream %q: %w", name, err)
	}
	if src := work.CachedInfo().Config.Sources; len(src) != 1 || src[0].Name != cfg.Stream {
		// Work stream names are upper-cased: this one copies another
		// stream (COURIER_STREAM=orders beside ORDERS).
		return nil, nil, nil
	}
	var out []jetstream.Consumer
	prefix := cfg.Consumer + "-p"
	for info := range work.ListConsumers(ctx).Info() {
		if strings.HasPrefix(info.Name, prefix) {
			c, err := work.Consumer(ctx, info.Name)
			if err != nil {
				return nil, nil, fmt.Errorf("consumer %q on stream %q: %w", info.Name, name, err)
			}
			out = append(out, c)
		}
	}
	return work, out, nil
}

// printPartitionStatus writes `courier status` for a partitioned durable:
// the sums over the partitions, then each partition and the courier
// holding its pin (the pins each member puts in the membership bucket).
func printPartitionStatus(ctx context.Context, js jetstream.JetStream, cfg config.Config, work jetstream.Stream, consumers []jetstream.Consumer, deadLetters string, stdout io.Writer) error {
	members, _ := partition.ReadMembers(ctx, js, partition.MembersBucket(cfg.Stream, cfg.Consumer))
	holder := map[string]string{} // pin id → instance
	var names []string
	for _, m := range members {
		names = append(names, m.Instance)
		for _, pin := range m.Pins {
			holder[pin] = m.Instance
		}
	}
	var pending uint64
	var ackPending, redelivered, waiting int
	paused := "no"
	lines := make([]string, 0, len(consumers))
	for _, c := range consumers {
		info := c.CachedInfo()
		pending += info.NumPending
		ackPending, redelivered, waiting = ackPending+info.NumAckPending, redelivered+info.NumRedelivered, waiting+info.NumWaiting
		if info.Paused && info.Config.PauseUntil != nil {
			paused = "until " + info.Config.PauseUntil.UTC().Format(time.RFC3339)
		}
		pinned := "nobody (the courier it is assigned to takes it with its next message)"
		for _, g := range info.PriorityGroups {
			if g.PinnedClientID == "" {
				continue
			}
			who, ok := holder[g.PinnedClientID]
			if !ok {
				who = "pin " + g.PinnedClientID + " (a courier not in the membership: stopped or not yet reporting)"
			}
			pinned = who + " since " + g.PinnedTS.UTC().Format(time.RFC3339)
		}
		lines = append(lines, fmt.Sprintf("%s\tpending %d, ack pending %d, pinned to %s", info.Name, info.NumPending, info.NumAckPending, pinned))
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "consumer\t%s/%s in %d partitions (work stream %s)\n", cfg.Stream, cfg.Consumer, len(consumers), work.CachedInfo().Config.Name)
	fmt.Fprintf(w, "paused\t%s\n", paused)
	fmt.Fprintf(w, "pending\t%d\n", pending)
	fmt.Fprintf(w, "ack pending\t%d\n", ackPending)
	fmt.Fprintf(w, "redelivered\t%d\n", redelivered)
	fmt.Fprintf(w, "waiting pulls\t%d\n", waiting)
	fmt.Fprintf(w, "dead letters\t%s (%s)\n", deadLetters, cfg.DLQSubject)
	fmt.Fprintf(w, "couriers\t%s\n", strings.Join(names, ", "))
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	return w.Flush()
}

// workStreamDescription is in the description partition gives the work
// stream.
const workStreamDescription = "(COURIER_ORDER_PARTITIONS)"

// planPartitions finds, for cleanup, the work stream (with the partitions'
// consumers), the membership bucket and the partitions' marks bucket,
// whose sequences are the work stream's and go with it.
func planPartitions(ctx context.Context, js jetstream.JetStream, cfg config.Config, force bool) ([]item, error) {
	work, consumers, err := partitionsOf(ctx, js, cfg)
	if err != nil || work == nil {
		return nil, err
	}
	info := work.CachedInfo()
	waiting := 0
	for _, c := range consumers {
		waiting += c.CachedInfo().NumWaiting
	}
	it := item{what: fmt.Sprintf("stream %q (the partitions' work stream, %d consumers, %d messages not settled)", info.Config.Name, len(consumers), info.State.Msgs)}
	switch {
	case !strings.Contains(info.Config.Description, workStreamDescription):
		it.keep = "not created by courier: delete it yourself if it is not needed (nats stream rm)"
	case force:
	case waiting > 0:
		it.keep = fmt.Sprintf("a courier seems to be consuming it (%d pull requests waiting): stop it first, or --force", waiting)
	}
	name := info.Config.Name
	if it.keep != "" {
		return []item{it}, nil
	}
	it.remove = func(ctx context.Context) error { return js.DeleteStream(ctx, name) }
	items := []item{it}
	if adv, err := planAdvisoriesOf(ctx, js, name, giveup.AllConsumers, force); err != nil {
		return nil, err
	} else if adv != nil {
		items = append(items, *adv)
	}
	for _, bucket := range []string{partition.MembersBucket(cfg.Stream, cfg.Consumer), ordermark.PartitionsBucketName(cfg.Stream, cfg.Consumer)} {
		if _, err := js.KeyValue(ctx, bucket); err == nil {
			items = append(items, item{what: fmt.Sprintf("key-value bucket %q", bucket),
				remove: func(ctx context.Context) error { return js.DeleteKeyValue(ctx, bucket) }})
		}
	}
	return items, nil
}

// pausePartitioned runs `courier pause` (until set) or `courier resume`
// (zero) for a partitioned durable: every partition's consumer at once.
func pausePartitioned(ctx context.Context, js jetstream.JetStream, cfg config.Config, until time.Time, stdout io.Writer) error {
	work, consumers, err := partitionsOf(ctx, js, cfg)
	if err != nil {
		return err
	}
	if work == nil {
		return missingConsumer(ctx, js, cfg)
	}
	stream := work.CachedInfo().Config.Name
	for _, c := range consumers {
		name := c.CachedInfo().Name
		var err error
		if until.IsZero() {
			_, err = js.ResumeConsumer(ctx, stream, name)
		} else {
			_, err = js.PauseConsumer(ctx, stream, name, until)
		}
		if err != nil {
			return fmt.Errorf("cannot pause or resume consumer %q on stream %q (consumer pause needs nats-server 2.11 or later): %w", name, stream, err)
		}
	}
	if until.IsZero() {
		fmt.Fprintf(stdout, "resumed %s/%s (%d partitions)\n", cfg.Stream, cfg.Consumer, len(consumers))
	} else {
		fmt.Fprintf(stdout, "paused %s/%s (%d partitions) until %s\n", cfg.Stream, cfg.Consumer, len(consumers), until.UTC().Format(time.RFC3339))
	}
	return nil
}
