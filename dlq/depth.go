package dlq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Depth returns how many messages the stream capturing subject holds on
// subject, from the stream's state: the dead letters waiting there. With no
// stream capturing subject the error wraps ErrNoStream.
func Depth(ctx context.Context, js jetstream.JetStream, subject string) (uint64, error) {
	q, err := Open(ctx, js, subject)
	if err != nil {
		return 0, err
	}
	return q.Depth(ctx)
}

// Depth returns how many dead letters the stream holds on the subject, of
// every stream and consumer, from the stream's state.
func (q *Queue) Depth(ctx context.Context) (uint64, error) {
	return subjectDepth(ctx, q.stream, q.subject)
}

func subjectDepth(ctx context.Context, s jetstream.Stream, subject string) (uint64, error) {
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, fmt.Errorf("dlq: state of stream %q: %w", s.CachedInfo().Config.Name, err)
	}
	return info.State.Subjects[subject], nil
}

// DepthOptions tunes a DepthCollector. Zero values take the defaults;
// negative ones are refused.
type DepthOptions struct {
	// Timeout bounds the query of the stream's state at a scrape.
	// Default 2s.
	Timeout time.Duration
	// CacheFor is how long a value is reused before the stream is asked
	// again, so that frequent or parallel scrapes cost one request.
	// Default 5s.
	CacheFor time.Duration
}

// DepthCollector is a prometheus.Collector of the gauge courier_dead_letters_stored:
// the dead letters waiting on one subject, read from the dead-letter
// stream's state at scrape time (cached for DepthOptions.CacheFor). When the
// stream cannot be asked (NATS unreachable, no stream capturing the subject)
// the scrape carries no sample rather than a stale or invented one. It is
// safe for concurrent use and holds no resources, so there is nothing to
// close.
type DepthCollector struct {
	js       jetstream.JetStream
	subject  string
	timeout  time.Duration
	cacheFor time.Duration
	desc     *prometheus.Desc

	mu     sync.Mutex
	stream jetstream.Stream // nil until found
	value  uint64
	at     time.Time // when value was read; zero: never
}

// NewDepthCollector returns a collector of the dead letters on subject.
// Register it on the Registry behind /metrics. A negative option is an
// error naming it.
func NewDepthCollector(js jetstream.JetStream, subject string, opts DepthOptions) (*DepthCollector, error) {
	switch {
	case opts.Timeout < 0:
		return nil, fmt.Errorf("dlq: DepthOptions.Timeout %s must not be negative (0 takes the default)", opts.Timeout)
	case opts.CacheFor < 0:
		return nil, fmt.Errorf("dlq: DepthOptions.CacheFor %s must not be negative (0 takes the default)", opts.CacheFor)
	}
	if opts.Timeout == 0 {
		opts.Timeout = 2 * time.Second
	}
	if opts.CacheFor == 0 {
		opts.CacheFor = 5 * time.Second
	}
	return &DepthCollector{
		js:       js,
		subject:  subject,
		timeout:  opts.Timeout,
		cacheFor: opts.CacheFor,
		desc: prometheus.NewDesc("courier_dead_letters_stored",
			"Dead letters waiting in the dead-letter stream on this courier's dead-letter subject, from the stream's state.",
			nil, nil),
	}, nil
}

// Describe implements prometheus.Collector.
func (c *DepthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *DepthCollector) Collect(ch chan<- prometheus.Metric) {
	v, err := c.depth()
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v))
}

// depth returns the cached value if fresh, else asks the stream. The lock is
// held while asking, so parallel scrapes make one request.
func (c *DepthCollector) depth() (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < c.cacheFor {
		return c.value, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if c.stream == nil {
		q, err := Open(ctx, c.js, c.subject)
		if err != nil {
			return 0, err
		}
		c.stream = q.stream
	}
	v, err := subjectDepth(ctx, c.stream, c.subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		c.stream = nil // deleted; look it up again next time
	}
	if err != nil {
		return 0, err
	}
	c.value, c.at = v, time.Now()
	return v, nil
}
