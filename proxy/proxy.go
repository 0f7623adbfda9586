// The Runner: it wires one subscription's path (New) and runs it (Run),
// shutting down in the order phases.go names.

package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/ordermark"
)

// Runner consumes a durable consumer and delivers each message to the app.
// Create it with New and call Run once.
type Runner struct {
	o      Options
	log    *slog.Logger
	m      *metrics
	settle *settler
	decide *decider

	src     *source
	track   *tracker
	gate    *gate
	breaker *breaker
	batcher *batcher // nil: each message alone
	ph      *phases

	workers sync.WaitGroup
	hold    *holder
}

// New returns a Runner for cons. dl stores dead letters; dd may be nil to
// turn dedup off. It rejects invalid options with an error naming each.
func New(cons jetstream.Consumer, dl DeadLetterer, dd Deduper, o Options) (*Runner, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Runner{
		o:   o,
		log: o.Logger.With("component", "proxy"),
		m:   newMetrics(o.Registerer, o.DeadLetterCounter),
	}
	send := newSender(o, r.m)
	trace := newTracing(o)
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
	gl := &gateLog{m: r.m, log: r.log}
	r.gate = newGate(o.Now, gl.changed)
	r.settle = newSettler(o, r.log, r.m, r.track, dd, dl, r.gate)
	if o.AppHealthURL != "" {
		// Gated start-up: the app is not known to be healthy yet.
		r.gate.hold(causeApp, "waiting for the app's health URL to answer 2xx")
	} else {
		gl.wasUp.Store(true)
	}
	r.breaker = newBreaker(o.BreakerFailures, o.BreakerProbe, o.BreakerProbeMax, r.gate, r.log)
	r.hold = &holder{gate: r.gate, breaker: r.breaker}
	dc := &decider{o: o, log: r.log, m: r.m, settle: r.settle, breaker: r.breaker, hold: r.hold, gate: r.gate,
		trace: trace, workers: &r.workers, detach: r.detach, check: unchecked{}}
	r.decide = dc
	if dd != nil {
		dc.check = newChecker(dd, r.gate, r.m, r.hold, r.settle.flights, r.breaker)
	}
	registerInflightMetrics(o.Registerer, send.inflight)
	if o.BatchMax > 1 {
		r.batcher = newBatcher(o, send, dc, r.hold, &r.workers, trace, r.log)
		dc.way, dc.batcher = r.batcher, r.batcher
	} else {
		var keep int64
		if o.Success != nil {
			keep = o.MaxPayload // the answer makes the success record
		}
		dc.way = alone{s: send, keep: keep}
	}
	src := &source{}
	r.src = src
	switch {
	case o.Partitions != nil:
		src.rel = newLetGo()
		src.parts = newPartitions(*o.Partitions, o, r.log, r.track, r.gate, r.hold, r.settle, src.rel)
		src.queue = src.parts.merged
		src.registerOrderMetrics(o.Registerer)
		src.registerPartitionMetrics(o.Registerer)
	default:
		src.fetch = newFetcher(cons, r.track, r.gate, r.log, o, false)
		src.fetch.noProbe = r.hold.noProbe
		src.queue, src.took = src.fetch.queue, src.fetch.take
		if o.OrderKey != nil {
			src.rel = newLetGo()
			src.order = newOrderer(o.OrderKey, o.Now, src.rel, orderFull(r.log))
			src.order.untrack, src.order.lapse = r.track.remove, r.track.lapse
			src.order.markWait = orderBarrier(o.AckWait)
			src.fetch.order, src.fetch.group, src.fetch.giveBack = src.order, o.PriorityGroup, r.settle.nakNow
			src.fetch.handover, src.fetch.membership = o.Handover, o.Membership
			if o.OrderMarks != nil {
				src.order.marks = newMarker(ordermark.NewCapped(o.OrderMarks, ordermark.Cap{MaxDelay: max(o.BackoffMax, o.RetryAfterMax), AckWait: o.AckWait, Now: o.Now, Logger: r.log}), r.log)
			}
			if o.Membership != nil && o.PriorityGroup != "" {
				src.order.setLease(o.Membership.Term)
			}
			src.registerOrderMetrics(o.Registerer)
		}
	}
	// The probe's client dials as the app's default client does (a unix://
	// health URL to its socket) and redirects as the app's client does.
	probeClient := apphttp.NewClient(apphttp.ClientOptions{MaxConns: 1})
	probeClient.Timeout, probeClient.CheckRedirect = 5*time.Second, o.Client.CheckRedirect
	r.gate.prober = newProber(r.gate, probeClient, o.AppURL, o.AppHealthURL, o.HealthInterval)
	r.gate.prober.stamp = o.Stamp
	return r, nil
}

