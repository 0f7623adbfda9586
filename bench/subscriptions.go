package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// The subscriptions scenario: an app that consumes two streams can run one
// courier serving both (COURIER_SUBSCRIPTIONS, docs/subscriptions.md) in
// place of a courier per stream. Both ways drain the same two preloaded
// streams, each on a durable of its own, at once, to the same instant app,
// each subscription at subsInflight in flight and every other setting at
// its default (dedup on, each process with a dedup directory and an admin
// address of its own). The targets: one courier drains the two at
// subsRateTarget× the rate of two couriers, with at most subsRSSTarget×
// their resident memory together.
const (
	subsInflight   = 8 // courier's default
	subsRateTarget = 0.95
	subsRSSTarget  = 0.6
)

// subsName is the scenario's name, as -only matches it.
const subsName = "subscriptions"

// subsNames are the two subscriptions, as COURIER_SUBSCRIPTIONS lists them.
var subsNames = [2]string{"a", "b"}

// subsCounts is the order of one round, one courier or two first in turn.
func subsCounts(round int) []int {
	if round%2 == 0 {
		return []int{1, 2}
	}
	return []int{2, 1}
}

// subsResult is one drain of the two streams by k couriers.
type subsResult struct {
	k        int // 1: one courier serving both; 2: a courier per stream
	n        int // messages per stream
	elapsed  time.Duration
	cpu      time.Duration // the couriers' CPU time together
	peakRSS  int64         // the peak of the couriers' RSS summed, sampled every 50ms
	hwm      int64         // the couriers' VmHWM summed: each one's own peak
	requests int64
	distinct int64
	strays   int64
	logLines int
	logHead  []string
	err      error
}

func (r subsResult) rate() float64 { return float64(r.distinct) / r.elapsed.Seconds() }

func (r subsResult) cpuPerMsg() float64 { return perMsg(r.cpu, r.distinct) }

// subsEnv is what makes one courier serve both streams: each subscription
// names its stream; the durable's name, the app and the in-flight limit
// are the plain variables', for each.
func subsEnv(streams [2]string) []string {
	env := []string{"COURIER_SUBSCRIPTIONS=" + strings.Join(subsNames[:], ",")}
	for i, name := range subsNames {
		env = append(env, fmt.Sprintf("COURIER_SUB_%s_STREAM=%s", strings.ToUpper(name), streams[i]))
	}
	return env
}

// drainSubs preloads o.subsN messages on each of two streams (ids [0, n)
// on the first, [n, 2n) on the second, one tally for both) and measures
// how long k couriers take to deliver and ack them all: one serving both
// subscriptions, or one a stream.
func (b *bench) drainSubs(ctx context.Context, k int) (subsResult, error) {
	n := b.o.subsN
	r := subsResult{k: k, n: n}
	run, stream, subject := b.next()
	streams := [2]string{stream + "A", stream + "B"}
	pctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()
	for i, s := range streams {
		subj := subject + "." + subsNames[i]
		if err := b.broker.createStream(pctx, s, subj); err != nil {
			return r, err
		}
		if err := b.broker.preloadFrom(pctx, s, subj, 0, run, i*n, n, b.o.size); err != nil {
			return r, err
		}
	}
	t := newTally(run, 2*n)
	b.app.measure(t)

	cs := make([]*child, 0, k)
	logs := make([]string, 0, k)
	defer func() {
		for _, c := range cs {
			c.stop(stopGrace) // on every path; a no-op after finish
		}
	}()
	for i := range k {
		s, extra := streams[i], []string(nil)
		if k == 1 {
			extra = subsEnv(streams)
		}
		c, logPath, err := b.launchReplica(dedupOn, run, s, subsInflight, i, extra...)
		if err != nil {
			return r, err
		}
		cs, logs = append(cs, c), append(logs, logPath)
	}
	mem := sampleRSSSum(cs, 50*time.Millisecond)
	rctx, cancelRun := context.WithTimeout(ctx, b.o.timeout)
	defer cancelRun()
	r.err = b.awaitDrain(rctx, t, 2*n, anyExited(pctx, cs), func() error { return errors.New("a courier exited before draining") },
		func(ctx context.Context) error {
			var err error
			for _, s := range streams {
				err = errors.Join(err, b.broker.waitSettled(ctx, s, consumerName))
			}
			return err
		})
	r.elapsed = time.Since(cs[0].started)
	for _, c := range cs {
		cpu, _ := c.cpu()
		hwm, _ := c.hwm()
		r.cpu, r.hwm = r.cpu+cpu, r.hwm+hwm
	}
	r.peakRSS = mem.stop()
	r.requests, r.distinct, r.strays = t.requests.Load(), t.distinct.Load(), t.strays.Load()
	r.logLines, r.logHead, r.err = b.finishAll(ctx, cs, run, logs, r.err)
	return r, ctx.Err()
}

