// Package proxy owns one message's life in courier: its dedup key, the dedup
// check, the HTTP request to the app, the classification of the answer, and
// the ack / NAK-with-delay / dead-letter decision; plus the bounded worker
// pool and the fetch loop around it, which pauses and holds what it has while
// the app is unavailable. It knows nothing of how keys or dead letters are
// stored: it declares Deduper and DeadLetterer and is given implementations.
package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Deduper remembers processed idempotency keys. Implementations must be safe
// for concurrent use.
type Deduper interface {
	// Seen reports whether key was recorded as processed and has not expired.
	Seen(ctx context.Context, key string) (bool, error)
	// Record records keys as processed, together (the runner gathers the
	// keys of concurrent deliveries into one call), and returns nil only
	// once every one is stored durably.
	Record(ctx context.Context, keys ...string) error
}

// DeadLetter describes a message courier gives up on.
type DeadLetter struct {
	Subject       string
	Data          []byte
	Header        nats.Header // the original's headers, as stored
	Stream        string
	StreamCreated time.Time
	Sequence      uint64
	Published     time.Time
	Consumer      string
	Reason        string
	Status        int // last HTTP status, 0 if none
	Error         string
	Attempts      int
	FailedAt      time.Time
}

// DeadLetterer stores dead letters. DeadLetter must return nil only once the
// dead letter is stored durably (publish acknowledged by a stream), and must
// be safe for concurrent use.
type DeadLetterer interface {
	DeadLetter(ctx context.Context, dl DeadLetter) error
}

// Dead-letter reasons decided here.
const (
	ReasonRejected  = "rejected"
	ReasonExhausted = "exhausted"
	ReasonExpired   = "expired"
	// ReasonUnavailable: courier stopped during an app outage while holding
	// a message on its last allowed delivery, which a NAK would lose.
	ReasonUnavailable = "app-unavailable"
)

// Options configures a Runner. Zero values take the documented defaults.
type Options struct {
	// AppURL receives each message as a POST. Required.
	AppURL string
	// AppHealthURL, when set, must answer 2xx before courier fetches, and is
	// polled every HealthInterval to notice the app going away.
	AppHealthURL string
	// HealthInterval is how often a healthy app's health URL is polled.
	// Default 5s.
	HealthInterval time.Duration
	// Stream and Consumer name where messages come from. Required.
	Stream, Consumer string
	// StreamCreated is the stream's creation time, part of derived keys.
	StreamCreated time.Time
	// MaxDeliver is the consumer's delivery budget. Default 5.
	MaxDeliver int
	// AckWait is the consumer's ack wait. Default 30s.
	AckWait time.Duration
	// MaxInflight bounds concurrent requests to the app. Default 8.
	MaxInflight int
	// HTTPTimeout bounds one request. Default 30s.
	HTTPTimeout time.Duration
	// BackoffInitial, BackoffMax and BackoffMultiplier shape the retry
	// schedule before jitter. Defaults 1s, 10m, 2.
	BackoffInitial, BackoffMax time.Duration
	BackoffMultiplier          float64
	// RetryAfterMax caps an app's Retry-After. Default 10m.
	RetryAfterMax time.Duration
	// Retryable reports whether a status is transient. Default: 408, 429,
	// 500 and 502-599.
	Retryable func(status int) bool
	// MaxAge dead-letters messages older than this instead of sending
	// them; 0 means never.
	MaxAge time.Duration
	// IdempotencyHeader names the header carrying the dedup key. Default
	// Idempotency-Key.
	IdempotencyHeader string
	// ShutdownGrace is how long in-flight requests may finish after the
	// run context ends. Default 25s.
	ShutdownGrace time.Duration
	// Client sends requests to the app; default NewClient sized to
	// MaxInflight.
	Client *http.Client
	// Logger receives logs; default discards.
	Logger *slog.Logger
	// Registerer receives the metrics; default a private registry.
	Registerer prometheus.Registerer
	// DeadLetterCounter, when set, is the registered
	// courier_dead_letters_total vector (NewDeadLetterCounter) to count
	// dead letters on, shared with other components; default one of the
	// runner's own.
	DeadLetterCounter *prometheus.CounterVec
	// MaxPayload is the largest message the server accepts
	// (nats.Conn.MaxPayload). It sizes the byte budget of the fetch queue so
	// that any message fits. Default 1 MiB, NATS's own default.
	MaxPayload int64
	// Now is the clock; default time.Now.
	Now func() time.Time
}

