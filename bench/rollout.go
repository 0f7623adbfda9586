package main

// The rollout scenario: what a rolling update and a crash cost an ordered
// durable, as an operator runs it. Three couriers on one durable of a
// 3-node cluster (R3 stream, the shared store, rolloutInflight in flight
// each), an instant app, rolloutEntities entities published to throughout
// at -rollout-rate; then one event:
//
//   - a rolling update as a Deployment makes it by default (maxSurge 1,
//     maxUnavailable 0): a new courier started and ready, then SIGTERM to
//     an old one, one replica at a time; the consumer's ack wait at its
//     default (30s);
//   - a crash: SIGKILL of the courier that called the app last, a new one
//     started at once; the ack wait 10s.
//
// Each in both modes of order: partitions (the key a subject token, six
// partitions) and one active courier on a pinned consumer (the key a
// header). The figures are the waits from publishing to the app's first
// call of each message, for the messages published before the event (at
// rest), during it (a crash: the 10s after the kill) and after it; beside
// them, after a kill how long until the app was called again, in a
// rolling update how long each SIGTERM took, what the couriers logged
// around the message that waited longest during the event (the stall's
// cause, rolloutlog.go) and what they logged at warn or error. The
// couriers are run by rolloutSet (rolloutset.go). It runs only when -only
// names it (-only rollout).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	rolloutEntities = 40
	rolloutInflight = 4
	rolloutReplicas = 3
	// rolloutRest is how long the couriers run at rest before the event,
	// and after it; the first second of publishing is not counted.
	rolloutRest = 5 * time.Second
	// crashAfterRunning is how much longer the couriers run before a
	// kill.
	crashAfterRunning = 10 * time.Second
	// rolloutCrashWindow is how long after a kill "during" lasts.
	rolloutCrashWindow = 10 * time.Second
)

// rolloutMode is a mode of order per key: its name and environment.
type rolloutMode struct {
	name string
	env  []string
}

var rolloutModes = []rolloutMode{
	{"partitions", []string{"COURIER_ORDER_KEY=subject:3", "COURIER_ORDER_PARTITIONS=6"}},
	{"single active", []string{"COURIER_ORDER_KEY=header:Entity"}},
}

// rolloutEvent is what happens to the couriers.
type rolloutEvent int

const (
	rollingUpdate rolloutEvent = iota
	crash
)

func (e rolloutEvent) String() string { return [...]string{"rolling update", "kill"}[e] }

// ackWait is the durable's ack wait in the event's run.
func (e rolloutEvent) ackWait() time.Duration {
	if e == crash {
		return 10 * time.Second
	}
	return 30 * time.Second
}

// rolloutName is how -only matches one run: "rollout: <event>, <mode>".
func rolloutName(e rolloutEvent, m rolloutMode) string {
	return "rollout: " + e.String() + ", " + m.name
}

// waits are the publish-to-first-call waits of a window's messages.
type waits struct {
	n             int
	lost          int
	p50, p99, max time.Duration
}

// rolloutResult is one run of the scenario.
type rolloutResult struct {
	name    string
	event   rolloutEvent
	windows [3]waits // before, during, after
	// recalled is, after a kill, how long until the app was called again
	// (by any courier); -1: never.
	recalled time.Duration
	// stops are, in a rolling update, how long each SIGTERM took to end
	// its courier.
	stops     []time.Duration
	eventTook time.Duration
	published int
	dups      int64
	disorder  int // messages first called before an earlier one of their entity
	// warns counts the lines the couriers logged at warn or error;
	// firstWarn is the first of them.
	warns     int
	firstWarn string
	worst     string
	cause     []string // what the couriers logged around the worst wait
	err       error
}

