package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/retry"
)

// The fetch queue holds queuePerWorker messages per in-flight slot (at least
// minQueue; with batches, at least a batch per slot), and at most queueBytes
// of them: minQueueBytes, or twice the largest message the server accepts if
// that is more. A pull asks for at least half of each, so one pull (a
// subscription and a request) serves many messages: measured at 16 in
// flight, pulls of 16 cost up to a fifth more CPU per message than pulls of
// 64; with batches of 32, pulls of 256 and more (a batch per slot) cost
// courier and the server about a tenth less each than pulls of 64. The byte
// budget bounds the memory the queue takes whatever the message size.
// Messages still queued at shutdown are given back, each having spent a
// delivery attempt.
const (
	queuePerWorker = 8
	minQueue       = 64
	minQueueBytes  = 8 << 20
	// msgOverhead covers what JetStream counts against a pull's byte limit
	// beyond the data and headers that max_payload bounds: subject, reply.
	msgOverhead = 64 << 10
)

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

// fetcher owns the pulls and the queue they fill: it is the only sender on
// queue and closes it when it stops. Every fetched message is tracked (kept in
// progress) the moment it arrives. It also re-reads the consumer's settings on
// the server, whose ack wait times the tracker's signals and whose pull limits
// bound each pull.
type fetcher struct {
	cons      jetstream.Consumer
	connected func() bool
	track     *tracker
	gate      *gate
	log       *slog.Logger
	now       func() time.Time
	every     time.Duration // how often the consumer's settings are re-read
	stamp     bool          // note when each message arrives (tracing's span start)

	// reconnects counts the connection's reconnections (nil: not known),
	// reconnected how many the pull loop last saw (checkReconnect).
	reconnects  func() uint64
	reconnected uint64
	// lastSeq is the highest stream sequence arrived (noteArrived), for
	// checkReconnect, which checks the first message of each pull
	// (firstOfPull) until recheckUntil. Used by the pull loop alone.
	lastSeq      uint64
	firstOfPull  bool
	recheckUntil time.Time

	queue    chan queued
	taken    chan struct{} // a worker took a message: there may be room
	bytes    atomic.Int64  // size of the queued messages
	maxBytes int64
	maxMsg   int64 // the largest message, as counted against maxBytes
	bound    atomic.Bool
	// lostAt is when pulls stopped reaching the consumer after it was
	// bound (zero while they reach it). Used by the pull loop alone.
	lostAt time.Time
	// noProbe reports that the breaker alone holds deliveries and no
	// worker holds a message that may be its probe (nil: never). Set once,
	// before run.
	noProbe func() bool
	// order, with order per key, admits each message as it arrives and
	// keeps those whose key is busy (nil: no order). Set once, before run.
	order *orderer
	// group is the priority group pulls name ("": none); pin, the pin id
	// last seen on a message (the fetcher's own), and pinNow the same for
	// other goroutines.
	group, pin string
	pinNow     atomic.Pointer[string]
	// holdFor, when the pin has just come with a pull (checkPin), is how
	// many messages the consumer had out, holdUpTo the last stream
	// sequence it had delivered new, and arrivals how many of that pull
	// have arrived that were out then (a later one was delivered after):
	// keyed messages wait until they all have (endHold). Used by the pull
	// loop alone.
	holdFor, arrivals   int
	holdFloor, holdUpTo uint64
	// part, for a partition's fetcher (partition.go), is its session, and
	// wrap makes each of its messages the origin's (sourced.go). Set once,
	// before run.
	part pinnedPartition
	wrap func(jetstream.Msg) jetstream.Msg
	// giveBack gives a message back at once (settler.nakNow). Set once,
	// before run, with order.
	giveBack func(m jetstream.Msg, why string)
	// index is the partition pulled from (0: the durable), handover how
	// its pin is handed on, and membership this courier's standing among
	// the couriers of the durable (nil: none kept). Set once, before run.
	// pinned is the client the consumer had pinned when checkOrphaned
	// last read it, at pinnedRead (watch's).
	index      int
	handover   Handover
	membership Membership
	pinned     string
	pinnedRead time.Time
	// floorUntil: keys wait for what was out at a takeover (waitForOut)
	// until then at most; meanwhile the ack floor, which lets them go, is
	// read after every pull (readFloor), last at floorRead.
	floorUntil, floorRead time.Time

	// The consumer's settings as last read: its limits on one pull request
	// (its own or the server's; 0: none), its ack wait, its pause.
	mu                 sync.Mutex
	reqBatch, reqBytes int
	ackWait            time.Duration
	paused             bool
	pauseUntil         time.Time // zero: not paused, or paused with no end
	// replicated: the consumer's server is clustered, where a pull with a
	// byte limit loses the tail of its batch (see pull).
	replicated bool
}

