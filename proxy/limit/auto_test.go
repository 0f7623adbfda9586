package limit

import (
	"container/heap"
	"context"
	"testing"
	"time"
)

// capacity is what an app of w workers × d serves per second.
func capacity(w int, d time.Duration) float64 { return float64(w) / d.Seconds() }

func TestAutoSettlesNearWorkers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		workers int
		service time.Duration
		noisy   bool
	}{
		{"2 workers x 20ms", 2, 20 * time.Millisecond, false},
		{"8 workers x 10ms", 8, 10 * time.Millisecond, false},
		{"8 workers x 20ms", 8, 20 * time.Millisecond, false},
		{"32 workers x 5ms", 32, 5 * time.Millisecond, false},
		{"8 workers x 10ms, noisy neighbour", 8, 10 * time.Millisecond, true},
		{"2 workers x 20ms, noisy neighbour", 2, 20 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, tc.workers, tc.service, AutoOptions{})
			if tc.noisy {
				s.noise = noisyNeighbour
			}
			s.run(10 * time.Second)
			sp := s.run(30 * time.Second)
			st := s.lim.Stats()
			t.Logf("%.0f/s of %.0f, %.2f inside, limit %d, minRTT %v, changes %v",
				sp.perSecond, capacity(tc.workers, tc.service), sp.meanInside, st.Limit, st.MinRTT, st.Changes)
			if max := 1.5 * float64(tc.workers); sp.meanInside > max {
				t.Errorf("%.2f requests inside the app on average, want at most %.1f", sp.meanInside, max)
			}
			// The noise takes a tenth of the app's capacity itself.
			want := 0.9 * capacity(tc.workers, tc.service)
			if tc.noisy {
				want *= 0.8
			}
			if sp.perSecond < want {
				t.Errorf("%.0f served per second, want at least %.0f: the app is starved", sp.perSecond, want)
			}
		})
	}
}

func TestAutoFollowsTheAppsCapacity(t *testing.T) {
	const w, d = 8, 10 * time.Millisecond
	s := newSim(t, w, d, AutoOptions{})
	s.run(10 * time.Second)

	check := func(phase string, sp simSpan, workers int, service time.Duration) {
		t.Helper()
		st := s.lim.Stats()
		t.Logf("%s: %.0f/s, %.2f inside, limit %d, minRTT %v", phase, sp.perSecond, sp.meanInside, st.Limit, st.MinRTT)
		if max := 1.5 * float64(workers); sp.meanInside > max {
			t.Errorf("%s: %.2f requests inside the app on average, want at most %.1f", phase, sp.meanInside, max)
		}
		if want := 0.85 * capacity(workers, service); sp.perSecond < want {
			t.Errorf("%s: %.0f served per second, want at least %.0f", phase, sp.perSecond, want)
		}
	}

	// Five times slower (a slower database): the unloaded time is measured
	// again within seconds, and the app does not fill up.
	s.service = 5 * d
	s.runUntil(3*time.Second, "minRTT follows a 5x slowdown", func(st Stats) bool { return st.MinRTT >= 4*d })
	s.run(3 * time.Second)
	check("5x slower", s.run(10*time.Second), w, 5*d)

	// Fast again: the lower answer times are seen at once.
	s.service = d
	s.runUntil(time.Second, "minRTT follows the speed-up", func(st Stats) bool { return st.MinRTT <= 2*d })
	s.run(3 * time.Second)
	check("fast again", s.run(10*time.Second), w, d)

	// A quarter of the workers (a deploy on fewer instances): the limit falls.
	s.workers = 2
	s.runUntil(3*time.Second, "the limit follows fewer workers down", func(st Stats) bool { return st.Limit <= 4 })
	s.run(3 * time.Second)
	check("2 workers", s.run(10*time.Second), 2, d)

	// The workers back: the limit rises again.
	s.workers = w
	s.runUntil(3*time.Second, "the limit rises with the workers", func(st Stats) bool { return st.Limit >= w })
	s.run(3 * time.Second)
	check("8 workers again", s.run(10*time.Second), w, d)
}

func TestAutoHeedsOverload(t *testing.T) {
	const w, d = 8, 10 * time.Millisecond
	s := newSim(t, w, d, AutoOptions{})
	s.shedAbove = w // 503 at once to whatever finds every worker busy
	s.run(5 * time.Second)
	sp := s.run(30 * time.Second)
	st := s.lim.Stats()
	t.Logf("%.0f/s, %.1f%% shed, limit %d, changes %v", sp.perSecond, 100*sp.shedShare, st.Limit, st.Changes)
	if sp.shedShare > 0.05 {
		t.Errorf("%.1f%% of requests shed by the app, want at most 5%%", 100*sp.shedShare)
	}
	if want := 0.85 * capacity(w, d); sp.perSecond < want {
		t.Errorf("%.0f served per second, want at least %.0f", sp.perSecond, want)
	}
	if st.Changes[CauseOverload] == 0 {
		t.Error("no change of the limit counted as overload")
	}
}