func (o *Options) defaults() error {
	if o.AppURL == "" || o.Stream == "" || o.Consumer == "" {
		return errors.New("proxy: AppURL, Stream and Consumer are required")
	}
	if o.MaxDeliver <= 0 {
		o.MaxDeliver = 5
	}
	if o.AckWait <= 0 {
		o.AckWait = 30 * time.Second
	}
	if o.MaxInflight <= 0 {
		o.MaxInflight = 8
	}
	if o.MaxPayload <= 0 {
		o.MaxPayload = 1 << 20
	}
	if o.HTTPTimeout <= 0 {
		o.HTTPTimeout = 30 * time.Second
	}
	if o.BackoffInitial <= 0 {
		o.BackoffInitial = time.Second
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = 10 * time.Minute
	}
	if o.BackoffMultiplier < 1 {
		o.BackoffMultiplier = 2
	}
	if o.RetryAfterMax <= 0 {
		o.RetryAfterMax = 10 * time.Minute
	}
	if o.Retryable == nil {
		o.Retryable = func(s int) bool { return s == 408 || s == 429 || s == 500 || (s >= 502 && s <= 599) }
	}
	if o.IdempotencyHeader == "" {
		o.IdempotencyHeader = HeaderIdempotencyKey
	}
	if o.ShutdownGrace < 0 {
		o.ShutdownGrace = 0
	} else if o.ShutdownGrace == 0 {
		o.ShutdownGrace = 25 * time.Second
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = 5 * time.Second
	}
	if o.Client == nil {
		o.Client = NewClient(ClientOptions{MaxConns: o.MaxInflight})
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// Runner consumes a durable consumer and delivers each message to the app.
// Create it with New and call Run once.
type Runner struct {
	cons jetstream.Consumer
	dl   DeadLetterer
	dd   Deduper // nil: dedup off
	o    Options
	log  *slog.Logger
	m    *metrics

	track   *tracker
	flights *flights
	gate    *gate
	prober  *prober

	stop context.Context // Run's context: ends fetching and waiting
	work context.Context // ends in-flight requests after the grace period
	// halted ends once fetching has stopped. Messages are given back at
	// shutdown only then: a NAK'd message could otherwise come straight
	// back to the open pull and spend another delivery.
	halted context.Context
	// quit ends with stop or once fetching has stopped for any reason (the
	// consumer was deleted): workers then start nothing more.
	quit    context.Context
	workers sync.WaitGroup

	// ready queues fetched messages (tracked from arrival) for the
	// workers; taken wakes the fetch loop when a worker takes one. queued
	// is the size of the messages in it, kept under queueBytes.
	ready      chan queuedMsg
	taken      chan struct{}
	queued     atomic.Int64
	queueBytes int64
	// reqBatch and reqBytes are the consumer's limits on one pull request
	// (its own or the server's; 0: none).
	reqBatch, reqBytes int
	// recs hands delivered messages to the recorder (dedup on).
	recs      chan recJob
	recorders sync.WaitGroup
	bound     atomic.Bool
	parked    atomic.Int64 // workers waiting for the app with a message
	wasUp     atomic.Bool  // the app has been available at least once
}

// New returns a Runner for cons. dl stores dead letters; dd may be nil to
// turn dedup off.
func New(cons jetstream.Consumer, dl DeadLetterer, dd Deduper, o Options) (*Runner, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	r := &Runner{
		cons: cons, dl: dl, dd: dd, o: o,
		log:     o.Logger.With("component", "proxy"),
		m:       newMetrics(o.Registerer, o.DeadLetterCounter),
		ready:   make(chan queuedMsg, max(queuePerWorker*o.MaxInflight, minQueue)),
		taken:   make(chan struct{}, 1),
		recs:    make(chan recJob, maxRecordBatch),
		flights: newFlights(),
		// Any message fits in half: a pull asks for at least that much.
		queueBytes: max(minQueueBytes, 2*(o.MaxPayload+msgOverhead)),
	}
	if ci := cons.CachedInfo(); ci != nil {
		r.reqBatch, r.reqBytes = ci.Config.MaxRequestBatch, ci.Config.MaxRequestMaxBytes
	}
	o.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "courier_held_messages",
		Help: "Messages held in progress while the app is unavailable.",
	}, r.heldMessages))
	r.track = newTracker(o.AckWait, o.Now, r.m.inProgress.Inc)
	startUp := o.AppHealthURL == ""
	r.gate = newGate(startUp, "waiting for the app's health URL to answer 2xx", o.Now, r.gateChanged)
	if startUp {
		r.m.appUp.Set(1)
		r.wasUp.Store(true)
	}
	probeClient := &http.Client{Timeout: 5 * time.Second, CheckRedirect: o.Client.CheckRedirect}
	r.prober = newProber(r.gate, probeClient, o.AppURL, o.AppHealthURL, o.HealthInterval)
	return r, nil
}

