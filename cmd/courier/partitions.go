package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/internal/orderkey"
	"github.com/courierhq/courier/ordermark"
	"github.com/courierhq/courier/partition"
	"github.com/courierhq/courier/proxy"
)

// A durable split into partitions by its ordering key
// (COURIER_ORDER_PARTITIONS; package partition, README "Order per key"):
// its set-up beside the stream, the membership each courier keeps while it
// runs, and what status, pause and cleanup do with it. Package partition
// (durable.go, members.go) holds how; here the configuration becomes its
// options, and the commands print what it found.

// partitioned reports whether cfg splits the durable into partitions.
func partitioned(cfg config.Config) bool { return cfg.OrderPartitions >= 2 }

// partitions is what a partitioned durable's courier holds on the server.
type partitions struct {
	*partition.Durable // the work stream and the partitions' consumers
	marks              *ordermark.Store
	members            *partition.Members
}

// ensurePartitions sets up cfg's durable in partitions beside stream
// (partition.Ensure): a work stream it creates starts as
// COURIER_DELIVER_POLICY says, unless COURIER_CONSUMER exists on the stream
// from before partitions; each partition's consumer is the sidecar's
// durable (consumerConfig), keeping an operator's settings.
func ensurePartitions(ctx context.Context, js jetstream.JetStream, cfg config.Config, stream jetstream.Stream, log *slog.Logger) (*partition.Durable, error) {
	token, _ := orderkey.SubjectToken(cfg.OrderKey) // config.Load checked it
	// The work stream copies what the durable consumes: never the
	// schedules of delayed messages (durableFilters).
	filters, err := durableFilters(cfg, stream, log)
	if err != nil {
		return nil, err
	}
	o := partition.EnsureOptions{Consumer: cfg.Consumer, Filters: filters, Token: token, Partitions: cfg.OrderPartitions,
		Template: consumerConfig(cfg), Keep: keepOperatorSettings, Transient: transientSetupError, Logger: log}
	if cfg.DeliverPolicy == "new" {
		o.StartAt = time.Now()
	}
	return partition.Ensure(ctx, js, stream, o)
}