func TestAutoKeepsToItsCeiling(t *testing.T) {
	s := newSim(t, 0, 20*time.Millisecond, AutoOptions{Max: 16})
	s.noise = noisyNeighbour
	s.runUntil(10*time.Second, "the limit reaches the ceiling of an app that takes any number", func(st Stats) bool { return st.Limit == 16 })
	s.run(10 * time.Second) // run checks the bounds at every step
}

func TestAutoOutageTeachesNothing(t *testing.T) {
	s := newSim(t, 8, 10*time.Millisecond, AutoOptions{})
	s.run(10 * time.Second)
	before := s.lim.Stats()
	s.down = true
	s.run(20 * time.Second)
	// What was in flight when the app went down came back while down was
	// set; everything sent since was dropped.
	after := s.lim.Stats()
	if after.MinRTT != before.MinRTT {
		t.Errorf("minRTT %v after an outage, was %v", after.MinRTT, before.MinRTT)
	}
	for _, c := range []Cause{CauseQueueing, CauseOverload, CauseTimeout} {
		if after.Changes[c] != before.Changes[c] {
			t.Errorf("%d changes for %s during an outage", after.Changes[c]-before.Changes[c], c)
		}
	}
	if after.Limit < before.Limit-1 {
		t.Errorf("limit %d after an outage, was %d", after.Limit, before.Limit)
	}
}

// A burst of timeouts (or 503s) of requests sent under one limit lowers it
// once: they all say the same thing.
func TestAutoLowersOncePerBurst(t *testing.T) {
	for _, tc := range []struct {
		out    Outcome
		cause  Cause
		factor float64
	}{
		{Timeout, CauseTimeout, 0.5},
		{Overload, CauseOverload, 0.75},
	} {
		t.Run(tc.cause.String(), func(t *testing.T) {
			s := newSim(t, 0, 10*time.Millisecond, AutoOptions{})
			s.runUntil(10*time.Second, "the limit rises", func(st Stats) bool { return st.Limit >= 20 })
			// Let what is in flight finish so the burst holds the whole limit.
			for len(s.events) > 0 {
				r := heap.Pop(&s.events).(*simReq)
				s.clk.t = r.done
				r.slot.Release(Dropped)
			}
			before := s.lim.Stats()
			var slots []*Slot
			for range before.Limit {
				sl, err := s.lim.Acquire(context.Background(), Deliver)
				if err != nil {
					t.Fatal(err)
				}
				slots = append(slots, sl)
			}
			s.clk.t = s.clk.t.Add(time.Second)
			for _, sl := range slots {
				sl.Release(tc.out)
			}
			after := s.lim.Stats()
			if got := after.Changes[tc.cause] - before.Changes[tc.cause]; got != 1 {
				t.Errorf("%d changes for %s, want 1", got, tc.cause)
			}
			lo, hi := int(float64(before.Limit)*tc.factor), int(float64(before.Limit+1)*tc.factor)
			if after.Limit < lo || after.Limit > hi {
				t.Errorf("limit %d after the burst from %d, want about %.0f", after.Limit, before.Limit, float64(before.Limit)*tc.factor)
			}
			if after.LastCause != tc.cause {
				t.Errorf("last cause %s, want %s", after.LastCause, tc.cause)
			}
		})
	}
}

// The unloaded answer time is measured again every ProbeInterval (plus up to
// 15%), each time holding the limit low and giving it back, at a small cost.
func TestAutoMeasuresAgainPeriodically(t *testing.T) {
	const w, d = 8, 10 * time.Millisecond
	s := newSim(t, w, d, AutoOptions{ProbeInterval: 10 * time.Second})
	s.run(5 * time.Second)
	before := s.lim.Stats().Changes[CauseProbe]
	sp := s.run(60 * time.Second)
	// Five or six measurements in 60s, two changes each (held low, given back).
	if got := s.lim.Stats().Changes[CauseProbe] - before; got < 10 || got > 12 {
		t.Errorf("%d probe changes in 60s with a 10s interval, want 10 to 12", got)
	}
	if want := 0.9 * capacity(w, d); sp.perSecond < want {
		t.Errorf("%.0f served per second with probes, want at least %.0f", sp.perSecond, want)
	}
}