func (r *Runner) gateChanged(up bool, reason string, downFor time.Duration) {
	if up {
		r.m.appUp.Set(1)
		if !r.wasUp.Swap(true) {
			// Gated start-up: the app was never unavailable, only not yet
			// known to be healthy.
			r.log.Info("app healthy: fetching", "waited", downFor.Round(time.Millisecond).String())
			return
		}
		r.m.outage.Add(downFor.Seconds())
		r.log.Info("app available again", "down_for", downFor.Round(time.Millisecond).String())
		return
	}
	r.wasUp.Store(true)
	r.m.appUp.Set(0)
	r.log.Warn("app unavailable: holding messages and pausing fetching until it answers", "reason", reason)
}

// Ready reports nil while the consumer is bound and the app is not known to
// be unavailable, else why not.
func (r *Runner) Ready() error {
	if up, reason := r.gate.State(); !up {
		return fmt.Errorf("app unavailable: %s", reason)
	}
	if !r.bound.Load() {
		return errors.New("consumer not bound")
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

// Run consumes until ctx ends, then shuts down in order: stop fetching (the
// pull open at that moment runs out, within fetchWait), NAK what was fetched
// but not started, let in-flight requests finish within the grace period
// (and ack them), NAK the rest. It returns nil after a clean shutdown, or an
// error the runner cannot recover from (the consumer was deleted).
func (r *Runner) Run(ctx context.Context) error {
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	halted, halt := context.WithCancel(context.WithoutCancel(ctx))
	defer halt()
	quit, cancelQuit := context.WithCancel(ctx)
	defer cancelQuit()
	r.stop, r.work, r.halted, r.quit = ctx, work, halted, quit

	// The tracker outlives the stop signal: held and in-flight messages
	// stay in progress until they are acked or NAK'd.
	loops, stopLoops := context.WithCancel(context.WithoutCancel(ctx))
	var loopsDone sync.WaitGroup
	loopsDone.Add(2)
	go func() { defer loopsDone.Done(); r.track.run(loops) }()
	go func() { defer loopsDone.Done(); r.prober.run(loops) }()
	defer func() { stopLoops(); loopsDone.Wait() }()

	r.workers.Add(r.o.MaxInflight)
	for range r.o.MaxInflight {
		go r.worker()
	}
	if r.dd != nil {
		r.recorders.Add(1)
		go r.recorder()
	}
	// After the workers (below): the recorder finishes what it was given.
	defer func() { close(r.recs); r.recorders.Wait() }()

	fatal := r.consume(ctx)

	// Shutdown order: fetching has stopped (consume returned, its last pull
	// ended). Give back what is queued, then give in-flight requests the
	// grace period.
	halt()
	cancelQuit()
	close(r.ready)
	for q := range r.ready {
		r.giveBack(q.m)
	}
	done := make(chan struct{})
	go func() { r.workers.Wait(); close(done) }()
	grace := time.NewTimer(r.o.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		r.log.Warn("shutdown grace period over: abandoning in-flight requests; their messages are NAK'd for redelivery",
			"grace", r.o.ShutdownGrace.String())
		cancelWork()
		<-done
	}
	return fatal
}

// The fetch queue holds queuePerWorker messages per worker (at least
// minQueue), and at most queueBytes of them: minQueueBytes, or twice the
// largest message the server accepts if that is more. A pull asks for at
// least half of each, so one pull (a subscription and a request) serves many
// messages: measured at 16 in flight, pulls of 16 cost up to a fifth more
// CPU per message than pulls of 64. The byte budget bounds the memory the
// queue takes whatever the message size. Messages still queued at shutdown
// are given back, each having spent a delivery attempt.
const (
	queuePerWorker = 8
	minQueue       = 64
	minQueueBytes  = 8 << 20
	// msgOverhead covers what JetStream counts against a pull's byte limit
	// beyond the data and headers that max_payload bounds: subject, reply.
	msgOverhead = 64 << 10
)

// queuedMsg is a fetched message waiting for a worker, with its size as
// counted against the queue's byte budget (measured once, on arrival).
type queuedMsg struct {
	m    jetstream.Msg
	size int64
}

// queueSize is m's size as counted against the queue's byte budget.
func queueSize(m jetstream.Msg) int64 {
	n := len(m.Data()) + len(m.Subject()) + len(m.Reply())
	for k, vs := range m.Headers() {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return int64(n)
}

// fetchWait bounds how long one pull request waits for messages.
//
// courier pulls with Fetch, one request at a time, and always runs a request
// to its end (batch complete, or the server's expiry) before deciding whether
// to pull again. It never unsubscribes from an open request, as stopping or
// draining a Consume does: a message the server has just sent to it would be
// lost in transit, counted as delivered, and come back only after the ack
// wait with an attempt spent, so an app outage would cost attempts and a
// message on its last delivery would be given up on.
const fetchWait = time.Second

// consume runs the fetch loop until ctx ends or the consumer is gone,
// pausing while the app is unavailable. Every fetched message is tracked (kept
// in progress) the moment it arrives and queued for the workers; the loop
// pulls only as many as the queue has room for, in messages and bytes, and
// only in batches of at least half of it.
func (r *Runner) consume(ctx context.Context) error {
	retry := 100 * time.Millisecond
	for ctx.Err() == nil {
		if err := r.gate.waitUp(ctx); err != nil {
			return nil
		}
		room := cap(r.ready) - len(r.ready)
		byteRoom := r.queueBytes - r.queued.Load()
		if room < max(cap(r.ready)/2, 1) || byteRoom < r.queueBytes/2 {
			select {
			case <-r.taken:
			case <-ctx.Done():
				return nil
			}
			continue
		}
		// A pull over the consumer's limits is refused outright, every
		// time: ask for no more than they allow.
		if r.reqBatch > 0 {
			room = min(room, r.reqBatch)
		}
		if r.reqBytes > 0 {
			byteRoom = min(byteRoom, int64(r.reqBytes))
		}
		batch, err := r.cons.Fetch(room, jetstream.FetchMaxWait(fetchWait), jetstream.FetchMaxBytes(int(byteRoom)))
		if err == nil {
			r.bound.Store(true)
			// The request ends by itself within fetchWait; only this loop
			// sends to ready, so there is always room.
			for m := range batch.Messages() {
				r.track.add(m)
				q := queuedMsg{m: m, size: queueSize(m)}
				r.queued.Add(q.size)
				r.ready <- q
			}
			err = batch.Error()
		}
		if err == nil {
			retry = 100 * time.Millisecond
			continue
		}
		r.bound.Store(false)
		if gone := r.consumerGone(ctx, err); gone != nil {
			return gone
		}
		r.log.Warn("cannot fetch; retrying", "error", err, "in", retry.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retry):
		}
		retry = min(retry*2, 10*time.Second)
	}
	return nil
}

// consumerGone returns an error if err means the consumer was deleted.
func (r *Runner) consumerGone(ctx context.Context, err error) error {
	if !errors.Is(err, jetstream.ErrConsumerDeleted) {
		// A pull to a consumer that no longer exists finds no responders.
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, ierr := r.cons.Info(ictx); !errors.Is(ierr, jetstream.ErrConsumerNotFound) &&
			!errors.Is(ierr, jetstream.ErrStreamNotFound) {
			return nil
		}
	}
	return fmt.Errorf("consumer %q on stream %q was deleted: %w", r.o.Consumer, r.o.Stream, err)
}

// worker delivers queued messages until the queue is closed. While the app is
// unavailable it waits (the message stays tracked, in progress); once courier
// is stopping it gives messages back instead of starting them.
func (r *Runner) worker() {
	defer r.workers.Done()
	for q := range r.ready {
		m := q.m
		r.queued.Add(-q.size)
		select {
		case r.taken <- struct{}{}:
		default:
		}
		if r.quit.Err() == nil && !r.appUp() {
			r.park(1)
			_ = r.gate.waitUp(r.quit)
			r.park(-1)
		}
		if r.quit.Err() != nil {
			r.giveBack(m)
			continue
		}
		r.deliver(m)
	}
}

func (r *Runner) appUp() bool {
	up, _ := r.gate.State()
	return up
}

// park counts a message that waits for the app (d=1) or stopped waiting
// (d=-1) among the held messages.
func (r *Runner) park(d int64) {
	r.parked.Add(d)
}

// heldMessages is what courier holds for the app: messages waiting in
// workers, and, while the app is away, those queued behind them.
func (r *Runner) heldMessages() float64 {
	n := r.parked.Load()
	if !r.appUp() {
		n += int64(len(r.ready))
	}
	return float64(n)
}

// giveBack returns a message courier will not start, once fetching has
// stopped (a NAK'd message could otherwise come straight back to the open
// pull and spend another delivery). During an app outage a message on its
// last allowed delivery is dead-lettered rather than given up on.
func (r *Runner) giveBack(m jetstream.Msg) {
	<-r.halted.Done()
	if r.appUp() {
		r.release(m, "shutting down")
		return
	}
	r.releaseOrDeadLetter(m, "shutting down during an app outage")
}

// release NAKs m without delay so another instance can take it at once.
func (r *Runner) release(m jetstream.Msg, why string) {
	r.track.remove(m)
	if err := m.Nak(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		r.log.Warn("cannot NAK message; it comes back after the ack wait", "subject", m.Subject(), "error", err)
	}
	r.m.released.Inc()
	r.log.Debug("message released", "subject", m.Subject(), "why", why)
}

// releaseOrDeadLetter releases m, unless this is its last allowed delivery:
// a NAK would then make JetStream give up on it, so it is dead-lettered.
func (r *Runner) releaseOrDeadLetter(m jetstream.Msg, why string) {
	meta, err := m.Metadata()
	if err == nil && int(meta.NumDelivered) >= r.o.MaxDeliver {
		f := failure{reason: ReasonUnavailable, err: errors.New(why)}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.stop), 5*time.Second)
		defer cancel()
		if r.deadLetterOnce(ctx, m, meta, f) {
			return
		}
	}
	r.release(m, why)
}

