package partition

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A partitioned durable on the server: its set-up beside the consumed
// stream when a courier starts (Ensure), and what `courier status`, `pause`
// and `cleanup` find of it (Find) and do with it. What the commands print
// stays with them; the rules (which consumers are the partitions', how a
// pin is matched with a member, when the work stream may go) are here,
// beside StreamConfig and the membership that make them.

// Durable is a partitioned durable on the server: its work stream and one
// durable consumer per partition, as read when Ensure or Find returned it.
// Its methods only read it: they are safe for concurrent use.
type Durable struct {
	// Work is the work stream (StreamName).
	Work jetstream.Stream
	// Consumers are the partitions' consumers: by partition from Ensure,
	// in the server's listing order from Find.
	Consumers []jetstream.Consumer

	// stream and consumer name the durable (its membership bucket).
	stream, consumer string
}

// EnsureOptions describe a partitioned durable for Ensure.
type EnsureOptions struct {
	// Consumer is the durable's name (COURIER_CONSUMER), Filters its filter
	// subjects (COURIER_SUBJECTS), Token the key's subject token and
	// Partitions how many partitions: as in StreamOptions.
	Consumer   string
	Filters    []string
	Token      int
	Partitions int
	// StartAt, when set, makes a new work stream start with the messages
	// stored from then on (StreamOptions.StartAt), unless the durable
	// exists on the consumed stream from before partitions.
	StartAt time.Time
	// Template is the durable's consumer configuration, which
	// ConsumerConfig makes each partition's.
	Template jetstream.ConsumerConfig
	// Keep, when set, carries over onto a partition's configuration the
	// settings of its existing consumer that courier does not own (a
	// pause, pull limits), so that a start never undoes an operator's.
	Keep func(want *jetstream.ConsumerConfig, have jetstream.ConsumerConfig)
	// Transient, when set, reports the errors that time can fix: Ensure
	// returns them as they are, for the caller's retry to log and try
	// again, and wraps the others with what it was doing, for the final
	// error. Default: none is transient.
	Transient func(error) bool
	// Logger says when the work stream is created; default discards.
	Logger *slog.Logger
}

// Ensure creates or checks the work stream that sources source with each
// message's partition in front of its subject (StreamConfig, EnsureStream),
// and creates or updates the partitions' durable consumers on it
// (ConsumerConfig). A work stream it creates starts as o.StartAt says, or,
// if the durable o.Consumer exists on source from before partitions, after
// its ack floor: what it acked out of order is delivered again, and dedup,
// whose keys are the same, recognises it. Ensure may be called again after
// an error: what it made stays and is found.
func Ensure(ctx context.Context, js jetstream.JetStream, source jetstream.Stream, o EnsureOptions) (*Durable, error) {
	if o.Transient == nil {
		o.Transient = func(error) bool { return false }
	}
	if o.Keep == nil {
		o.Keep = func(*jetstream.ConsumerConfig, jetstream.ConsumerConfig) {}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	src := source.CachedInfo().Config
	so := StreamOptions{Source: src, Consumer: o.Consumer, Filters: o.Filters, Token: o.Token, Partitions: o.Partitions,
		StartAt: o.StartAt}
	old, err := js.Consumer(ctx, src.Name, o.Consumer)
	if err == nil {
		so.StartAfter = old.CachedInfo().AckFloor.Stream
	}
	want, err := StreamConfig(so)
	if err != nil {
		return nil, err
	}
	work, created, err := EnsureStream(ctx, js, want)
	if err != nil {
		if o.Transient(err) {
			return nil, err
		}
		return nil, fmt.Errorf("COURIER_ORDER_PARTITIONS: %w", err)
	}
	want.Name = work.CachedInfo().Config.Name // WorkStreamName's
	switch {
	case created && old != nil:
		o.Logger.Info("created the partitions' work stream, starting after the ack floor of the durable it replaces (courier no longer reads that durable; `courier cleanup` removes it)",
			"stream", want.Name, "partitions", o.Partitions, "after", so.StartAfter, "durable", o.Consumer)
	case created:
		o.Logger.Info("created the partitions' work stream", "stream", want.Name, "partitions", o.Partitions,
			"replicas", want.Replicas)
	}
	d := &Durable{Work: work, Consumers: make([]jetstream.Consumer, o.Partitions), stream: src.Name, consumer: o.Consumer}
	for i := range d.Consumers {
		cc := ConsumerConfig(o.Template, o.Consumer, i)
		if existing, err := js.Consumer(ctx, want.Name, cc.Durable); err == nil {
			o.Keep(&cc, existing.CachedInfo().Config)
		}
		if d.Consumers[i], err = js.CreateOrUpdateConsumer(ctx, want.Name, cc); err != nil {
			if o.Transient(err) {
				return nil, err
			}
			return nil, fmt.Errorf("cannot create or update consumer %q of partition %d on stream %q: %w", cc.Durable, i, want.Name, err)
		}
	}
	return d, nil
}

// ConsumerConfig is partition i's durable: template (the durable's
// configuration) named ConsumerName(consumer, i), on the partition's
// subjects of the work stream (FilterSubject), from its first message: the
// work stream itself starts where the durable is to.
func ConsumerConfig(template jetstream.ConsumerConfig, consumer string, i int) jetstream.ConsumerConfig {
	cc := template
	cc.Durable = ConsumerName(consumer, i)
	cc.DeliverPolicy = jetstream.DeliverAllPolicy
	cc.FilterSubject, cc.FilterSubjects = FilterSubject(i), nil
	return cc
}

// Find finds the work stream of consumer on stream and the partitions'
// consumers on it, for status, pause and cleanup; nil, and no error, when
// there is no work stream.
func Find(ctx context.Context, js jetstream.JetStream, stream, consumer string) (*Durable, error) {
	name, err := WorkStreamName(ctx, js, stream, consumer)
	if err != nil {
		return nil, fmt.Errorf("looking up the partitions' work stream: %w", err)
	}
	work, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("looking up the partitions' work stream %q: %w", name, err)
	}
	if src := work.CachedInfo().Config.Sources; len(src) != 1 || src[0].Name != stream {
		// Work stream names are upper-cased: this one copies another
		// stream (COURIER_STREAM=orders beside ORDERS).
		return nil, nil
	}
	d := &Durable{Work: work, stream: stream, consumer: consumer}
	prefix := consumer + "-p"
	for info := range work.ListConsumers(ctx).Info() {
		if strings.HasPrefix(info.Name, prefix) {
			c, err := work.Consumer(ctx, info.Name)
			if err != nil {
				return nil, fmt.Errorf("consumer %q on stream %q: %w", info.Name, name, err)
			}
			d.Consumers = append(d.Consumers, c)
		}
	}
	return d, nil
}