// newFetcher returns the fetcher of cons. A partition's (small) has a
// smaller queue, as several feed the workers: twice the workers (at least
// 16 messages), a quarter of the bytes.
func newFetcher(cons jetstream.Consumer, track *tracker, g *gate, log *slog.Logger, o Options, small bool) *fetcher {
	// At least a batch per in-flight slot, with batches.
	size, bytes := max(queuePerWorker*o.MaxInflight, minQueue, o.MaxInflight*o.BatchMax), int64(minQueueBytes)
	if small {
		size, bytes = max(2*o.MaxInflight, 16, o.MaxInflight*o.BatchMax), minQueueBytes/4
	}
	f := &fetcher{
		cons: cons, connected: o.Connected, reconnects: o.Reconnects, track: track, gate: g, log: log, now: o.Now, every: o.InfoInterval,
		stamp: o.Tracer != nil,
		queue: make(chan queued, size),
		taken: make(chan struct{}, 1),
		// Any message fits in half: a pull asks for at least that much.
		maxBytes: max(bytes, 2*(o.MaxPayload+msgOverhead)),
		maxMsg:   o.MaxPayload + msgOverhead,
		ackWait:  o.AckWait,
	}
	if f.reconnects != nil {
		f.reconnected = f.reconnects()
	}
	if ci := cons.CachedInfo(); ci != nil {
		f.apply(ci)
	}
	return f
}

// take is called by a worker for each message it takes off the queue. It
// wakes the fetcher only once there is room for a pull: a wake for every
// message taken would cost the fetcher a futile turn each time.
func (f *fetcher) take(q queued) {
	if b := f.bytes.Add(-q.size); !f.hasRoom(len(f.queue), b) {
		return
	}
	select {
	case f.taken <- struct{}{}:
	default:
	}
}

// hasRoom reports whether a queue holding n messages of b bytes has room for
// a pull: at least half of it free, in messages and in bytes. Only the
// fetcher adds to the queue, so once a worker's take leaves room, room stays
// until the fetcher pulls.
func (f *fetcher) hasRoom(n int, b int64) bool {
	return cap(f.queue)-n >= max(cap(f.queue)/2, 1) && f.maxBytes-b >= f.maxBytes/2
}

// ErrConsumerGone is what Run returns, wrapped, when the consumer it reads
// (or a partition's) was deleted: fetching has ended for good, and running
// again needs the consumer made anew.
var ErrConsumerGone = errors.New("consumer deleted")

// run pulls until ctx ends or the consumer is gone, then closes the queue.
// It pauses while the gate is closed, and backs off while pulls fail.
func (f *fetcher) run(ctx context.Context) error {
	defer close(f.queue)
	policy := retry.Policy{Initial: 100 * time.Millisecond, Max: 10 * time.Second}
	for {
		err := retry.Do(ctx, policy, f.pull, func(err error, wait time.Duration) {
			f.log.Warn("cannot fetch; retrying", "error", err, "in", wait.Round(time.Millisecond).String())
		})
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return err // the consumer is gone
		}
	}
}

