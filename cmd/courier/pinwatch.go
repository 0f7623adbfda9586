package main

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/partition"
	"github.com/courierhq/courier/proxy"
)

// With order per key and no partitions, one courier at a time holds the
// durable's pin (its priority group). The couriers of the durable keep a
// membership (package partition, one "partition"), each naming itself by
// its instance (host or pod name) with the pin the server gave it: `courier
// status` names the pin's holder by it, as it names the holders of
// partitions. Its heartbeats are also the couriers' liveness: the pin of a
// courier that dies is given up by another within seconds, and one that
// stops hands its pin on at once (proxy.Options.Membership and Handover).

// joinPinHolders joins the membership of a durable with order per key and
// no partitions, naming this courier with the pin its runner holds (pins,
// set once the runner exists). Assignments mean only which courier gives
// up the pin of one that is gone: its log is kept to warnings.
func joinPinHolders(ctx context.Context, js jetstream.JetStream, cfg config.Config, log *slog.Logger, pins *atomic.Pointer[proxy.Runner]) (*partition.Members, error) {
	return partition.Join(ctx, js, partition.MembersBucket(cfg.Stream, cfg.Consumer), partition.Options{
		Owner:      jsutil.Owner{Stream: cfg.Stream, Consumer: cfg.Consumer},
		Partitions: 1, Interval: memberInterval, TTL: memberTTL, Replicas: cfg.StreamReplicas,
		Logger: slog.New(minLevel{log.Handler(), slog.LevelWarn}), Pins: runnerPins(pins),
	})
}

// runnerPins is what the membership's heartbeat names: the pins the runner
// holds, once it exists.
func runnerPins(r *atomic.Pointer[proxy.Runner]) func() map[int]string {
	return func() map[int]string {
		if r := r.Load(); r != nil {
			return r.Pins()
		}
		return nil
	}
}

// minLevel is a handler that drops records below its level.
type minLevel struct {
	slog.Handler
	level slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(as), h.level}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.level}
}

// joinPinHolders joins the membership that names the pin's holder, kept
// past the stop signal until the sidecar closes (stopMemberships), after
// the runner has handed its pin on: left at the signal, the others would
// take this courier for gone and give its pin up themselves, before it
// had given back what it holds and recorded a clean hand-over. A membership refused for good (no permission for
// its bucket) costs the name in `courier status`, which then shows the pin
// id, and the liveness: the pin of a courier that dies lapses after the
// consumer's PinnedTTL. It is said, and courier delivers on.
func (p *path) joinPinHolders(ctx context.Context) {
	var m *partition.Members
	err := retrySetup(ctx, p.log, "the pin holders' membership", func(ctx context.Context) error {
		var err error
		m, err = joinPinHolders(ctx, p.js, p.cfg, p.log, &p.runner)
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("courier status will name the courier holding the durable's pin by its pin id only, and a courier that dies keeps it for the consumer's pinned TTL", "error", err)
		}
		return
	}
	p.members = m
	p.stopMembers = m.Start(context.WithoutCancel(ctx))
}

// membership is the runner's view of the durable's membership; nil
// without one.
func (p *path) membership() proxy.Membership {
	if p.members == nil {
		return nil
	}
	return p.members
}

// durableHandover hands the durable's pin on (order per key, no
// partitions): given up at a clean stop, recorded clean in the membership
// when it has one.
func (p *path) durableHandover() proxy.Handover {
	if p.cfg.OrderKey == "" || partitioned(p.cfg) {
		return proxy.Handover{}
	}
	stream, consumer := p.stream, p.cfg.Consumer
	h := proxy.Handover{Stream: stream, Unpin: func(ctx context.Context, _ int) error {
		return stream.UnpinConsumer(ctx, consumer, orderGroup)
	}}
	if p.members != nil {
		h.HandedOn, h.Clean = p.members.HandedOn, p.members.TakeHandedOn
	}
	if p.cfg.DedupEnabled() && p.cfg.DedupStore == config.DedupShared && p.cfg.DeliverPolicy == "all" {
		// What a courier that died had out is delivered again at once:
		// from the ack floor on, so with the messages settled after it,
		// which the shared store knows processed and acks unsent.
		h.Redeliver = func(ctx context.Context, _ int) error {
			_, err := stream.ResetConsumer(ctx, consumer)
			return err
		}
	}
	return h
}
