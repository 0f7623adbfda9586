package limit

import (
	"container/heap"
	"math/rand/v2"
	"testing"
	"time"
)

// fakeClock is the injected clock of the simulated tests.
type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time { return c.t }

// simApp is a discrete-event simulation of an app with a worker pool, in the
// limiter's own (fake) time: deterministic, and free of the noise of the
// machine the tests run on, which is added on purpose where it is tested.
// The load is a backlog: a request is sent whenever the limiter admits one.
type simApp struct {
	t   *testing.T
	clk *fakeClock
	lim *Limiter
	rng *rand.Rand

	workers   int           // 0: unlimited
	service   time.Duration // per request, before noise
	noise     func(r *rand.Rand, d time.Duration) time.Duration
	shedAbove int  // answer 503 to a request arriving with this many inside (0: never)
	down      bool // unreachable: every request is dropped after a connect timeout

	busy, inside int
	queue        []*simReq
	events       simEvents
	seq          int

	area         float64 // ∫ inside dt in request·seconds
	served, shed int
}

type simReq struct {
	slot *Slot
	done time.Time
	out  Outcome
	seq  int
}

type simEvents []*simReq

func (h simEvents) Len() int { return len(h) }
func (h simEvents) Less(i, j int) bool {
	if !h[i].done.Equal(h[j].done) {
		return h[i].done.Before(h[j].done)
	}
	return h[i].seq < h[j].seq
}
func (h simEvents) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *simEvents) Push(x any)   { *h = append(*h, x.(*simReq)) }
func (h *simEvents) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// newSim returns an app of workers × service behind an automatic limiter
// with options o (its clock is replaced by the simulation's).
func newSim(t *testing.T, workers int, service time.Duration, o AutoOptions) *simApp {
	t.Helper()
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	o.Now = clk.Now
	return &simApp{
		t: t, clk: clk, lim: NewAuto(o), rng: rand.New(rand.NewPCG(1, 2)),
		workers: workers, service: service,
	}
}

func (s *simApp) schedule(r *simReq, after time.Duration) {
	s.seq++
	r.seq = s.seq
	r.done = s.clk.t.Add(after)
	heap.Push(&s.events, r)
}

func (s *simApp) arrive(slot *Slot) {
	r := &simReq{slot: slot, out: Success}
	switch {
	case s.down:
		r.out = Dropped
		s.schedule(r, time.Second)
		return
	case s.shedAbove > 0 && s.inside >= s.shedAbove:
		r.out = Overload
		s.schedule(r, 200*time.Microsecond)
		return
	}
	s.inside++
	if s.workers == 0 || s.busy < s.workers {
		s.start(r)
		return
	}
	s.queue = append(s.queue, r)
}

func (s *simApp) start(r *simReq) {
	s.busy++
	d := s.service
	if s.noise != nil {
		d = s.noise(s.rng, d)
	}
	s.schedule(r, d)
}

func (s *simApp) complete(r *simReq) {
	if r.out == Success {
		s.inside--
		s.busy--
		s.served++
		for len(s.queue) > 0 && (s.workers == 0 || s.busy < s.workers) {
			next := s.queue[0]
			s.queue = s.queue[1:]
			s.start(next)
		}
	} else if r.out == Overload {
		s.shed++
	}
	r.slot.Release(r.out)
}

// checkBounds fails the test if the limit in effect leaves [1, Max].
func (s *simApp) checkBounds() {
	st := s.lim.Stats()
	if st.Limit < 1 || st.Limit > st.Max {
		s.t.Fatalf("at %v the limit is %d, outside [1, %d]", s.clk.t, st.Limit, st.Max)
	}
}

// simSpan is what the app did during a run.
type simSpan struct {
	perSecond  float64
	meanInside float64
	shedShare  float64
}

// run advances the simulation by d and returns what the app did meanwhile.
func (s *simApp) run(d time.Duration) simSpan {
	s.t.Helper()
	end := s.clk.t.Add(d)
	area0, served0, shed0 := s.area, s.served, s.shed
	for {
		for {
			slot, ok := s.lim.TryAcquire(Deliver)
			if !ok {
				break
			}
			s.arrive(slot)
		}
		s.checkBounds()
		next := end
		if len(s.events) > 0 && s.events[0].done.Before(end) {
			next = s.events[0].done
		}
		s.area += float64(s.inside) * next.Sub(s.clk.t).Seconds()
		s.clk.t = next
		if next.Equal(end) {
			break
		}
		s.complete(heap.Pop(&s.events).(*simReq))
	}
	served, shed := float64(s.served-served0), float64(s.shed-shed0)
	sp := simSpan{perSecond: served / d.Seconds(), meanInside: (s.area - area0) / d.Seconds()}
	if served+shed > 0 {
		sp.shedShare = shed / (served + shed)
	}
	return sp
}

// runUntil advances the simulation in steps of 50ms until cond holds, and
// fails the test if it does not within d.
func (s *simApp) runUntil(d time.Duration, what string, cond func(Stats) bool) {
	s.t.Helper()
	for waited := time.Duration(0); !cond(s.lim.Stats()); waited += 50 * time.Millisecond {
		if waited >= d {
			st := s.lim.Stats()
			s.t.Fatalf("%s: not within %v (limit %d, minRTT %v)", what, d, st.Limit, st.MinRTT)
		}
		s.run(50 * time.Millisecond)
	}
}

// noisyNeighbour is a busy 2-core machine's noise: every answer ±10%, and one
// in ten delayed by up to twice the service time (a neighbour holding the CPU).
func noisyNeighbour(r *rand.Rand, d time.Duration) time.Duration {
	d = time.Duration(float64(d) * (0.9 + 0.2*r.Float64()))
	if r.IntN(10) == 0 {
		d += time.Duration(r.Int64N(int64(2*d) + 1))
	}
	return d
}
