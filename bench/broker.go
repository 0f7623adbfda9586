package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// broker is the embedded JetStream server the benchmark runs against, and
// the benchmark's own connection to it (to preload streams and watch
// consumers). Its owner must call close.
type broker struct {
	srv *server.Server
	nc  *nats.Conn
	js  jetstream.JetStream
}

// startBroker starts a loopback nats-server with JetStream storing in dir,
// the way courier's tests do (internal/natstest, which needs a testing.TB).
func startBroker(dir string) (*broker, error) {
	srv, err := server.NewServer(&server.Options{
		Host:               "127.0.0.1",
		Port:               server.RANDOM_PORT,
		JetStream:          true,
		StoreDir:           dir,
		JetStreamMaxMemory: 256 << 20,
		JetStreamMaxStore:  4 << 30,
		NoLog:              true,
		NoSigs:             true,
	})
	if err != nil {
		return nil, fmt.Errorf("nats-server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("nats-server not ready within 10s")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		srv.Shutdown()
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		srv.Shutdown()
		return nil, err
	}
	return &broker{srv: srv, nc: nc, js: js}, nil
}

// URL is the server's client URL.
func (b *broker) URL() string { return b.srv.ClientURL() }

// close drops the connection and shuts the server down.
func (b *broker) close() {
	b.nc.Close()
	b.srv.Shutdown()
	b.srv.WaitForShutdown()
}

// createStream creates a file-backed stream name capturing subject.
func (b *broker) createStream(ctx context.Context, name, subject string) error {
	_, err := b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{subject},
		Storage:  jetstream.FileStorage,
	})
	if err != nil {
		return fmt.Errorf("creating stream %s: %w", name, err)
	}
	return nil
}

// preload publishes messages [0, n) of run to subject, asynchronously in
// batches, and checks that stream holds all n. With keys > 0, message id
// goes to subject.<id % keys> instead: keys ordering keys, in turn (the
// stream captures subject.>).
func (b *broker) preload(ctx context.Context, stream, subject string, keys int, run uint64, n, size int) error {
	return b.preloadFrom(ctx, stream, subject, keys, run, 0, n, size)
}

// preloadFrom is preload of messages [first, first+n) of run: several
// streams preloaded for one tally each get ids of their own.
func (b *broker) preloadFrom(ctx context.Context, stream, subject string, keys int, run uint64, first, n, size int) error {
	const batch = 1000
	for from := first; from < first+n; from += batch {
		for id := from; id < min(from+batch, first+n); id++ {
			to := subject
			if keys > 0 {
				to = subject + "." + strconv.Itoa(id%keys)
			}
			if _, err := b.js.PublishAsync(to, newBody(size, run, uint64(id), time.Now())); err != nil {
				return fmt.Errorf("preloading %s: %w", stream, err)
			}
		}
		select {
		case <-b.js.PublishAsyncComplete():
		case <-ctx.Done():
			return fmt.Errorf("preloading %s: %w", stream, ctx.Err())
		}
	}
	s, err := b.js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	if info.State.Msgs != uint64(n) {
		return fmt.Errorf("preloading %s: stream holds %d messages, want %d", stream, info.State.Msgs, n)
	}
	return nil
}

// publish publishes message id of run to subject and waits for its ack; the
// body is stamped with the time of the call.
func (b *broker) publish(ctx context.Context, subject string, run uint64, id, size int) error {
	_, err := b.js.Publish(ctx, subject, newBody(size, run, uint64(id), time.Now()))
	return err
}

// waitConsumer polls until the durable consumer exists (the process under
// test creates it).
func (b *broker) waitConsumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	for {
		c, err := b.js.Consumer(ctx, stream, name)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for consumer %s on %s: %w", name, stream, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitSettled polls until the consumer has nothing pending: every message
// delivered and acked.
func (b *broker) waitSettled(ctx context.Context, stream, name string) error {
	for {
		c, err := b.js.Consumer(ctx, stream, name)
		if err == nil {
			info, err := c.Info(ctx)
			if err == nil && info.NumAckPending == 0 && info.NumPending == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for consumer %s on %s to settle: %w", name, stream, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitPartitionsSettled waits until every consumer on the partitions' work
// stream has nothing pending or unacked.
func (b *broker) waitPartitionsSettled(ctx context.Context, work string) error {
	for {
		s, err := b.js.Stream(ctx, work)
		if err == nil {
			settled, n := true, 0
			for info := range s.ListConsumers(ctx).Info() {
				n++
				settled = settled && info.NumAckPending == 0 && info.NumPending == 0
			}
			if settled && n > 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the partitions of %s to settle: %w", work, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// deleteStreams deletes every stream, so each run starts on an idle server.
func (b *broker) deleteStreams(ctx context.Context) error {
	names := b.js.StreamNames(ctx)
	var list []string
	for n := range names.Name() {
		list = append(list, n)
	}
	if err := names.Err(); err != nil {
		return err
	}
	var errs []error
	for _, n := range list {
		errs = append(errs, b.js.DeleteStream(ctx, n))
	}
	return errors.Join(errs...)
}