// maxStoredKey bounds what the dedup store holds per key; a longer key (an
// odd publisher's header) is stored as its SHA-256.
const maxStoredKey = 256

// storeKey is the form of key the dedup store and in-flight set use.
func storeKey(key string) string {
	if len(key) <= maxStoredKey {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// failure is why a message is dead-lettered.
type failure struct {
	reason string
	err    error
}

// deliver runs one delivery of m to its end: ack, NAK with delay, dead
// letter, or release at shutdown.
func (r *Runner) deliver(m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		r.log.Error("message without JetStream metadata; NAK'd", "subject", m.Subject(), "error", err)
		r.release(m, "no metadata")
		return
	}
	attempt := int(meta.NumDelivered)
	key := ResolveKey(m.Headers(), r.o.IdempotencyHeader, meta.Stream, r.o.StreamCreated, meta.Sequence.Stream)
	log := &msgLog{l: r.log, subject: m.Subject(), seq: meta.Sequence.Stream, key: key, attempt: attempt}

	if r.o.MaxAge > 0 {
		if age := r.o.Now().Sub(meta.Timestamp); age > r.o.MaxAge {
			r.deadLetter(m, meta, log, failure{reason: ReasonExpired,
				err: fmt.Errorf("message is %s old, over COURIER_MAX_AGE %s", age.Round(time.Millisecond), r.o.MaxAge)})
			return
		}
	}

	var fl *flight
	skey := storeKey(key)
	if r.dd != nil {
		var dup bool
		fl, dup, err = r.flights.claim(r.halted, skey)
		if err != nil {
			r.release(m, "shutting down while a delivery of the same key ran")
			return
		}
		if !dup {
			dup, err = r.dd.Seen(r.work, skey)
			if err != nil {
				r.m.dedupErrors.WithLabelValues("check").Inc()
				log.Error("dedup store check failed; message NAK'd, not sent unchecked", "error", err)
				r.flights.finish(skey, fl, false)
				r.nak(m, Delay(attempt, r.o.BackoffInitial, r.o.BackoffMax, r.o.BackoffMultiplier, rand.Int64N))
				return
			}
		}
		if dup {
			r.flights.finish(skey, fl, true)
			r.track.remove(m)
			if err := m.Ack(); err != nil {
				log.Warn("cannot ack duplicate; it comes back and is recognised again", "error", err)
			}
			r.m.duplicate.Inc()
			log.Debug("duplicate acked without calling the app")
			return
		}
	}

	r.attempt(m, meta, key, attempt, log, skey, fl)
}

// attempt sends m to the app, waiting out app outages without spending the
// attempt, and settles it; the flight fl of skey ends with its outcome. After
// a 2xx with dedup on, recording the key and the ack are handed to a
// recorder, so the worker takes the next message while the key commits.
func (r *Runner) attempt(m jetstream.Msg, meta *jetstream.MsgMetadata, key string, attempt int, log *msgLog, skey string, fl *flight) {
	ok := false
	defer func() {
		if !ok {
			r.flights.finish(skey, fl, false)
		}
	}()
	h, dropped := BuildHeaders(m, meta, key)
	for _, d := range dropped {
		r.m.dropped.Inc()
		log.Warn("header not passed to the app", "header", d.Name, "reason", d.Reason)
	}
	for {
		ctx, cancel := context.WithTimeout(r.work, r.o.HTTPTimeout)
		r.m.inflight.Inc()
		began := time.Now()
		err := Post(ctx, r.o.Client, r.o.AppURL, h, m.Data())
		took := time.Since(began)
		r.m.inflight.Dec()
		cancel()
		if err != nil && r.work.Err() != nil {
			// Abandoned at the end of the grace period: the attempt is spent
			// either way; give the message back at once. (A 2xx that came
			// in, its body cut off by the cancel, is still acked below.)
			r.release(m, "shutdown grace period over")
			return
		}
		r.m.request(resultLabel(err), took.Seconds())

		switch Classify(err, r.o.Retryable) {
		case Success:
			ok = true
			if r.dd != nil {
				r.recs <- recJob{m: m, skey: skey, fl: fl, log: log, took: took}
				return
			}
			r.acked(m, log, took)
			r.flights.finish(skey, fl, true)
			return

		case Unavailable:
			if r.halted.Err() != nil {
				r.releaseOrDeadLetter(m, "shutting down during an app outage")
				return
			}
			r.gate.setDown(err.Error())
			// Hold the message (the tracker keeps it in progress) until the
			// app is back, then try again: the outage spent nothing.
			r.park(1)
			werr := r.gate.waitUp(r.halted)
			r.park(-1)
			if werr != nil {
				r.releaseOrDeadLetter(m, "shutting down during an app outage")
				return
			}
			if r.o.MaxAge > 0 && r.o.Now().Sub(meta.Timestamp) > r.o.MaxAge {
				r.deadLetter(m, meta, log, failure{reason: ReasonExpired,
					err: fmt.Errorf("message exceeded COURIER_MAX_AGE %s while the app was unavailable", r.o.MaxAge)})
				return
			}
			continue

		case Transient:
			if attempt >= r.o.MaxDeliver {
				r.deadLetter(m, meta, log, failure{reason: ReasonExhausted, err: err})
				return
			}
			delay, fromApp := r.retryDelay(err, attempt)
			r.nak(m, delay)
			log.Info("retry scheduled", statusAttr(err), "error", err.Error(),
				"delay", delay.Round(time.Millisecond).String(), "retry_after", fromApp)
			return

		default: // Permanent
			r.deadLetter(m, meta, log, failure{reason: ReasonRejected, err: err})
			return
		}
	}
}

// recJob is a delivery the app answered 2xx, waiting for its key to be
// recorded before it is acked.
type recJob struct {
	m    jetstream.Msg
	skey string
	fl   *flight
	log  *msgLog
	took time.Duration
}

// maxRecordBatch bounds the keys recorded in one call to the store, and the
// deliveries waiting for the recorder.
const maxRecordBatch = 256

// recorder records the keys of delivered messages, then acks them and ends
// their flights, until recs is closed. It takes every delivery waiting (up
// to maxRecordBatch) and records their keys in one call, so the store
// commits the keys of concurrent workers together (group commit) and the
// batches grow with the load: while one commits, the next gathers. Each
// message is acked only after its key is recorded.
func (r *Runner) recorder() {
	defer r.recorders.Done()
	batch := make([]recJob, 0, maxRecordBatch)
	keys := make([]string, 0, maxRecordBatch)
	for j := range r.recs {
		batch = append(batch[:0], j)
	fill:
		for len(batch) < maxRecordBatch {
			select {
			case j, ok := <-r.recs:
				if !ok {
					break fill
				}
				batch = append(batch, j)
			default:
				break fill
			}
		}
		keys = keys[:0]
		for _, j := range batch {
			keys = append(keys, j.skey)
		}
		// Not r.work: a 2xx that arrived as the grace period ended is
		// recorded all the same.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.work), 10*time.Second)
		err := r.dd.Record(ctx, keys...)
		cancel()
		if err != nil {
			// The effect happened: calling the app again would surely
			// duplicate it, so the messages are acked anyway.
			r.m.dedupErrors.WithLabelValues("record").Add(float64(len(batch)))
		}
		for _, j := range batch {
			if err != nil {
				j.log.Error("dedup store could not record the key after a 2xx; acking anyway", "error", err)
			}
			r.acked(j.m, j.log, j.took)
			r.flights.finish(j.skey, j.fl, true)
		}
		clear(batch) // drop references to settled messages
	}
}

// acked acks a message the app answered 2xx (its key recorded, if dedup is
// on).
func (r *Runner) acked(m jetstream.Msg, log *msgLog, took time.Duration) {
	r.track.remove(m)
	if err := m.Ack(); err != nil {
		log.Warn("ack failed; the message comes back and is recognised as a duplicate", "error", err)
	}
	r.m.delivered.Inc()
	log.Info("delivered", "status", "2xx", "took", took.Round(time.Microsecond).String())
}

func statusAttr(err error) slog.Attr {
	var ae *AppError
	if errors.As(err, &ae) && ae.Kind == KindStatus {
		return slog.Int("status", ae.Status)
	}
	if errors.As(err, &ae) {
		return slog.String("status", ae.Kind.String())
	}
	return slog.String("status", "error")
}

// retryDelay is the app's Retry-After, capped, else full-jitter backoff at
// JetStream's delivery count.
func (r *Runner) retryDelay(err error, attempt int) (time.Duration, bool) {
	var ae *AppError
	if errors.As(err, &ae) && ae.RetryAfter != "" {
		if d, ok := RetryAfter(ae.RetryAfter, r.o.Now(), r.o.RetryAfterMax); ok {
			return d, true
		}
	}
	return Delay(attempt, r.o.BackoffInitial, r.o.BackoffMax, r.o.BackoffMultiplier, rand.Int64N), false
}

func (r *Runner) nak(m jetstream.Msg, delay time.Duration) {
	r.track.remove(m)
	var err error
	if delay > 0 {
		err = m.NakWithDelay(delay)
	} else {
		err = m.Nak()
	}
	if err != nil {
		r.log.Warn("NAK failed; the message comes back after the ack wait", "subject", m.Subject(), "error", err)
	}
	r.m.retried.Inc()
}

// deadLetter stores m's dead letter, then terminates m. While the dead letter
// cannot be stored, m is held in progress and the store is retried; at
// shutdown it is released instead, never dropped.
func (r *Runner) deadLetter(m jetstream.Msg, meta *jetstream.MsgMetadata, log *msgLog, f failure) {
	wait := 200 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(r.work, 10*time.Second)
		ok := r.deadLetterOnce(ctx, m, meta, f)
		cancel()
		if ok {
			log.Info("dead-lettered", "reason", f.reason, statusAttr(f.err), "error", f.err.Error())
			return
		}
		select {
		case <-r.halted.Done():
			r.release(m, "shutting down before its dead letter could be stored")
			return
		case <-time.After(wait):
		}
		wait = min(wait*2, 30*time.Second)
	}
}