// sampleRSSSum samples the RSS of every process of cs together every
// interval; its stop returns the peak of their sum.
func sampleRSSSum(cs []*child, every time.Duration) *rssSumSampler {
	s := &rssSumSampler{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			var sum int64
			for _, c := range cs {
				if m, err := c.memory(); err == nil {
					sum += m.rss
				}
			}
			s.peak = max(s.peak, sum)
			select {
			case <-t.C:
			case <-s.quit:
				return
			}
		}
	}()
	return s
}

// rssSumSampler is sampleRSSSum's; its owner must call stop.
type rssSumSampler struct {
	peak int64 // written by the sampling goroutine until done is closed
	quit chan struct{}
	done chan struct{}
}

func (s *rssSumSampler) stop() int64 {
	close(s.quit)
	<-s.done
	return s.peak
}

// subscriptionsPhase drains the two streams with one courier and with two,
// alternately.
func (b *bench) subscriptionsPhase(ctx context.Context, rep *report, stderr io.Writer) error {
	if b.o.subsN == 0 || (b.o.only != nil && !b.o.only.MatchString(subsName)) {
		return nil
	}
	for round := range b.o.repeat {
		for _, k := range subsCounts(round) {
			r, err := b.drainSubs(ctx, k)
			if err != nil {
				return err
			}
			rep.subs = append(rep.subs, r)
			fmt.Fprintf(stderr, "bench: %s: %d couriers: %8.0f msgs/s, peak RSS %s MiB%s\n",
				subsName, k, r.rate(), mib(float64(r.peakRSS)), noteIf(r.err))
		}
	}
	return nil
}

// printSubscriptions writes the subscriptions scenario's figures.
func (rep *report) printSubscriptions(w io.Writer) {
	if len(rep.subs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nSubscriptions: two streams of %d preloaded messages each, drained at once to the instant app, %d in flight\n",
		rep.o.subsN, subsInflight)
	fmt.Fprintln(w, "  a subscription; one courier serving both (COURIER_SUBSCRIPTIONS=a,b) or a courier per stream")
	fmt.Fprintln(w, "  msgs/s: both streams' messages, from the first process's start until every one is acked")
	fmt.Fprintln(w, "  peak RSS: the processes' RSS summed, sampled every 50ms; VmHWM: each one's kernel peak, summed")
	var t table
	t.add("couriers", "msgs/s", "CPU µs/msg", "peak RSS MiB", "VmHWM MiB", "every drain: msgs/s (peak RSS)")
	type med struct{ rate, rss float64 }
	meds := map[int]med{}
	for _, k := range []int{1, 2} {
		var rates, cpus, rss, hwm []float64
		var runs []string
		for _, r := range rep.subs {
			if r.k == k {
				rates, cpus = append(rates, r.rate()), append(cpus, r.cpuPerMsg())
				rss, hwm = append(rss, float64(r.peakRSS)), append(hwm, float64(r.hwm))
				runs = append(runs, fmt.Sprintf("%.0f (%s)", r.rate(), mib(float64(r.peakRSS))))
			}
		}
		if len(rates) == 0 {
			continue
		}
		meds[k] = med{median(rates), median(rss)}
		name := "one, both subscriptions"
		if k == 2 {
			name = "two, one a stream"
		}
		t.add(name, spread(rates, "%.0f"), spread(cpus, "%.1f"), spreadMiB(rss), spreadMiB(hwm), strings.Join(runs, ", "))
	}
	t.write(w)
	one, okOne := meds[1]
	two, okTwo := meds[2]
	if okOne && okTwo {
		fmt.Fprintf(w, "one courier / two (medians): msgs/s %s× (target >= %.2f), peak RSS %s× (target <= %.1f)\n",
			ratio(one.rate, two.rate), subsRateTarget, ratio(one.rss, two.rss), subsRSSTarget)
	}
}

// subscriptionsAnomalies writes what went wrong in the subscriptions
// scenario, and returns how many drains had something to say.
func (rep *report) subscriptionsAnomalies(w io.Writer) int {
	n := 0
	for _, r := range rep.subs {
		notes := drainNotes(r.err, r.requests, r.strays, r.distinct, r.logLines, r.logHead)
		if len(notes) > 0 {
			n++
			fmt.Fprintf(w, "  %s: %d couriers: %s\n", subsName, r.k, strings.Join(notes, "; "))
		}
	}
	return n
}