// rolloutPhase runs the scenario's events and modes on a cluster of its
// own, -repeat times each (a crash costs more when it catches messages at
// the courier, and that is chance). It runs only when -only names it: it
// takes minutes and a cluster, and the default run measures throughput
// and overhead, not events.
func (b *bench) rolloutPhase(ctx context.Context, rep *report, stderr io.Writer) error {
	if b.o.rolloutRate == 0 || b.o.only == nil {
		return nil
	}
	type run struct {
		e rolloutEvent
		m rolloutMode
	}
	var runs []run
	for _, e := range []rolloutEvent{rollingUpdate, crash} {
		for _, m := range rolloutModes {
			if b.o.only == nil || b.o.only.MatchString(rolloutName(e, m)) {
				runs = append(runs, run{e, m})
			}
		}
	}
	if len(runs) == 0 {
		return nil
	}
	fmt.Fprintln(stderr, "bench: rollout: starting a 3-node cluster")
	cl, err := startCluster(filepath.Join(b.dir, "cluster"), 3)
	if err != nil {
		return err
	}
	defer cl.close()
	for range b.o.repeat {
		for _, r := range runs {
			res, err := b.rollout(ctx, cl, r.e, r.m)
			if err != nil {
				return err
			}
			rep.rollouts = append(rep.rollouts, res)
			d := res.windows[1]
			recalled := ""
			switch {
			case res.event == crash && res.recalled >= 0:
				recalled = ", the app called again after " + fmtSec(res.recalled)
			case res.event == crash:
				recalled = ", the app not called again"
			}
			fmt.Fprintf(stderr, "bench: %s: during p50 %s p99 %s max %s%s%s\n", res.name,
				fmtSec(d.p50), fmtSec(d.p99), fmtSec(d.max), recalled, noteIf(res.err))
		}
	}
	return nil
}

// rollout is one run: three couriers at rest, the event, rest again, then
// every message published awaited, and the couriers stopped.
func (b *bench) rollout(ctx context.Context, cl *cluster, e rolloutEvent, m rolloutMode) (rolloutResult, error) {
	res := rolloutResult{name: rolloutName(e, m), event: e, recalled: -1}
	run, stream, subject := b.next()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cl.js.CreateStream(sctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject + ".*"},
		Storage: jetstream.FileStorage, Replicas: 3}); err != nil {
		return res, fmt.Errorf("creating stream %s: %w", stream, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		deleteAllStreams(dctx, cl.js)
		_ = os.RemoveAll(b.dedupDir(run))
	}()
	capacity := int(b.o.rolloutRate * 600) // ten minutes at most
	t := newTally(run, capacity)
	b.app.measure(t)
	defer b.app.measure(nil)

	cs := newRolloutSet(b, cl, run, stream, e, m)
	defer cs.stopAll()
	for range rolloutReplicas {
		if _, err := cs.start(ctx, true); err != nil {
			return res, err
		}
	}
	pub := startRolloutPublisher(cl.js, subject, run, b.o.size, b.o.rolloutRate)
	defer pub.stop()
	sleepCtx(ctx, time.Second+rolloutRest)
	if e == crash {
		// Couriers that have run a while: one that dies under 10 s
		// after taking a partition's pin (a crash loop) has what it held
		// come back after its ack wait.
		sleepCtx(ctx, crashAfterRunning)
	}
	start := time.Now()
	var recall *recallWatch // a kill's
	switch e {
	case rollingUpdate:
		var bad, err error
		res.stops, bad, err = cs.update(ctx)
		if err != nil {
			return res, err
		}
		res.err = errors.Join(res.err, bad)
	case crash:
		var err error
		recall, err = cs.crash(ctx, t)
		if recall != nil {
			defer recall.stop()
		}
		if err != nil {
			return res, err
		}
	}
	end := time.Now()
	res.eventTook = end.Sub(start)
	sleepCtx(ctx, rolloutRest)
	sent := pub.stop()
	res.published = len(sent)
	if err := pub.err(); err != nil {
		res.err = errors.Join(res.err, err)
	}
	// Everything published is awaited: what a killed courier held comes
	// back within the ack wait.
	deadline := time.Now().Add(3*e.ackWait() + 30*time.Second)
	for t.distinct.Load() < int64(len(sent)) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	if recall != nil {
		res.recalled = recall.stop()
	}
	logs := cs.stopAll()
	res.dups = t.requests.Load() - t.strays.Load() - t.distinct.Load()
	res.windows, res.disorder = rolloutWaits(t, sent, start.Add(-rolloutRest), start, end, end.Add(rolloutRest))
	if lost := res.windows[0].lost + res.windows[1].lost + res.windows[2].lost; lost > 0 {
		res.err = errors.Join(res.err, fmt.Errorf("%d messages never reached the app", lost))
	}
	res.worst, res.cause = worstWait(t, sent, start, end, logs)
	res.warns, res.firstWarn = warnings(logs)
	return res, ctx.Err()
}