// Ready reports nil while the consumer is bound and nothing holds
// deliveries (the app and the dedup store available), else why not.
func (r *Runner) Ready() error {
	if c, reason, held := r.gate.firstHeld(); held {
		return fmt.Errorf("%s: %s", c.readyLine(), reason)
	}
	if err := r.src.ready(); err != nil {
		return err
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

// Pins returns, for each partition this courier holds the pin of, the pin
// id the server gave it (its consumer's priority group state names it):
// `courier status` matches them. Without partitions, the durable's pin as
// partition 0, when its pulls name a priority group and it holds the pin;
// else nil.
func (r *Runner) Pins() map[int]string {
	if r.src.parts != nil {
		return r.src.parts.pins()
	}
	if f := r.src.fetch; f.group != "" {
		if p := f.pinNow.Load(); p != nil {
			return map[int]string{0: *p}
		}
	}
	return nil
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
// recover from (the consumer was deleted: ErrConsumerGone).
func (r *Runner) Run(ctx context.Context) error {
	ph, release := newPhases(ctx)
	defer release()
	r.ph = ph
	r.settle.start(ph)
	r.decide.ph = ph

	// The tracker, the prober and the summary outlive the stop signal: held
	// and in-flight messages stay in progress until they are settled, and
	// the last summary counts them.
	loops, stopLoops := context.WithCancel(context.WithoutCancel(ctx))
	var loopsDone sync.WaitGroup
	loopsDone.Add(3)
	go func() { defer loopsDone.Done(); r.track.run(loops) }()
	go func() { defer loopsDone.Done(); r.gate.runProber(loops) }()
	go func() { defer loopsDone.Done(); summarize(loops, r.m, r.log, r.o.SummaryInterval, r.heldMessages) }()
	defer r.breaker.stop()
	r.src.start(ctx, loops, &loopsDone, r.log, r.o)

	workers := r.o.MaxInflight
	if r.batcher != nil {
		// They hand their deliveries to batches, which settle them; places
		// bound what they hold (handoff.go).
		r.batcher.start(ph)
	}
	r.workers.Add(workers)
	for range workers {
		go r.worker()
	}

	fatal := r.src.run(ctx, loops, ph)
	if fatal != nil {
		fatal = fmt.Errorf("consumer %q on stream %q: %w", r.o.Consumer, r.o.Stream, fatal)
	}
	r.shutdown(loops)
	stopLoops()
	loopsDone.Wait()
	// The marks are written: the durable's pin goes to the next courier.
	r.src.handOn(ctx, r.track.held(), ph.requests.Err() != nil)
	r.src.wait()
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
	// that JetStream redelivers them in it; each partition, holding nothing
	// now, is given up for the next courier to take at once (partition.go).
	r.src.drain(loops, func(m jetstream.Msg) {
		r.settle.giveBack(r.settle.make.message(m), giveBackLater, "shutting down while it waited behind its key")
	})
}

// A worker parses a message's metadata once, when it takes the message, and
// hands it on: jetstream.Msg.Metadata parses the reply subject anew at every
// call.

// worker delivers queued messages until the fetcher closes the queue. While
// the gate is closed it holds the message it took (the tracker keeps it in
// progress) and waits; once courier is stopping it gives messages back
// instead of starting them.
func (r *Runner) worker() {
	defer r.workers.Done()
	ln, stop := r.ph.lane()
	defer stop()
	ln.timer = newRequestTimer(ln.requests, r.o.HTTPTimeout)
	if r.batcher != nil {
		ln.batchDone = make(chan result, 1)
	}
	defer ln.timer.close()
	for {
		r.batcher.takePlace()
		q, ok := r.src.next()
		if !ok {
			r.batcher.givePlace()
			return
		}
		switch r.decide.take(q, ln) {
		case endedDetached:
			return // a new worker has this one's place
		case endedHere:
			r.batcher.givePlace()
		}
		// Handed off: its place is its batch entry's until it is settled.
	}
}

// heldMessages is what courier holds for the app: messages waiting in
// workers, and, while the gate is closed, those queued behind them.
func (r *Runner) heldMessages() float64 {
	n := r.hold.parked.Load()
	if !r.hold.open() {
		n += int64(r.src.queued())
	}
	return float64(n)
}

// detach gives d's worker place to a new worker while d, a retry held for
// the breaker's next probe on its last allowed delivery, waits on its own
// goroutine (its worker returns once d is settled). Retries that keep
// failing could otherwise take every worker while the breaker is open, and
// leave no worker to take a fresh message, the probe that tells a healthy
// app: the fetcher pulls for one while no fresh message is held
// (holder.noProbe). Requests stay bounded by the in-flight limit (inflight.go).
//
// With batches, the place d held (handoff.go) is given back; d handed off
// to a batch has no worker waiting on it, so none is started.
func (r *Runner) detach(d *delivery) {
	d.detached = true
	r.batcher.givePlace()
	if d.handedOff {
		d.log.Debug("held for the next probe apart from the workers: its place is given back")
		return
	}
	r.workers.Add(1)
	go r.worker()
	d.log.Debug("held for the next probe apart from the workers: a new worker takes its place")
}