// pull runs one pull request to its end. It returns nil when the pull ended
// as pulls do, an error to be retried after a wait, or a permanent one when
// the consumer is gone.
func (f *fetcher) pull(ctx context.Context) error {
	if err := f.checkLease(ctx); err != nil {
		return err
	}
	if err := f.waitToFetch(ctx); err != nil {
		return err
	}
	if f.order != nil {
		if err := f.waitPinned(ctx, f.order.roomToFetch()); err != nil {
			return err
		}
	}
	room, byteRoom, ok := f.room(ctx)
	if !ok {
		return ctx.Err()
	}
	if f.part != nil && f.pin == "" {
		// A partition's first pull asks for one message: when the pin
		// comes with it, what else the consumer has out is exactly what
		// others hold (tookOver).
		room = 1
	}
	if f.connected != nil && !f.connected() {
		// nats.go's Fetch subscribes before it sends the pull request and
		// leaks the subscription if the request cannot be sent. The
		// connection reconnects by itself: wait for it rather than back
		// off, so that pulls go again the moment it is back (a backoff
		// grown through a server restart would keep the consumer unbound
		// for seconds after).
		f.notConsuming()
		return f.waitConnected(ctx)
	}
	opts := []jetstream.FetchOpt{jetstream.FetchMaxWait(fetchWait)}
	if f.group != "" {
		opts = append(opts, jetstream.FetchPriorityGroup(f.group))
	}
	if f.pullsByCount() {
		// A replicated consumer sends a pull's messages once their
		// delivery is replicated, but its 409 Batch Completed (count
		// reached, bytes to spare) or Message Size Exceeds MaxBytes at
		// once (nats-server 2.15 consumer.go, deliverMsg and
		// getNextMsg): the status overtakes the last messages, Fetch
		// ends on it and drops them, and each comes back only after the
		// ack wait with an attempt spent, pull after pull, until the
		// server gives up on it. So it is pulled by count alone, as many
		// as the byte budget holds at the largest size.
		room = min(room, int(max(byteRoom/f.maxMsg, 1)))
	} else {
		opts = append(opts, jetstream.FetchMaxBytes(int(byteRoom)))
	}
	batch, err := f.cons.Fetch(room, opts...)
	if err == nil {
		f.bound.Store(true)
		f.firstOfPull = true
		// The request ends by itself within fetchWait.
		for m := range batch.Messages() {
			f.arrived(ctx, m, room)
		}
		f.endHold(ctx)
		err = batch.Error()
		f.checkUnpinned(err)
		f.readFloor(ctx)
	}
	if endsNormally(err) {
		f.consuming()
		return nil
	}
	f.notConsuming()
	f.readFloor(ctx)
	if gone := f.consumerGone(ctx, err); gone != nil {
		return retry.Permanent(gone)
	}
	// A pull the consumer's settings refuse (an operator lowered its pull
	// limits) is refused every time: re-read them, and pull again at once if
	// they changed.
	if f.reread(ctx) {
		return nil
	}
	return err
}

// connectedPoll is how often a pull waiting for the NATS connection looks
// whether it is back: the client says so by a flag, not a channel.
const connectedPoll = 50 * time.Millisecond