// deadLetterOnce tries once to store m's dead letter and terminate m.
func (r *Runner) deadLetterOnce(ctx context.Context, m jetstream.Msg, meta *jetstream.MsgMetadata, f failure) bool {
	dl := DeadLetter{
		Subject: m.Subject(), Data: m.Data(), Header: m.Headers(),
		Stream: meta.Stream, StreamCreated: r.o.StreamCreated, Sequence: meta.Sequence.Stream,
		Published: meta.Timestamp, Consumer: r.o.Consumer,
		Reason: f.reason, Attempts: int(meta.NumDelivered), FailedAt: r.o.Now(),
	}
	if f.err != nil {
		dl.Error = f.err.Error()
		var ae *AppError
		if errors.As(f.err, &ae) {
			dl.Status = ae.Status
		}
	}
	if err := r.dl.DeadLetter(ctx, dl); err != nil {
		r.m.dlqErrors.Inc()
		r.log.Error("cannot store dead letter; message kept and tried again",
			"subject", dl.Subject, "seq", dl.Sequence, "reason", f.reason, "error", err)
		return false
	}
	r.track.remove(m)
	if err := m.TermWithReason(f.reason); err != nil {
		// The dead letter is stored; if the original comes back, its dead
		// letter's Nats-Msg-Id keeps the DLQ from storing it twice.
		r.log.Warn("cannot terminate dead-lettered message", "subject", dl.Subject, "error", err)
	}
	r.m.deadLettered.Inc()
	r.m.deadLetters.WithLabelValues(f.reason).Inc()
	return true
}

// msgLog logs about one message. Its attributes are added only to lines that
// are written: a Logger.With per message costs CPU even when nothing is.
type msgLog struct {
	l       *slog.Logger
	subject string
	seq     uint64
	key     string
	attempt int
}

func (ml *msgLog) log(level slog.Level, msg string, args ...any) {
	ctx := context.Background()
	if !ml.l.Enabled(ctx, level) {
		return
	}
	ml.l.Log(ctx, level, msg, append([]any{"subject", ml.subject, "seq", ml.seq, "key", ml.key, "attempt", ml.attempt}, args...)...)
}

func (ml *msgLog) Debug(msg string, args ...any) { ml.log(slog.LevelDebug, msg, args...) }
func (ml *msgLog) Info(msg string, args ...any)  { ml.log(slog.LevelInfo, msg, args...) }
func (ml *msgLog) Warn(msg string, args ...any)  { ml.log(slog.LevelWarn, msg, args...) }
func (ml *msgLog) Error(msg string, args ...any) { ml.log(slog.LevelError, msg, args...) }