// setUpPartitions sets up the work stream and the partitions' consumers
// (ensurePartitions), and joins the membership, kept until the stop
// signal (partition.Members.Start).
func (p *path) setUpPartitions(ctx context.Context) error {
	parts := &partitions{marks: p.marks}
	err := retrySetup(ctx, p.log, "the partitions' work stream and consumers", func(ctx context.Context) error {
		var err error
		parts.Durable, err = ensurePartitions(ctx, p.js, p.cfg, p.stream, p.log)
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
	p.parts, p.members = parts, parts.members
	p.stopMembers = parts.members.Start(ctx)
	p.log.Info("sharing the durable's partitions with the other couriers", "partitions", p.cfg.OrderPartitions,
		"instance", parts.members.Instance(), "work_stream", parts.Work.CachedInfo().Config.Name)
	return nil
}

// memberInterval is how often a courier renews its membership, and
// memberTTL how long it lasts without: a killed courier's partitions, or
// the durable's pin, are taken by the others within memberTTL and a
// moment (they give its pins up: proxy.Options.Membership), and a courier
// that could not renew its membership for memberTTL (three intervals and
// more of trouble with the bucket, or a pause) sends nothing it holds of
// them.
const (
	memberInterval = 500 * time.Millisecond
	memberTTL      = 2 * time.Second
)

// joinMembers joins the durable's membership, which names this courier's
// partitions; its heartbeat carries the pins the runner holds (pins, set
// once the runner exists).
func joinMembers(ctx context.Context, js jetstream.JetStream, cfg config.Config, log *slog.Logger, pins *atomic.Pointer[proxy.Runner]) (*partition.Members, error) {
	return partition.Join(ctx, js, partition.MembersBucket(cfg.Stream, cfg.Consumer), partition.Options{
		Owner:      jsutil.Owner{Stream: cfg.Stream, Consumer: cfg.Consumer},
		Partitions: cfg.OrderPartitions, Interval: memberInterval, TTL: memberTTL, Replicas: cfg.StreamReplicas, Logger: log,
		Pins: runnerPins(pins),
	})
}

// runnerPartitions is the runner's view of the partitions; nil without.
func (p *path) runnerPartitions() *proxy.Partitions {
	parts, consumer := p.parts, p.cfg.Consumer
	if parts == nil {
		return nil
	}
	return &proxy.Partitions{
		Consumers:  parts.Consumers,
		Assignment: parts.members,
		Marks:      func(i int) proxy.OrderMarks { return parts.marks.Partition(i) },
		Handover: proxy.Handover{
			Stream: parts.Work,
			Unpin: func(ctx context.Context, i int) error {
				return parts.Work.UnpinConsumer(ctx, partition.ConsumerName(consumer, i), orderGroup)
			},
			HandedOn: parts.members.HandedOn,
			Clean:    parts.members.TakeHandedOn,
			Redeliver: func(ctx context.Context, i int) error {
				_, err := parts.Work.ResetConsumer(ctx, partition.ConsumerName(consumer, i))
				return err
			},
		},
	}
}

// giveupStream is the stream whose advisories the max-deliveries catch
// follows: the consumed stream, or with partitions the work stream (and the
// stream it copies, which the dead letters name).
func (p *path) giveupStream() (jetstream.Stream, *giveup.Origin) {
	if p.parts == nil {
		return p.stream, nil
	}
	return p.parts.Work, &giveup.Origin{Stream: p.stream.CachedInfo(), Consumer: p.cfg.Consumer}
}

// printPartitionStatus writes `courier status` for a partitioned durable
// (partition.Durable.Status): the sums over the partitions, then each
// partition and the courier holding its pin.
func printPartitionStatus(ctx context.Context, js jetstream.JetStream, cfg config.Config, d *partition.Durable, deadLetters string, stdout io.Writer) error {
	st := d.Status(ctx, js)
	paused := "no"
	if !st.PausedUntil.IsZero() {
		paused = "until " + st.PausedUntil.UTC().Format(time.RFC3339)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "consumer\t%s/%s in %d partitions (work stream %s)\n", cfg.Stream, cfg.Consumer, len(d.Consumers), d.Work.CachedInfo().Config.Name)
	fmt.Fprintf(w, "paused\t%s\n", paused)
	fmt.Fprintf(w, "pending\t%d\n", st.Pending)
	fmt.Fprintf(w, "ack pending\t%d\n", st.AckPending)
	fmt.Fprintf(w, "redelivered\t%d\n", st.Redelivered)
	fmt.Fprintf(w, "waiting pulls\t%d\n", st.Waiting)
	fmt.Fprintf(w, "dead letters\t%s (%s)\n", deadLetters, cfg.DLQSubject)
	fmt.Fprintf(w, "couriers\t%s\n", strings.Join(st.Couriers, ", "))
	printPartitionedRewind(ctx, js, cfg, d, w)
	for _, p := range st.Partitions {
		pinned := "nobody (the courier it is assigned to takes it with its next message)"
		if p.Pin != "" {
			who := p.Holder
			if who == "" {
				who = "pin " + p.Pin + " (a courier not in the membership: stopped or not yet reporting)"
			}
			pinned = who + " since " + p.PinnedSince.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%s\tpending %d, ack pending %d, pinned to %s\n", p.Consumer, p.Pending, p.AckPending, pinned)
	}
	return w.Flush()
}

// planPartitions finds, for cleanup, the work stream (with the partitions'
// consumers, partition.Durable.KeepReason), its advisory stream, the
// membership bucket and the partitions' marks bucket, whose sequences are
// the work stream's and go with it.
func planPartitions(ctx context.Context, js jetstream.JetStream, cfg config.Config, force bool) ([]item, error) {
	d, err := partition.Find(ctx, js, cfg.Stream, cfg.Consumer)
	if err != nil || d == nil {
		return nil, err
	}
	info := d.Work.CachedInfo()
	it := item{what: fmt.Sprintf("stream %q (the partitions' work stream, %d consumers, %d messages not settled)", info.Config.Name, len(d.Consumers), info.State.Msgs),
		keep: d.KeepReason(force)}
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
// (zero) for a partitioned durable: every partition's consumer at once
// (partition.Durable.Pause).
func pausePartitioned(ctx context.Context, js jetstream.JetStream, cfg config.Config, until time.Time, stdout io.Writer) error {
	d, err := partition.Find(ctx, js, cfg.Stream, cfg.Consumer)
	if err != nil {
		return err
	}
	if d == nil {
		return missingConsumer(ctx, js, cfg)
	}
	if err := d.Pause(ctx, until); err != nil {
		return err
	}
	if until.IsZero() {
		fmt.Fprintf(stdout, "resumed %s/%s (%d partitions)\n", cfg.Stream, cfg.Consumer, len(d.Consumers))
	} else {
		fmt.Fprintf(stdout, "paused %s/%s (%d partitions) until %s\n", cfg.Stream, cfg.Consumer, len(d.Consumers), until.UTC().Format(time.RFC3339))
	}
	return nil
}
