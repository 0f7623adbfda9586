package proxy

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// The source of a runner's messages: where a worker takes the next one
// (next). Without partitions it is the durable's fetcher (fetch.go), with
// order per key its lines (order.go, ordermarks.go) between the fetcher
// and the workers; with partitions (partition.go) the sessions' fetchers
// and lines, merged. What the lines let go (letGo) is taken before the
// fetch queue.

// source is what feeds a runner's workers. Its fields are set once, by
// New; next is safe for concurrent use.
type source struct {
	fetch *fetcher    // nil with partitions
	parts *partitions // nil without
	queue <-chan queued
	took  func(queued) // told of each message a worker takes off queue; nil: none
	rel   *letGo       // nil: no order per key
	order *orderer     // the durable's lines; nil: no order per key, or partitions
}

// next returns the next message for a worker: one its key's line let go
// (order.go), else one from the fetch queue; false once the queue is
// closed and nothing let go is left.
func (s *source) next() (queued, bool) {
	if s.rel == nil {
		q, ok := <-s.queue
		if ok && s.took != nil {
			s.took(q)
		}
		return q, ok
	}
	for {
		if q, ok := s.rel.pop(); ok {
			return q, true
		}
		select {
		case <-s.rel.wake:
		case q, ok := <-s.queue:
			if !ok {
				return s.rel.pop()
			}
			if s.took != nil {
				s.took(q)
			}
			return q, true
		}
	}
}

// start starts the loops of the durable's fetcher and lines on loops (wg
// counts them): the consumer's settings watched, the marks of order per
// key read and written, its barrier lifted. Partitions start their own.
func (s *source) start(ctx, loops context.Context, wg *sync.WaitGroup, log *slog.Logger, o Options) {
	if s.fetch == nil {
		return
	}
	wg.Add(1)
	go func() { defer wg.Done(); s.fetch.watch(loops) }()
	if s.order != nil {
		s.startOrder(ctx, loops, wg, log, o)
	}
}

// run fetches until ctx ends or the consumer is gone (ErrConsumerGone),
// then closes the queue; ph are Run's phases.
func (s *source) run(ctx, loops context.Context, ph *phases) error {
	if s.parts != nil {
		return s.parts.run(ctx, loops, ph)
	}
	return s.fetch.run(ctx)
}

// drain gives back, at shutdown, what still waits behind its key, in
// stream order, so that JetStream redelivers it in that order; each
// partition, holding nothing then, is given up for the next courier to
// take at once (partition.go).
func (s *source) drain(loops context.Context, giveBack func(jetstream.Msg)) {
	if s.order != nil {
		for _, q := range s.order.drain() {
			giveBack(q.m)
		}
	}
	if s.parts != nil {
		s.parts.drainAndFinish(loops, giveBack)
	}
}

// handOn gives the durable's pin up for the next courier at the end of
// shutdown, once the loops have stopped (the marks are written), if this
// courier holds nothing (held) and abandoned no request
// (fetcher.handOnPin). Partitions hand theirs on as each is finished.
func (s *source) handOn(ctx context.Context, held int, abandoned bool) {
	if s.fetch == nil || s.order == nil || s.fetch.group == "" || held != 0 || abandoned {
		return
	}
	s.fetch.handOnPin(ctx, s.order)
}

// wait waits for the partitions' loops and hand-overs, once Run's loops
// have stopped.
func (s *source) wait() {
	if s.parts != nil {
		s.parts.wg.Wait()
	}
}

// ready reports why the source cannot pull, if it cannot.
func (s *source) ready() error {
	if s.parts != nil {
		return s.parts.ready()
	}
	if !s.fetch.bound.Load() {
		return errors.New("consumer not bound")
	}
	return nil
}

// queued is how many messages wait in the fetch queues.
func (s *source) queued() int {
	if s.parts != nil {
		return s.parts.queued()
	}
	return len(s.fetch.queue)
}

// orderers are the lines of order per key: the durable's, or each
// partition's.
func (s *source) orderers() []*orderer {
	switch {
	case s.parts != nil:
		return s.parts.orderers()
	case s.order != nil:
		return []*orderer{s.order}
	}
	return nil
}

// registerPartitionMetrics registers courier_order_partitions_held.
func (s *source) registerPartitionMetrics(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "courier_order_partitions_held",
		Help: "Partitions of the durable this courier pulls from or is handing on (COURIER_ORDER_PARTITIONS).",
	}, func() float64 {
		s.parts.mu.Lock()
		defer s.parts.mu.Unlock()
		return float64(len(s.parts.sessions))
	}))
}

// orderStats is stats over the source's orderers.
func (s *source) orderStats() (keys, msgs int, longest time.Duration) {
	for _, o := range s.orderers() {
		k, n, l := o.stats()
		keys, msgs, longest = keys+k, msgs+n, max(longest, l)
	}
	return keys, msgs, longest
}

// registerOrderMetrics registers what the lines show, read at scrape.
func (s *source) registerOrderMetrics(reg prometheus.Registerer) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "courier_order_keys_waiting",
			Help: "Ordering keys with messages waiting behind an earlier one (COURIER_ORDER_KEY).",
		}, func() float64 { k, _, _ := s.orderStats(); return float64(k) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "courier_order_messages_waiting",
			Help: "Messages waiting behind an earlier message of their key, held in progress (COURIER_ORDER_KEY).",
		}, func() float64 { _, n, _ := s.orderStats(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "courier_order_longest_wait_seconds",
			Help: "How long the message waiting longest behind its key has waited (COURIER_ORDER_KEY).",
		}, func() float64 { _, _, d := s.orderStats(); return d.Seconds() }),
	)
}

// startOrder reads the marks and raises the barrier (the consumer's state
// decides), then runs the marker and the lifting of the barrier on loops
// until it ends.
func (s *source) startOrder(ctx context.Context, loops context.Context, wg *sync.WaitGroup, log *slog.Logger, o Options) {
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	floor, pending := uint64(0), 1 // unknown: as if another courier held messages
	if info, err := s.fetch.cons.Info(ictx); err == nil {
		floor, pending = info.AckFloor.Stream, info.NumAckPending
	}
	if err := s.order.load(ictx, floor, pending, orderBarrier(o.AckWait)); err != nil {
		log.Warn("cannot read the keys' first unsettled messages; order holds from now on", "error", err)
	}
	if s.order.marks != nil {
		wg.Add(1)
		go func() { defer wg.Done(); s.order.marks.run(loops) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); liftLoop(loops, s.order) }()
}
