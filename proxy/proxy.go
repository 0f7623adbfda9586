// Package proxy owns one message's life in courier: its dedup key, the dedup
// check, the HTTP request to the app, the classification of the answer, and
// the ack / NAK-with-delay / dead-letter decision; plus the fetch loop and the
// bounded worker pool around it, which hold what they have while the app (or
// the dedup store) is unavailable. It knows nothing of Badger, of the shared
// bucket or of how dead letters are stored: it declares Deduper,
// DeadLetterer and OrderMarks and is given implementations. What it writes
// through them is its own, though: besides idempotency keys, references.go
// records the marks of reference dead letters in the Deduper, under keys no
// idempotency key can be.
//
// A message travels through the files in this order: fetch.go (pulled,
// tracked, queued; pin.go: a priority group's pin), order.go (with order per
// key, held behind an earlier message of its key; ordermarks.go: that order
// across restarts and takeovers), worker.go (taken by a worker, held while
// the gate is closed), delivery.go (key, max age, dedup check, the request;
// batcher.go: with batches, several in one request; handoff.go: settled by
// their batch), request.go (the headers; the HTTP exchange and what its
// answer means are apphttp's),
// results.go (the success record), recorder.go (the key of a 2xx recorded),
// settle.go (ack, NAK with a delay, dead letter, give back), references.go
// (the originals of reference dead letters, not sent again). gate.go and
// breaker.go decide whether courier may send (breaker.go's tickets: which
// held message goes as the probe); tracker.go keeps held messages in
// progress; phases.go names the steps of shutdown; trace.go makes each
// attempt a span.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/verdict"
	"github.com/courierhq/courier/success"
)

// Deduper remembers processed idempotency keys. Implementations must be safe
// for concurrent use.
type Deduper interface {
	// Check says whether key was processed. A store shared by replicas
	// also claims a new key for this caller (verdict.New), or reports a
	// live claim of another replica (verdict.Claimed). An error means the
	// store could not answer: the message is held, never sent unchecked.
	Check(ctx context.Context, key string) (verdict.Verdict, error)
	// Record records keys as processed, together (the runner gathers the
	// keys of concurrent deliveries into one call), and returns nil only
	// once every one is stored durably.
	Record(ctx context.Context, keys ...string) error
	// Release gives up the claim Check took on key, after an attempt that
	// did not succeed, so that another delivery can go ahead at once.
	Release(ctx context.Context, key string) error
}

// quickChecker is a Deduper whose Check waits on nothing a deadline could
// end (the embedded store), and so is given no timeout of its own.
type quickChecker interface {
	QuickCheck() bool
}

// DeadLetterer stores dead letters. DeadLetter must return nil only once the
// dead letter is stored durably (publish acknowledged by a stream), and must
// be safe for concurrent use.
type DeadLetterer interface {
	DeadLetter(ctx context.Context, l dlq.Letter) error
}

// SuccessPublisher stores success records. Publish must return nil only once
// the record is stored (acknowledged by a stream; a duplicate
// acknowledgement counts), and must be safe for concurrent use.
type SuccessPublisher interface {
	Publish(ctx context.Context, r success.Record) error
}

// Runner consumes a durable consumer and delivers each message to the app.
// Create it with New and call Run once.
type Runner struct {
	o      Options
	dd     Deduper // nil: dedup off
	log    *slog.Logger
	m      *metrics
	settle *settler
	sender *sender

	fetch      *fetcher    // nil with partitions
	parts      *partitions // nil without (partition.go)
	queue      <-chan queued
	took       func(queued) // told of each message a worker takes off queue; nil: none
	rel        *releases    // nil: no order per key
	track      *tracker
	gate       *gate
	prober     *prober
	breaker    *breaker
	batcher    *batcher      // nil: each message alone
	places     chan struct{} // with batches: a message held or an entry handed off (handoff.go)
	order      *orderer      // nil: no order per key
	ph         *phases
	quickCheck bool // dd is a quickChecker

	workers sync.WaitGroup
	parked  atomic.Int64 // workers holding a message while the gate is closed
	probers atomic.Int64 // workers holding a message while the gate is closed: each may be the breaker's probe
	// freshProbers: those of them holding a message on its first
	// delivery, the probes that tell a healthy app (breaker.go).
	freshProbers atomic.Int64
	wasUp        atomic.Bool // the app has been available at least once
	storeDown    atomic.Bool // the dedup store failed its last check
}