// Pause pauses every partition's consumer until until (`courier pause`),
// or resumes them all when until is zero (`courier resume`): a durable is
// paused whole, or the keys of some partitions would wait while others
// move on.
func (d *Durable) Pause(ctx context.Context, until time.Time) error {
	stream := d.Work.CachedInfo().Config.Name
	for _, c := range d.Consumers {
		name := c.CachedInfo().Name
		var err error
		if until.IsZero() {
			_, err = d.Work.ResumeConsumer(ctx, name)
		} else {
			_, err = d.Work.PauseConsumer(ctx, name, until)
		}
		if err != nil {
			return fmt.Errorf("cannot pause or resume consumer %q on stream %q (consumer pause needs nats-server 2.11 or later): %w", name, stream, err)
		}
	}
	return nil
}

// Status is a partitioned durable as `courier status` shows it: the sums
// over the partitions, the couriers in the membership, and each partition.
type Status struct {
	// Pending, AckPending, Redelivered and Waiting are the sums of the
	// partitions' consumers' NumPending, NumAckPending, NumRedelivered and
	// NumWaiting.
	Pending                          uint64
	AckPending, Redelivered, Waiting int
	// PausedUntil is when a paused partition resumes (Pause pauses them
	// all until the same time); zero when none is paused.
	PausedUntil time.Time
	// Couriers are the instances in the membership (MembersBucket): none
	// when it cannot be read.
	Couriers []string
	// Partitions are the partitions' consumers, in the order of
	// Durable.Consumers.
	Partitions []PartitionStatus
}

// PartitionStatus is one partition's consumer in a Status.
type PartitionStatus struct {
	// Consumer is its name (ConsumerName).
	Consumer   string
	Pending    uint64
	AckPending int
	// Pin is the id of the client the server pinned it to, since
	// PinnedSince; "" when nobody holds it (the courier it is assigned to
	// takes it with its next pull).
	Pin         string
	PinnedSince time.Time
	// Holder is the courier of the membership that says it holds Pin
	// (Member.Pins); "" when none does: a courier stopped, or not yet
	// reporting.
	Holder string
}

// Status reads the membership (ReadMembers) and matches each partition's
// pin with the courier that holds it; the consumers' figures are those
// read when d was found.
func (d *Durable) Status(ctx context.Context, js jetstream.JetStream) Status {
	members, _ := ReadMembers(ctx, js, MembersBucket(d.stream, d.consumer))
	var st Status
	holder := map[string]string{} // pin id → instance
	for _, m := range members {
		st.Couriers = append(st.Couriers, m.Instance)
		for _, pin := range m.Pins {
			holder[pin] = m.Instance
		}
	}
	st.Partitions = make([]PartitionStatus, 0, len(d.Consumers))
	for _, c := range d.Consumers {
		info := c.CachedInfo()
		st.Pending += info.NumPending
		st.AckPending, st.Redelivered, st.Waiting = st.AckPending+info.NumAckPending, st.Redelivered+info.NumRedelivered, st.Waiting+info.NumWaiting
		if info.Paused && info.Config.PauseUntil != nil {
			st.PausedUntil = *info.Config.PauseUntil
		}
		p := PartitionStatus{Consumer: info.Name, Pending: info.NumPending, AckPending: info.NumAckPending}
		for _, g := range info.PriorityGroups {
			if g.PinnedClientID != "" {
				p.Pin, p.PinnedSince, p.Holder = g.PinnedClientID, g.PinnedTS, holder[g.PinnedClientID]
			}
		}
		st.Partitions = append(st.Partitions, p)
	}
	return st
}

// streamDescriptionMark is in the description StreamConfig gives the work
// stream: it tells a work stream courier made from one an operator made.
const streamDescriptionMark = "(COURIER_ORDER_PARTITIONS)"

// KeepReason says why `courier cleanup` must keep the work stream, "" when it
// may delete it: one that StreamConfig did not make is the operator's, and
// one whose consumers have pull requests waiting is being consumed by a
// courier, which force overrides. The buckets beside it (MembersBucket and
// the partitions' order marks) go with it: the marks' sequences are the
// work stream's.
func (d *Durable) KeepReason(force bool) string {
	waiting := 0
	for _, c := range d.Consumers {
		waiting += c.CachedInfo().NumWaiting
	}
	switch {
	case !strings.Contains(d.Work.CachedInfo().Config.Description, streamDescriptionMark):
		return "not created by courier: delete it yourself if it is not needed (nats stream rm)"
	case force:
	case waiting > 0:
		return fmt.Sprintf("a courier seems to be consuming it (%d pull requests waiting): stop it first, or --force", waiting)
	}
	return ""
}
