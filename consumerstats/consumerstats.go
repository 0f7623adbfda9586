// Package consumerstats serves the durable consumer's state on the server
// as Prometheus gauges, read from the consumer's info at scrape time: how
// many messages wait to be delivered, how many are delivered but not acked,
// and how many of those are redeliveries. Every courier of one durable sees
// the same consumer, so these are the consumer's numbers, not the replica's.
package consumerstats

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Options tunes a Collector. Zero values take the defaults.
type Options struct {
	// Timeout bounds the request for the consumer's info at a scrape.
	// Default 2s.
	Timeout time.Duration
	// CacheFor is how long an answer is reused before the server is asked
	// again, so that frequent or parallel scrapes cost one request.
	// Default 5s.
	CacheFor time.Duration
}

// Collector is a prometheus.Collector of the consumer's gauges
// courier_consumer_pending_messages, courier_consumer_ack_pending_messages
// and courier_consumer_redelivered_messages, labelled with the stream and
// consumer names. When the server cannot be asked
// (NATS unreachable, the consumer deleted) a scrape carries no sample rather
// than a stale or invented one. It is safe for concurrent use and holds no
// resources, so there is nothing to close.
type Collector struct {
	cons     jetstream.Consumer
	timeout  time.Duration
	cacheFor time.Duration

	pending, ackPending, redelivered *prometheus.Desc

	mu   sync.Mutex
	info *jetstream.ConsumerInfo // last answer; nil: none yet
	at   time.Time               // when info was read
}

// New returns a collector of cons's state. Register it on the Registry
// behind /metrics.
func New(cons jetstream.Consumer, opts Options) *Collector {
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Second
	}
	if opts.CacheFor <= 0 {
		opts.CacheFor = 5 * time.Second
	}
	// Which consumer, so that replicas' identical values can be told from
	// another consumer's: max by (stream, consumer).
	var labels prometheus.Labels
	if info := cons.CachedInfo(); info != nil {
		labels = prometheus.Labels{"stream": info.Stream, "consumer": info.Name}
	}
	return &Collector{
		cons:     cons,
		timeout:  opts.Timeout,
		cacheFor: opts.CacheFor,
		pending: prometheus.NewDesc("courier_consumer_pending_messages",
			"Messages in the stream, matching the consumer's filter, not yet delivered to the durable consumer (its backlog), from the consumer's info on the server.",
			nil, labels),
		ackPending: prometheus.NewDesc("courier_consumer_ack_pending_messages",
			"Messages delivered to the durable consumer and not yet acked (in flight, held, or waiting out a retry delay), from the consumer's info on the server.",
			nil, labels),
		redelivered: prometheus.NewDesc("courier_consumer_redelivered_messages",
			"Messages delivered to the durable consumer more than once and not yet acked, from the consumer's info on the server.",
			nil, labels),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.ackPending
	ch <- c.redelivered
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	info, err := c.consumerInfo()
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(info.NumPending))
	ch <- prometheus.MustNewConstMetric(c.ackPending, prometheus.GaugeValue, float64(info.NumAckPending))
	ch <- prometheus.MustNewConstMetric(c.redelivered, prometheus.GaugeValue, float64(info.NumRedelivered))
}

// consumerInfo returns the cached answer if fresh, else asks the server.
// The lock is held while asking, so parallel scrapes make one request.
func (c *Collector) consumerInfo() (*jetstream.ConsumerInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.info != nil && time.Since(c.at) < c.cacheFor {
		return c.info, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	info, err := c.cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	c.info, c.at = info, time.Now()
	return info, nil
}