// New returns a Runner for cons. dl stores dead letters; dd may be nil to
// turn dedup off. It rejects invalid options with an error naming each.
func New(cons jetstream.Consumer, dl DeadLetterer, dd Deduper, o Options) (*Runner, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Runner{
		o: o, dd: dd,
		log: o.Logger.With("component", "proxy"),
		m:   newMetrics(o.Registerer, o.DeadLetterCounter),
	}
	r.sender = newSender(o, r.m)
	if qc, ok := dd.(quickChecker); ok {
		r.quickCheck = qc.QuickCheck()
	}
	o.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "courier_held_messages",
		Help: "Messages held in progress while deliveries are held (courier_delivery_held): the app or the dedup store unavailable, the breaker open, the consumer paused.",
	}, r.heldMessages))
	for c := range nCauses {
		o.Registerer.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "courier_delivery_held_seconds_total",
			Help:        "Time courier held deliveries for this cause, counted while it lasts.",
			ConstLabels: prometheus.Labels{"cause": c.Label()},
		}, func() float64 { return r.gate.heldSeconds(c) }))
	}
	r.track = newTracker(o.AckWait, o.Now, r.m.inProgress.Inc)
	r.gate = newGate(o.Now, r.gateChanged)
	r.settle = newSettler(o, r.log, r.m, r.track, dd, dl, r.gate)
	if o.AppHealthURL != "" {
		// Gated start-up: the app is not known to be healthy yet.
		r.gate.hold(causeApp, "waiting for the app's health URL to answer 2xx")
	} else {
		r.wasUp.Store(true)
	}
	r.breaker = newBreaker(o.BreakerFailures, o.BreakerProbe, o.BackoffMax, r.gate)
	registerInflightMetrics(o.Registerer, r.sender.inflight)
	if o.BatchMax > 1 {
		r.batcher = newBatcher(r)
		r.places = make(chan struct{}, o.MaxInflight*o.BatchMax)
	}
	switch {
	case o.Partitions != nil:
		r.rel = newReleases()
		r.parts = newPartitions(r, *o.Partitions)
		r.queue = r.parts.merged
		r.registerOrderMetrics(o.Registerer)
		r.registerPartitionMetrics(o.Registerer)
	default:
		r.fetch = newFetcher(cons, r.track, r.gate, r.log, o, false)
		r.fetch.noProbe = r.noProbe
		r.queue, r.took = r.fetch.queue, r.fetch.take
		if o.OrderKey != nil {
			r.rel = newReleases()
			r.order = newOrderer(o.OrderKey, o.Now, r.rel, r.orderFull)
			r.order.untrack = r.track.remove
			r.fetch.order, r.fetch.group, r.fetch.release = r.order, o.PriorityGroup, r.settle.nakNow
			if o.OrderMarks != nil {
				r.order.marks = newMarker(o.OrderMarks, r.log)
			}
			r.registerOrderMetrics(o.Registerer)
		}
	}
	// The probe's client dials as the app's default client does (a unix://
	// health URL to its socket) and redirects as the app's client does.
	probeClient := apphttp.NewClient(apphttp.ClientOptions{MaxConns: 1})
	probeClient.Timeout, probeClient.CheckRedirect = 5*time.Second, o.Client.CheckRedirect
	r.prober = newProber(r.gate, probeClient, o.AppURL, o.AppHealthURL, o.HealthInterval)
	r.prober.stamp = o.Stamp
	return r, nil
}

// noProbe reports that the breaker alone holds deliveries and no fresh
// message is held: the fetcher then pulls one, as retries make poor probes
// (breaker.go, detach).
func (r *Runner) noProbe() bool { return r.gate.onlyHeld(causeBreaker) && r.freshProbers.Load() == 0 }

// orderFull logs when the messages waiting behind their keys reach their
// bound, and when they are back under it.
func (r *Runner) orderFull(full bool) {
	if full {
		r.log.Warn("messages waiting behind their keys passed 64 MiB: fetching nothing until their keys move on")
	} else {
		r.log.Info("messages waiting behind their keys back under the bound: fetching again")
	}
}

// queued is how many messages wait in the fetch queues.
func (r *Runner) queued() int {
	if r.parts != nil {
		return r.parts.queued()
	}
	return len(r.fetch.queue)
}

// orderers are the lines of order per key: the durable's, or each
// partition's.
func (r *Runner) orderers() []*orderer {
	switch {
	case r.parts != nil:
		return r.parts.orderers()
	case r.order != nil:
		return []*orderer{r.order}
	}
	return nil
}

