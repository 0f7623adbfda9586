package main

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/partition"
)

// With order per key and no partitions, one courier at a time holds the
// durable's pin (its priority group). `courier status` names it as it
// names the holders of partitions: by the instance (host or pod name)
// each courier puts, with the pin the server gave it, in the durable's
// membership bucket (package partition, one "partition"). The delivery
// loop does not say which pin it holds but for partitions, so pinWatch
// reads it off the messages it fetches.

// pinWatch is the durable's consumer as the delivery loop uses it, noting
// the pin id the server gives this courier with each message of the
// pinned group (the Nats-Pin-Id header), and forgetting it when a pull is
// refused for a pin that moved.
type pinWatch struct {
	jetstream.Consumer
	pin atomic.Pointer[string]
}

// Fetch is the consumer's Fetch, its messages passed on through a channel
// as large as the pull, so that the goroutine copying them never waits:
// it ends when the pull does, whoever reads.
func (c *pinWatch) Fetch(batch int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := c.Consumer.Fetch(batch, opts...)
	if err != nil {
		return b, err
	}
	out := make(chan jetstream.Msg, max(batch, 1))
	go func() {
		defer close(out)
		for m := range b.Messages() {
			if p := m.Headers().Get("Nats-Pin-Id"); p != "" {
				c.pin.Store(&p)
			}
			out <- m
		}
		if errors.Is(b.Error(), jetstream.ErrPinIDMismatch) {
			c.pin.Store(nil)
		}
	}()
	return pinnedBatch{b, out}, nil
}

// pins is the pin held now, as the membership puts it.
func (c *pinWatch) pins() map[int]string {
	if p := c.pin.Load(); p != nil {
		return map[int]string{0: *p}
	}
	return nil
}

// pinnedBatch is a pull's messages as pinWatch passes them on.
type pinnedBatch struct {
	jetstream.MessageBatch
	msgs chan jetstream.Msg
}

func (b pinnedBatch) Messages() <-chan jetstream.Msg { return b.msgs }

// joinPinHolders joins the membership of a durable with order per key and
// no partitions, naming this courier with the pin it holds (pins).
// Assignments mean nothing here: its log is kept to warnings.
func joinPinHolders(ctx context.Context, js jetstream.JetStream, cfg config.Config, log *slog.Logger, pins func() map[int]string) (*partition.Members, error) {
	return partition.Join(ctx, js, partition.MembersBucket(cfg.Stream, cfg.Consumer), partition.Options{
		Owner:      jsutil.Owner{Stream: cfg.Stream, Consumer: cfg.Consumer},
		Partitions: 1, Interval: memberInterval, TTL: memberTTL, Replicas: cfg.StreamReplicas,
		Logger: slog.New(minLevel{log.Handler(), slog.LevelWarn}), Pins: pins,
	})
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

// joinPinHolders wraps the durable's consumer in a pinWatch and joins the
// membership that names the pin's holder, kept until the stop signal. A
// membership refused for good (no permission for its bucket) costs only
// the name in `courier status`, which then shows the pin id: it is said,
// and courier delivers on.
func (p *path) joinPinHolders(ctx context.Context) {
	w := &pinWatch{Consumer: p.cons}
	p.pinned = w
	var m *partition.Members
	err := retrySetup(ctx, p.log, "the pin holders' membership", func(ctx context.Context) error {
		var err error
		m, err = joinPinHolders(ctx, p.js, p.cfg, p.log, w.pins)
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("courier status will name the courier holding the durable's pin by its pin id only", "error", err)
		}
		return
	}
	p.stopMembers = m.Start(ctx)
}