// waitConnected waits until the NATS connection is up, or ctx ends (then
// it returns ctx's error).
func (f *fetcher) waitConnected(ctx context.Context) error {
	t := time.NewTicker(connectedPoll)
	defer t.Stop()
	for !f.connected() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// notConsuming notes a pull that failed or could not be sent: the consumer
// is not bound (/readyz) until one succeeds.
func (f *fetcher) notConsuming() {
	if f.bound.Swap(false) && f.lostAt.IsZero() {
		f.lostAt = f.now()
	}
}

// consuming notes a pull that ended as pulls do, and says so once after
// pulls stopped reaching the consumer (a NATS restart, a lost connection):
// the warnings of the loss have a line that ends them.
func (f *fetcher) consuming() {
	if f.lostAt.IsZero() {
		return
	}
	f.log.Info("consuming again", "not_consuming_for", f.now().Sub(f.lostAt).Round(time.Millisecond).String())
	f.lostAt = time.Time{}
}

// arrived takes in m, a message of a pull that asked for asked: tracked
// from now on, then queued for the workers, or kept behind its key. Only
// the pull loop sends to the queue, and room() left room for the whole
// pull.
func (f *fetcher) arrived(ctx context.Context, m jetstream.Msg, asked int) {
	if f.wrap != nil {
		m = f.wrap(m)
	}
	f.track.add(m)
	if f.order != nil {
		f.checkReconnect(ctx, m)
		f.noteArrived(m)
	}
	if f.group != "" && f.order != nil {
		f.checkPin(ctx, m, asked)
	}
	q := queued{m: m, size: queueSize(m)}
	if f.stamp {
		q.at = time.Now()
	}
	if f.order == nil || f.order.admit(&q) {
		f.bytes.Add(q.size)
		f.queue <- q
	} // else it waits behind its key
	if f.holdFor > 0 {
		if meta, err := m.Metadata(); err == nil && streamSeq(m, meta) <= f.holdUpTo {
			f.arrivals++
		}
		if f.arrivals >= f.holdFor {
			f.endHold(ctx)
		}
	}
}

// waitToFetch waits until the gate opens, or until the breaker alone holds
// deliveries and courier has no message to probe the app with: none queued,
// none held by a worker waiting to send it (any held message may be the
// probe). Each failed probe gives its message back, and
// nothing is fetched while the gate is closed, so a storm that outlasts the
// queue would otherwise leave the breaker without a probe, open for good.
// The messages such a pull brings are held, as any queued while the gate is
// closed, and the first is the next probe.
func (f *fetcher) waitToFetch(ctx context.Context) error {
	if f.noProbe == nil && f.group == "" {
		return f.gate.waitUp(ctx)
	}
	select {
	case <-f.gate.Up():
		return nil // the usual case: no timer
	default:
	}
	var tick <-chan time.Time
	for {
		if f.noProbe != nil && len(f.queue) == 0 && f.noProbe() {
			return nil
		}
		if f.group != "" && tick != nil {
			f.keepPin(ctx)
		}
		if tick == nil {
			t := time.NewTicker(fetchWait)
			defer t.Stop()
			tick = t.C
		}
		select {
		case <-f.gate.Up():
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
		}
	}
}

// endsNormally reports whether a pull ended the way pulls end: its count or
// bytes reached (409 Batch Completed, which on a replicated consumer can come
// before the last messages of the pull; 409 Message Size Exceeds MaxBytes),
// its expiry (408) or no messages (404), or the consumer's leader moving or
// its server shutting down (409 Leadership Change, Server Shutdown: the next
// pull goes to the new leader). None of them is a failure: pull again at
// once.
func endsNormally(err error) bool {
	return err == nil ||
		errors.Is(err, jetstream.ErrPinIDMismatch) || // the pin moved: the next pull asks anew
		errors.Is(err, jetstream.ErrBatchCompleted) ||
		errors.Is(err, jetstream.ErrMaxBytesExceeded) ||
		errors.Is(err, jetstream.ErrNoMessages) ||
		errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, jetstream.ErrConsumerLeadershipChanged) ||
		errors.Is(err, jetstream.ErrServerShutdown)
}