// An app answering in a second or more that changes speed mid-run: its
// unloaded answer time is measured again with the limit held low, where a
// measurement gets only a few answers in seconds, and within a minute the
// limit is back at what the app's workers (or the ceiling) allow.
func TestAutoFollowsASlowAppsSpeed(t *testing.T) {
	const ceiling = 64 // AutoOptions' default Max
	quarterSlower := func(d time.Duration) time.Duration { return d + d/4 }
	// Just past what the target tolerates (10% and 1ms): every loaded
	// window reads as queueing until minRTT is measured again.
	justPastTolerance := func(d time.Duration) time.Duration { return d + d/10 + 2*time.Millisecond }
	quarterFaster := func(d time.Duration) time.Duration { return d - d/4 }
	for _, tc := range []struct {
		name    string
		workers int // 0: as many as come, bounded by the ceiling
		service time.Duration
		change  func(time.Duration) time.Duration
		noisy   bool
	}{
		{"1s x 32 workers, a quarter slower", 32, time.Second, quarterSlower, false},
		{"1s x 32 workers, 10% and 2ms slower", 32, time.Second, justPastTolerance, false},
		{"1s, any number, a quarter slower", 0, time.Second, quarterSlower, false},
		{"2s x 16 workers, a quarter slower", 16, 2 * time.Second, quarterSlower, false},
		{"2s x 16 workers, 10% and 2ms slower", 16, 2 * time.Second, justPastTolerance, false},
		{"2s, any number, a quarter slower", 0, 2 * time.Second, quarterSlower, false},
		{"1s x 32 workers, a quarter faster", 32, time.Second, quarterFaster, false},
		{"2s, any number, a quarter faster", 0, 2 * time.Second, quarterFaster, false},
		{"1s x 32 workers, a quarter slower, noisy neighbour", 32, time.Second, quarterSlower, true},
		{"2s, any number, a quarter slower, noisy neighbour", 0, 2 * time.Second, quarterSlower, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, tc.workers, tc.service, AutoOptions{})
			if tc.noisy {
				s.noise = noisyNeighbour
			}
			s.run(time.Minute)
			s.service = tc.change(tc.service)
			inApp := tc.workers
			if inApp == 0 {
				inApp = ceiling
			}
			// A minute to measure the app again and climb back; the minute
			// after is served near the app's capacity throughout. Less
			// near than a fast app's: each periodic measurement holds the
			// limit low for about two of the app's answer times.
			s.run(time.Minute)
			sp := s.run(time.Minute)
			st := s.lim.Stats()
			t.Logf("%.1f/s of %.1f, %.1f inside, limit %d, minRTT %v, changes %v",
				sp.perSecond, capacity(inApp, s.service), sp.meanInside, st.Limit, st.MinRTT, st.Changes)
			if max := 1.5 * float64(tc.workers); tc.workers > 0 && sp.meanInside > max {
				t.Errorf("%.1f requests inside the app on average, want at most %.1f", sp.meanInside, max)
			}
			lo, hi := s.service, s.service*11/10
			want := 0.8 * capacity(inApp, s.service)
			if tc.noisy {
				// Each answer ±10%, and the noise takes a tenth of the
				// app's capacity itself.
				lo, hi = s.service*85/100, s.service*115/100
				want *= 0.8
			}
			if st.MinRTT < lo || st.MinRTT > hi {
				t.Errorf("minRTT %v for an app answering in %v, want %v to %v", st.MinRTT, s.service, lo, hi)
			}
			if sp.perSecond < want {
				t.Errorf("%.1f served per second, want at least %.1f", sp.perSecond, want)
			}
		})
	}
}

// At a limit of 1 each request is alone at the app, so every window measures
// the unloaded answer time: minRTT follows the app, slower or faster, in the
// first window wholly after the change, without waiting for a measurement
// with the limit held low. A ceiling of 1 keeps the limit there.
func TestAutoAtOneEachWindowMeasures(t *testing.T) {
	const d = time.Second
	for _, tc := range []struct {
		name  string
		after time.Duration
	}{
		{"a quarter slower", d + d/4},
		{"a quarter faster", d - d/4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, 0, d, AutoOptions{Max: 1})
			s.run(10 * time.Second)
			s.service = tc.after
			// The window open at the change (of 3 answers, being past
			// 10×Interval), some at the old speed, and one window after.
			within := 6*tc.after + 50*time.Millisecond
			s.runUntil(within, "minRTT follows the app", func(st Stats) bool { return st.MinRTT == tc.after })
		})
	}
}