// rolloutWaits sorts the messages by when they were published (sent) into
// before [from, start), during [start, end) and after [end, to), and
// returns each window's waits, and how many messages were first called
// before an earlier message of their entity.
func rolloutWaits(t *tally, sent []time.Time, from, start, end, to time.Time) ([3]waits, int) {
	var lat [3][]time.Duration
	var out [3]waits
	for id, at := range sent {
		w := -1
		switch {
		case !at.Before(from) && at.Before(start):
			w = 0
		case !at.Before(start) && at.Before(end):
			w = 1
		case !at.Before(end) && at.Before(to):
			w = 2
		}
		if w < 0 {
			continue
		}
		if !t.seen[id].Load() {
			out[w].lost++
			continue
		}
		lat[w] = append(lat[w], time.Duration(t.lat[id].Load()))
	}
	for w := range lat {
		slices.Sort(lat[w])
		out[w].n = len(lat[w])
		out[w].p50, out[w].p99, out[w].max = percentile(lat[w], 0.5), percentile(lat[w], 0.99), percentile(lat[w], 1)
	}
	disorder := 0
	for id := rolloutEntities; id < len(sent); id++ {
		prev := id - rolloutEntities
		if t.seen[id].Load() && t.seen[prev].Load() &&
			sent[id].Add(time.Duration(t.lat[id].Load())).Before(sent[prev].Add(time.Duration(t.lat[prev].Load()))) {
			disorder++
		}
	}
	return out, disorder
}

// rolloutPublisher publishes message after message at a steady rate,
// entity id % rolloutEntities in the subject's third token and the
// Entity header, until stop.
type rolloutPublisher struct {
	quit chan struct{}
	done chan struct{}
	sent []time.Time
	errs []error
	once sync.Once
}