// room waits until the queue has room for a pull of at least half its size in
// messages and bytes, and returns how much to ask for (within the consumer's
// limits: a pull over them is refused outright).
func (f *fetcher) room(ctx context.Context) (n int, bytes int64, ok bool) {
	for {
		queued, b := len(f.queue), f.bytes.Load()
		if f.hasRoom(queued, b) {
			n, bytes = cap(f.queue)-queued, f.maxBytes-b
			break
		}
		if f.waitPinned(ctx, f.taken) != nil {
			return 0, 0, false
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reqBatch > 0 {
		n = min(n, f.reqBatch)
	}
	if f.reqBytes > 0 {
		bytes = min(bytes, int64(f.reqBytes))
	}
	return n, bytes, true
}

// watch re-reads the consumer's settings every interval until ctx ends: its
// ack wait, pull limits and pause can be changed on the server (an operator,
// another instance in a rollout) while courier runs. It runs beside the pulls
// so that a pause, which stops them, is still seen to end. With a
// membership, it also gives up the pin of a courier that is gone, for this
// one to take (checkOrphaned).
func (f *fetcher) watch(ctx context.Context) {
	t := time.NewTicker(f.every)
	defer t.Stop()
	var orphans <-chan time.Time
	if f.membership != nil && f.handover.Unpin != nil && f.group != "" && f.order != nil {
		ot := time.NewTicker(orphanEvery)
		defer ot.Stop()
		orphans = ot.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.reread(ctx)
		case <-orphans:
			f.checkOrphaned(ctx)
		}
	}
}

// pullsByCount reports whether pulls go without a byte limit: on a
// clustered server.
func (f *fetcher) pullsByCount() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.replicated
}

// reread reads the consumer's settings from the server and applies them. It
// reports whether the pull limits changed.
func (f *fetcher) reread(ctx context.Context) (limitsChanged bool) {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := f.cons.Info(ictx)
	if err != nil {
		f.log.Debug("cannot read the consumer's settings", "error", err)
		if f.order != nil && ctx.Err() == nil {
			f.order.postpone()
		}
		return false
	}
	return f.apply(info)
}

// apply takes the consumer's settings as the server has them.
func (f *fetcher) apply(info *jetstream.ConsumerInfo) (limitsChanged bool) {
	c := &info.Config
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.AckWait > 0 && c.AckWait != f.ackWait {
		f.log.Info("timing in-progress signals by the consumer's ack wait on the server",
			"ack_wait", c.AckWait.String(), "was", f.ackWait.String())
		f.ackWait = c.AckWait
		f.track.setAckWait(c.AckWait)
	}
	f.pauseUntil = time.Time{}
	if info.Paused && c.PauseUntil != nil {
		f.pauseUntil = *c.PauseUntil
	}
	if info.Paused != f.paused {
		f.paused = info.Paused
		if info.Paused {
			until := "further notice"
			if c.PauseUntil != nil {
				until = c.PauseUntil.UTC().Format(time.RFC3339)
			}
			f.gate.hold(causePaused, "until "+until+" (courier resume ends it)")
		} else {
			f.gate.free(causePaused)
		}
	}
	f.replicated = info.Cluster != nil && info.Cluster.Name != ""
	if f.order != nil {
		f.order.ackFloor(info.AckFloor.Stream)
	}
	if c.MaxRequestBatch != f.reqBatch || c.MaxRequestMaxBytes != f.reqBytes {
		f.log.Info("pulling within the consumer's request limits",
			"max_request_batch", c.MaxRequestBatch, "max_request_max_bytes", c.MaxRequestMaxBytes)
		f.reqBatch, f.reqBytes = c.MaxRequestBatch, c.MaxRequestMaxBytes
		return true
	}
	return false
}

// pausedUntil is when the consumer's pause ends, as last read; zero when it
// is not paused (or its pause has no end).
func (f *fetcher) pausedUntil() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pauseUntil
}

// consumerGone returns an error if err means the consumer was deleted.
func (f *fetcher) consumerGone(ctx context.Context, err error) error {
	if !errors.Is(err, jetstream.ErrConsumerDeleted) {
		// A pull to a consumer that no longer exists finds no responders.
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, ierr := f.cons.Info(ictx); !errors.Is(ierr, jetstream.ErrConsumerNotFound) &&
			!errors.Is(ierr, jetstream.ErrStreamNotFound) {
			return nil
		}
	}
	return fmt.Errorf("%w: %w", ErrConsumerGone, err)
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
