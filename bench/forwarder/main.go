// Command forwarder is the baseline of courier's benchmark: the least a
// JetStream-to-HTTP forwarder can do. It consumes a durable pull consumer
// with explicit acks, POSTs each message's data to the app from a fixed pool
// of COURIER_MAX_INFLIGHT goroutines over keep-alive connections, acks on a
// 2xx and NAKs otherwise. Nothing else: no dedup, no retry schedule, no dead
// letters, no metrics, no logs per message.
//
// It reads the same variables as courier: NATS_URL, COURIER_STREAM,
// COURIER_CONSUMER, COURIER_APP_URL, COURIER_MAX_INFLIGHT and
// COURIER_MAX_ACK_PENDING (the consumer's; by default far above the pool
// size: 1 keeps order as consumers without courier do, one message
// unacked at a time). It stops on SIGTERM or SIGINT.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "forwarder: %v\n", err)
		os.Exit(1)
	}
}

// config is the forwarder's environment.
type config struct {
	natsURL, stream, consumer, appURL string
	inflight                          int
	maxAckPending                     int // 0: max(1000, 4 × inflight)
}

func loadConfig() (config, error) {
	c := config{
		natsURL:  os.Getenv("NATS_URL"),
		stream:   os.Getenv("COURIER_STREAM"),
		consumer: os.Getenv("COURIER_CONSUMER"),
		appURL:   os.Getenv("COURIER_APP_URL"),
		inflight: 8,
	}
	if c.natsURL == "" {
		c.natsURL = nats.DefaultURL
	}
	if c.consumer == "" {
		c.consumer = "courier"
	}
	if v := os.Getenv("COURIER_MAX_INFLIGHT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return c, fmt.Errorf("COURIER_MAX_INFLIGHT=%q: want a positive integer", v)
		}
		c.inflight = n
	}
	if v := os.Getenv("COURIER_MAX_ACK_PENDING"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return c, fmt.Errorf("COURIER_MAX_ACK_PENDING=%q: want a positive integer", v)
		}
		c.maxAckPending = n
	}
	if c.stream == "" || c.appURL == "" {
		return c, errors.New("COURIER_STREAM and COURIER_APP_URL are required")
	}
	return c, nil
}

func run(ctx context.Context) error {
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(cfg.natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	// Far above the pool size, as courier's is, so the server never stalls
	// delivery on pending acks, unless set.
	maxAckPending := max(1000, 4*cfg.inflight)
	if cfg.maxAckPending > 0 {
		maxAckPending = cfg.maxAckPending
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.stream, jetstream.ConsumerConfig{
		Durable:       cfg.consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: maxAckPending,
	})
	if err != nil {
		return fmt.Errorf("consumer %q on stream %q: %w", cfg.consumer, cfg.stream, err)
	}

	// One keep-alive connection per worker: Go's default keeps only two
	// idle connections per host.
	client := &http.Client{Transport: &http.Transport{
		MaxIdleConns:        cfg.inflight,
		MaxIdleConnsPerHost: cfg.inflight,
		MaxConnsPerHost:     cfg.inflight,
	}}

	// The pool: the consume callback hands each message to a free worker,
	// blocking while all are busy, which is what bounds fetching.
	work := make(chan jetstream.Msg)
	var workers sync.WaitGroup
	for range cfg.inflight {
		workers.Go(func() {
			for {
				select {
				case m := <-work:
					forward(ctx, client, cfg.appURL, m)
				case <-ctx.Done():
					return
				}
			}
		})
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case work <- m:
		case <-ctx.Done():
			_ = m.Nak()
		}
	}, jetstream.PullMaxMessages(pullAhead(cfg.inflight)))
	if err != nil {
		return err
	}
	<-ctx.Done()
	cc.Stop()
	workers.Wait()
	return nc.Drain()
}

// pullAhead is how many messages the forwarder keeps asked for: as many
// as courier does (8 per in-flight slot, at least 64), so that both wait
// on the server alike. Asking for exactly one at 1 in flight stalls now and
// then between pulls (drains at a tenth of the usual rate), which measured
// the pull, not forwarding.
func pullAhead(inflight int) int { return max(64, 8*inflight) }

// forward POSTs m's data to the app and settles m: ack on a 2xx, NAK
// otherwise.
func forward(ctx context.Context, c *http.Client, url string, m jetstream.Msg) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(m.Data()))
	if err != nil {
		_ = m.Nak()
		return
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.Do(req)
	if err != nil {
		_ = m.Nak()
		return
	}
	// Drain and close so the connection goes back to the pool.
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		_ = m.Ack()
	} else {
		_ = m.Nak()
	}
}
