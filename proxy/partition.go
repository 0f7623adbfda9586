package proxy

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/ordermark"
)

// A durable split into partitions by its ordering key
// (Options.Partitions; README, "Order per key"). The runner pulls from the
// partitions its Assignment gives it: a session each, with a fetcher of its
// own that keeps the partition's pin (pin.go) and lines of its own (keys
// never span partitions), all feeding the one pool of workers. A partition
// taken from the runner is handed on (handOn): fetching stops, what no
// worker can finish here is given back in stream order, the rest is
// delivered, and once nothing of it is held, its marks written and the
// hand-over recorded, the pin is given up so that the next courier takes it
// at once. Run's shutdown does the same for every session.

// partitions are the sessions of the partitions this runner pulls from or
// is handing on. They hold no pointer to the runner: they are given what
// their fetchers and lines need, the settler to give messages back, and
// Run's phases when Run starts them.
type partitions struct {
	o      Partitions
	opts   Options
	log    *slog.Logger
	track  *tracker
	gate   *gate
	hold   *holder     // noProbe, for the fetchers
	settle *settler    // gives back what a partition handed on cannot finish
	rel    *letGo      // what the sessions' lines let go
	ph     *phases     // set by run
	merged chan queued // the workers' queue, fed by every session's fetcher

	mu       sync.Mutex
	sessions map[int]*session // not yet handed on
	ended    chan struct{}    // a session was handed on
	fatal    chan error       // a partition's consumer is gone
	feeders  sync.WaitGroup   // forwarders into merged
	wg       sync.WaitGroup   // fetch loops and hand-overs
}

// session is one partition's, from its assignment to its hand-over.
type session struct {
	i     int
	ps    *partitions
	f     *fetcher
	order *orderer
	// held counts the partition's messages the runner tracks (tracker):
	// fetched and not yet settled or given back.
	held      atomic.Int64
	stopFetch context.CancelFunc
	fetched   chan struct{} // closed once its fetcher's last pull ended
	stopLoops context.CancelFunc
	loopsDone sync.WaitGroup
	handing   bool // under partitions.mu
	finish    sync.Once
}

func newPartitions(o Partitions, opts Options, log *slog.Logger, track *tracker, g *gate, h *holder, s *settler, rel *letGo) *partitions {
	return &partitions{o: o, opts: opts, log: log, track: track, gate: g, hold: h, settle: s, rel: rel, merged: make(chan queued), sessions: map[int]*session{},
		ended: make(chan struct{}, 1), fatal: make(chan error, len(o.Consumers))}
}

// run starts and hands on sessions as the assignment changes, until ctx
// ends or a partition's consumer is gone; it returns once every fetcher's
// last pull has ended. The merged queue is closed once the fetchers' queues
// are empty.
func (ps *partitions) run(ctx, loops context.Context, ph *phases) error {
	ps.ph = ph
	var fatal error
	for fatal == nil && ctx.Err() == nil {
		want, changed := ps.o.Assignment.Assigned()
		ps.reconcile(ctx, loops, want)
		select {
		case <-ctx.Done():
		case fatal = <-ps.fatal:
		case <-changed:
		case <-ps.ended:
		}
	}
	ps.mu.Lock()
	all := ps.all()
	ps.mu.Unlock()
	for _, s := range all {
		s.stopFetch()
		<-s.fetched
	}
	go func() { ps.feeders.Wait(); close(ps.merged) }()
	return fatal
}

// reconcile starts a session for each partition of want without one, and
// hands on the sessions of the others.
func (ps *partitions) reconcile(ctx, loops context.Context, want []int) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, i := range want {
		if i >= 0 && i < len(ps.o.Consumers) && ps.sessions[i] == nil {
			ps.sessions[i] = ps.start(ctx, loops, i)
		}
	}
	for i, s := range ps.sessions {
		if !s.handing && !slices.Contains(want, i) {
			s.handing = true
			ps.wg.Add(1)
			go ps.handOn(s, loops)
		}
	}
}

// start begins pulling from partition i. Called with mu held.
func (ps *partitions) start(ctx, loops context.Context, i int) *session {
	s := &session{i: i, ps: ps, fetched: make(chan struct{})}
	log := ps.log.With("partition", i)
	f := newFetcher(ps.o.Consumers[i], ps.track, ps.gate, log, ps.opts, true)
	f.group, f.part, f.noProbe, f.giveBack = ps.opts.PriorityGroup, s, ps.hold.noProbe, ps.settle.nakNow
	f.index, f.handover, f.membership = i, ps.o.Handover, ps.opts.Membership
	f.wrap = func(m jetstream.Msg) jetstream.Msg { return newSourced(m, &s.held) }
	f.bound.Store(true) // until a pull fails
	s.f = f
	s.order = newOrderer(ps.opts.OrderKey, ps.opts.Now, ps.rel, orderFull(ps.log))
	s.order.untrack, s.order.lapse, s.order.rewinds = ps.track.remove, ps.track.lapse, ps.opts.Rewinds
	s.order.markWait = orderBarrier(ps.opts.AckWait)
	if m := ps.opts.Membership; m != nil {
		s.order.setLease(m.Term)
	}
	if ps.o.Marks != nil {
		if st := ps.o.Marks(i); st != nil {
			s.order.marks = newMarker(ordermark.NewCapped(st, ordermark.Cap{MaxDelay: max(ps.opts.BackoffMax, ps.opts.RetryAfterMax), AckWait: ps.opts.AckWait, Now: ps.opts.Now, Logger: log}), log)
		}
	}
	f.order = s.order

	fctx, stop := context.WithCancel(ctx)
	lctx, stopLoops := context.WithCancel(loops)
	s.stopFetch, s.stopLoops = stop, stopLoops
	s.loopsDone.Add(2)
	go func() { defer s.loopsDone.Done(); f.watch(lctx) }()
	go func() { defer s.loopsDone.Done(); liftLoop(lctx, s.order) }()
	if s.order.marks != nil {
		s.loopsDone.Add(1)
		go func() { defer s.loopsDone.Done(); s.order.marks.run(lctx) }()
	}
	ps.wg.Add(1)
	go func() {
		defer ps.wg.Done()
		err := f.run(fctx)
		close(s.fetched)
		if err != nil {
			select {
			case ps.fatal <- fmt.Errorf("partition %d: %w", i, err):
			default: // one is enough to stop
			}
		}
	}()
	ps.feeders.Add(1)
	go func() {
		defer ps.feeders.Done()
		for q := range f.queue {
			ps.merged <- q
			f.take(q)
		}
	}()
	log.Info("pulling from partition", "consumer", f.cons.CachedInfo().Name)
	return s
}

