package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/proxy"
)

// startGiveup sets up the max-deliveries catch (a stream capturing the
// consumer's max-deliveries advisories and a durable consumer on it, retried
// like the rest of start-up) and runs it until the returned stop is called.
// stream is the handle the delivery loop uses, so both derive the same
// dead-letter ids; with partitions, the work stream, whose every consumer's
// advisories are caught, and origin the stream it copies. runner, the
// delivery loop, tells the originals of reference dead letters it stored,
// which get no second one, and the messages it is still delivering, whose
// advisories wait; dd, its dedup store (nil: dedup off), the messages
// processed, which get none (docs/threat-model.md#advisories). stop ends
// the catch, lets the advisory in hand finish, and waits; it may be called
// more than once.
func startGiveup(ctx context.Context, js jetstream.JetStream, cfg config.Config, stream jetstream.Stream, origin *giveup.Origin, log *slog.Logger, reg prometheus.Registerer,
	onDeadLetter func(), runner *proxy.Runner, dd proxy.Deduper) (stop func(), err error) {
	consumer := cfg.Consumer
	if origin != nil {
		consumer = giveup.AllConsumers
	}
	o := giveup.Options{
		Replicas: cfg.StreamReplicas, Logger: log, Registerer: reg, OnDeadLetter: onDeadLetter,
		ReferenceStored: runner.ReferenceStored, Delivering: runner.Delivering, IdempotencyHeader: cfg.IdempotencyHeader,
		Origin: origin,
	}
	if peek, ok := dd.(giveup.Dedup); ok {
		o.Dedup = peek
	}
	c, err := giveup.New(js, stream, consumer, dlq.NewPublisher(js, cfg.DLQSubject), o)
	if err != nil {
		return nil, err
	}
	err = retrySetup(ctx, log, "max-deliveries catch", func(ctx context.Context) error {
		err := c.Setup(ctx)
		if err != nil && !transientSetupError(err) {
			return fmt.Errorf("messages JetStream gives up on could not be dead-lettered: %w", err)
		}
		return err
	})
	if err != nil {
		return nil, err
	}

	// The catch outlives ctx: it stops when the sidecar's shutdown says,
	// after the delivery loop.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(runCtx); err != nil {
			log.Error("max-deliveries catch stopped", "error", err)
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}, nil
}