func startRolloutPublisher(js jetstream.JetStream, subject string, run uint64, size int, rate float64) *rolloutPublisher {
	p := &rolloutPublisher{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		var futures []jetstream.PubAckFuture
		begin := time.Now()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			due := int(time.Since(begin).Seconds() * rate)
			for id := len(p.sent); id < due; id++ {
				entity := "e" + strconv.Itoa(id%rolloutEntities)
				now := time.Now()
				msg := &nats.Msg{Subject: subject + "." + entity, Header: nats.Header{"Entity": {entity}},
					Data: newBody(size, run, uint64(id), now)}
				f, err := js.PublishMsgAsync(msg, jetstream.WithMsgID(fmt.Sprint(run, "-", id)))
				if err != nil {
					p.errs = append(p.errs, err)
					return
				}
				futures = append(futures, f)
				p.sent = append(p.sent, now)
			}
			select {
			case <-p.quit:
				for _, f := range futures {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						p.errs = append(p.errs, err)
					case <-time.After(30 * time.Second):
						p.errs = append(p.errs, errors.New("no acknowledgement within 30s"))
					}
				}
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// stop ends publishing, waits for every acknowledgement and returns when
// each message was published.
func (p *rolloutPublisher) stop() []time.Time {
	p.once.Do(func() { close(p.quit) })
	<-p.done
	return p.sent
}

// err is what went wrong publishing, once stopped.
func (p *rolloutPublisher) err() error {
	<-p.done
	if len(p.errs) == 0 {
		return nil
	}
	return fmt.Errorf("publishing: %d errors, first: %w", len(p.errs), p.errs[0])
}

// deleteAllStreams deletes every stream of the cluster: the run's, the
// dead letters', and the buckets courier made.
func deleteAllStreams(ctx context.Context, js jetstream.JetStream) {
	names := js.StreamNames(ctx)
	var list []string
	for n := range names.Name() {
		list = append(list, n)
	}
	for _, n := range list {
		_ = js.DeleteStream(ctx, n)
	}
}

// sleepCtx sleeps d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func fmtSec(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// printRollouts writes the scenario's figures.
func (rep *report) printRollouts(w io.Writer) {
	if len(rep.rollouts) == 0 {
		return
	}
	fmt.Fprintf(w, "\nRollouts and crashes: three couriers on one durable of a 3-node cluster (R3 stream, shared store,\n")
	fmt.Fprintf(w, "  %d in flight each), an instant app, %.0f msgs/s over %d entities published throughout; waits from\n",
		rolloutInflight, rep.o.rolloutRate, rolloutEntities)
	fmt.Fprintf(w, "  publishing to the app's first call of each message, by when it was published: in the %s before the\n", rolloutRest)
	fmt.Fprintf(w, "  event, during it (a kill: the %s after it), in the %s after. Rolling update: a courier started\n", rolloutCrashWindow, rolloutRest)
	fmt.Fprintln(w, "  and ready, then SIGTERM to an old one, three times (ack wait 30s); kill: SIGKILL of the courier that")
	fmt.Fprintln(w, "  called last, a new one started at once (ack wait 10s)")
	for _, r := range rep.rollouts {
		fmt.Fprintf(w, "\n%s (the event took %s)\n", r.name, fmtSec(r.eventTook))
		var t table
		t.add("", "messages", "p50", "p99", "max", "lost")
		for i, label := range []string{"before", "during", "after"} {
			x := r.windows[i]
			t.add(label, fmt.Sprint(x.n), fmtSec(x.p50), fmtSec(x.p99), fmtSec(x.max), fmt.Sprint(x.lost))
		}
		t.write(w)
		if len(r.stops) > 0 {
			took := make([]string, len(r.stops))
			for i, d := range r.stops {
				took[i] = fmtSec(d)
			}
			fmt.Fprintf(w, "  each SIGTERM ended its courier in %s\n", strings.Join(took, ", "))
		}
		if r.event == crash {
			called := "  the app not called again after the kill\n"
			if r.recalled >= 0 {
				called = fmt.Sprintf("  the app called again %s after the kill\n", fmtSec(r.recalled))
			}
			fmt.Fprint(w, called)
		}
		fmt.Fprintf(w, "  %d published, %d duplicate requests, %d first called before an earlier message of their entity, %d logged at warn or error%s\n",
			r.published, r.dups, r.disorder, r.warns, noteIf(r.err))
		if r.worst != "" {
			fmt.Fprintf(w, "  longest wait during: %s; the couriers' log meanwhile:\n", r.worst)
			for _, l := range r.cause {
				fmt.Fprintf(w, "    %s\n", l)
			}
		}
	}
}

// rolloutAnomalies writes what went wrong in the scenario's runs beyond
// waiting, and returns how many runs it names. Duplicates count only
// after a clean stop: after a kill, what the killed courier had in flight
// is called again.
func (rep *report) rolloutAnomalies(w io.Writer) int {
	n := 0
	for _, r := range rep.rollouts {
		var notes []string
		if r.err != nil {
			notes = append(notes, r.err.Error())
		}
		if r.disorder > 0 {
			notes = append(notes, fmt.Sprintf("%d out of their entity's order", r.disorder))
		}
		if r.dups > 0 && r.event == rollingUpdate {
			notes = append(notes, fmt.Sprintf("%d duplicate requests from clean stops", r.dups))
		}
		if r.warns > 0 {
			notes = append(notes, fmt.Sprintf("%d logged at warn or error, the first: %s", r.warns, r.firstWarn))
		}
		if len(notes) > 0 {
			n++
			fmt.Fprintf(w, "  %s: %s\n", r.name, strings.Join(notes, "; "))
		}
	}
	return n
}