// handOn hands partition s on to the courier it is now assigned to:
// fetching stops, what cannot be finished here is given back in stream
// order, the rest is delivered while the pin is kept (holdPin), and once
// nothing of it is held, finish gives the pin up. If the runner stops
// first, Run's shutdown finishes the session.
func (ps *partitions) handOn(s *session, loops context.Context) {
	defer ps.wg.Done()
	s.stopFetch()
	<-s.fetched
	for _, q := range s.order.handOn() {
		ps.settle.giveBack(ps.settle.make.message(q.m), giveBackUnpulled, "its partition is handed to another courier")
	}
	s.f.log.Debug("handing the partition on once what it holds is settled", "held", s.held.Load())
	s.f.holdPin(loops, func() bool { return s.held.Load() == 0 }, func(m jetstream.Msg) {
		ps.settle.giveBack(ps.settle.make.message(m), giveBackNow, "its partition is handed to another courier")
	})
	if loops.Err() != nil {
		return
	}
	ps.finishSession(loops, s)
	ps.mu.Lock()
	delete(ps.sessions, s.i)
	ps.mu.Unlock()
	select {
	case ps.ended <- struct{}{}:
	default:
	}
	s.f.log.Info("partition handed on")
}

// finishSession ends session s once it holds nothing: what its lines
// still know is marked (each key's first unsettled message: a head given
// back unsent at shutdown among them), its loops stop (its marks are
// written), and if nothing of it was abandoned, its pin is handed on
// (fetcher.handOnPin): the next courier takes the partition at once; else
// the pin lapses after the consumer's PinnedTTL.
func (ps *partitions) finishSession(ctx context.Context, s *session) {
	s.finish.Do(func() {
		for _, q := range s.order.drain() {
			// Not expected: nothing of the partition is held.
			ps.settle.giveBack(ps.settle.make.message(q.m), giveBackUnpulled, "its partition is handed to another courier")
		}
		s.stopLoops()
		s.loopsDone.Wait()
		if s.held.Load() != 0 || ps.ph.requests.Err() != nil {
			return
		}
		s.f.handOnPin(ctx, s.order)
	})
}

// heldNow is how many of the partition's messages the runner tracks.
func (s *session) heldNow() int64 { return s.held.Load() }

// heldCount is the count the partition's messages carry (sourcedMsg.held).
func (s *session) heldCount() *atomic.Int64 { return &s.held }

// all is every session, in partition order. Called with mu held.
func (ps *partitions) all() []*session {
	out := make([]*session, 0, len(ps.sessions))
	for _, s := range ps.sessions {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *session) int { return a.i - b.i })
	return out
}

// drainAndFinish gives back, at Run's shutdown, what every session's lines
// still hold, in the work stream's order, then finishes each session.
func (ps *partitions) drainAndFinish(ctx context.Context, giveBack func(jetstream.Msg)) {
	ps.mu.Lock()
	all := ps.all()
	ps.mu.Unlock()
	var left []queued
	for _, s := range all {
		left = append(left, s.order.drain()...)
	}
	slices.SortFunc(left, func(a, b queued) int { return cmp.Compare(a.seq, b.seq) })
	for _, q := range left {
		giveBack(q.m)
	}
	for _, s := range all {
		ps.finishSession(ctx, s)
	}
}

// ready reports why a session cannot pull, if one cannot.
func (ps *partitions) ready() error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, s := range ps.all() {
		if !s.handing && !s.f.bound.Load() {
			return fmt.Errorf("partition %d: consumer not bound", s.i)
		}
	}
	return nil
}

// queued is how many messages the sessions' fetch queues hold.
func (ps *partitions) queued() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	n := 0
	for _, s := range ps.sessions {
		n += len(s.f.queue)
	}
	return n
}

// orderers are the sessions' lines.
func (ps *partitions) orderers() []*orderer {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]*orderer, 0, len(ps.sessions))
	for _, s := range ps.sessions {
		out = append(out, s.order)
	}
	return out
}

// pins returns, for each partition this courier holds the pin of, the pin
// id the server gave it (Runner.Pins).
func (ps *partitions) pins() map[int]string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := map[int]string{}
	for i, s := range ps.sessions {
		if p := s.f.pinNow.Load(); p != nil {
			out[i] = *p
		}
	}
	return out
}