// gateChanged logs and counts each change of a cause that holds deliveries:
// one line when it starts, one when it ends.
func (r *Runner) gateChanged(c cause, held bool, reason string, heldFor time.Duration) {
	r.m.held.WithLabelValues(c.Label()).Set(b2f(held))
	if c == causeApp {
		r.m.appUp.Set(b2f(!held))
	}
	took := heldFor.Round(time.Millisecond).String()
	switch {
	case c == causeApp && held && !r.wasUp.Load():
		// Gated start-up: waiting, not an outage.
	case c == causeApp && held:
		r.log.Warn("app unavailable: holding messages and pausing fetching until it answers", "reason", reason)
	case c == causeApp && !r.wasUp.Swap(true):
		r.log.Info("app healthy: fetching", "waited", took)
	case c == causeApp:
		r.log.Info("app available again", "down_for", took)
	case held:
		r.log.Warn(c.stopLine(), "reason", reason)
	default:
		r.log.Info(c.resumeLine(), "held_for", took)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Ready reports nil while the consumer is bound and nothing holds
// deliveries (the app and the dedup store available), else why not.
func (r *Runner) Ready() error {
	if c, reason, held := r.gate.firstHeld(); held {
		return fmt.Errorf("%s: %s", c.readyLine(), reason)
	}
	if r.parts != nil {
		if err := r.parts.ready(); err != nil {
			return err
		}
	} else if !r.fetch.bound.Load() {
		return errors.New("consumer not bound")
	}
	return r.settle.ready()
}

// Released is how many messages were given back without delay (at shutdown,
// or a message without metadata) since Run began.
func (r *Runner) Released() int64 { return r.settle.released.Load() }

// ReferenceStored reports whether the message at seq of the runner's stream
// is the original of a reference dead letter this runner (or, through the
// dedup store, an earlier run of courier or, with the shared store, any
// replica) stored and left in its stream: it must not be delivered or
// dead-lettered again. With dedup off only this process's marks are known.
// An error means the dedup store could not answer. Safe for concurrent use,
// also after Run has returned, as long as the dedup store is open: the
// max-deliveries catch asks it (giveup.Options.ReferenceStored).
func (r *Runner) ReferenceStored(ctx context.Context, seq uint64) (bool, error) {
	return r.settle.refs.stored(ctx, seq)
}

// Alive reports nil while the runner's loops respond.
func (r *Runner) Alive() error {
	if since := r.o.Now().Sub(r.track.lastBeat()); since > 4*r.track.tickEvery()+10*time.Second {
		return fmt.Errorf("delivery loop silent for %s", since.Round(time.Second))
	}
	return nil
}

// Run consumes until ctx ends, then shuts down in the order phases names:
// stop fetching (the pull open at that moment runs to its end, within
// fetchWait), give back what was fetched but not started, let in-flight
// requests finish within the grace period (and ack them), give back the
// rest. It returns nil after a clean shutdown, or an error the runner cannot
// recover from (the consumer was deleted).
func (r *Runner) Run(ctx context.Context) error {
	ph, release := newPhases(ctx)
	defer release()
	r.ph = ph
	r.settle.start(ph)

	// The tracker, the prober and the summary outlive the stop signal: held
	// and in-flight messages stay in progress until they are settled, and
	// the last summary counts them.
	loops, stopLoops := context.WithCancel(context.WithoutCancel(ctx))
	var loopsDone sync.WaitGroup
	loopsDone.Add(3)
	go func() { defer loopsDone.Done(); r.track.run(loops) }()
	go func() { defer loopsDone.Done(); r.prober.run(loops) }()
	go func() { defer loopsDone.Done(); r.summarize(loops, r.o.SummaryInterval) }()
	if r.fetch != nil {
		loopsDone.Add(1)
		go func() { defer loopsDone.Done(); r.fetch.watch(loops) }()
	}
	defer r.breaker.stop()
	if r.order != nil {
		r.startOrder(ctx, loops, &loopsDone)
	}

	workers := r.o.MaxInflight
	if r.batcher != nil {
		// They hand their deliveries to batches, which settle them; places
		// bound what they hold (handoff.go).
		r.batcher.start()
	}
	r.workers.Add(workers)
	for range workers {
		go r.worker()
	}

	var fatal error
	if r.parts != nil {
		fatal = r.parts.run(ctx, loops)
	} else {
		fatal = r.fetch.run(ctx)
	}
	if fatal != nil {
		fatal = fmt.Errorf("consumer %q on stream %q: %w", r.o.Consumer, r.o.Stream, fatal)
	}
	r.shutdown(loops)
	stopLoops()
	loopsDone.Wait()
	if r.parts != nil {
		r.parts.wg.Wait()
	}
	return fatal
}

// shutdown is Run's shutdown, in order, once fetching has stopped and the
// queue is closed: workers start nothing more and give back what is queued
// (but send a message on its last delivery); in-flight requests get the
// grace period, then are abandoned; what waits behind its key goes back in
// stream order; each partition is given up. Then Run stops the loops.
func (r *Runner) shutdown(loops context.Context) {
	ph := r.ph
	ph.endNoStart()
	ph.endFetch()
	done := make(chan struct{})
	go func() { r.workers.Wait(); close(done) }()
	grace := time.NewTimer(r.o.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		r.log.Warn("shutdown grace period over: abandoning in-flight requests; their messages are given back for redelivery",
			"grace", r.o.ShutdownGrace.String())
		ph.abandon()
		<-done
	}
	if r.batcher != nil {
		r.batcher.stop() // every entry is answered: no batch is in flight
	}
	// Dead letters and success records still being retried give their
	// messages back (fetched has ended); the recorder finishes what it was
	// given; then the loops stop, the summary last.
	r.settle.stop()
	// Messages still waiting behind their keys go back in stream order, so
	// that JetStream redelivers them in it.
	if r.order != nil {
		for _, q := range r.order.drain() {
			r.settle.giveBack(r.settle.make.message(q.m), afterLastPull, "shutting down while it waited behind its key")
		}
	}
	// Each partition, holding nothing now, is given up for the next
	// courier to take at once (partition.go).
	if r.parts != nil {
		r.parts.drainAndFinish(loops)
	}
}
