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
// them, what the couriers logged around the message that waited longest
// during the event: the stall's cause.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	recalled  time.Duration
	eventTook time.Duration
	published int
	dups      int64
	disorder  int // messages first called before an earlier one of their entity
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
	start := time.Now()
	var recall *recallWatch // a kill's
	switch e {
	case rollingUpdate:
		for old := range rolloutReplicas {
			if _, err := cs.start(ctx, true); err != nil {
				return res, err
			}
			if err := cs.cs[old].stop(stopGrace); err != nil {
				res.err = errors.Join(res.err, fmt.Errorf("courier %d: %w", old, err))
			}
		}
	case crash:
		last := b.app.lastCaller()
		if last < 0 || last >= len(cs.cs) {
			return res, errors.New("no courier has called the app")
		}
		before := t.requests.Load()
		cs.cs[last].kill()
		killed := time.Now()
		recall = watchRecall(t, before, killed)
		defer recall.stop()
		if _, err := cs.start(ctx, false); err != nil {
			return res, err
		}
		sleepCtx(ctx, rolloutCrashWindow-time.Since(killed))
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
	return res, ctx.Err()
}

// recallWatch measures how long after a kill the app is called again, by
// any courier: past the kill's window if it takes longer. Its owner must
// call stop.
type recallWatch struct {
	quit, done chan struct{}
	once       sync.Once
	took       time.Duration // -1: not called again; read after done
}

// watchRecall watches t from the kill at killed on, before being the
// requests t had counted just before it.
func watchRecall(t *tally, before int64, killed time.Time) *recallWatch {
	w := &recallWatch{quit: make(chan struct{}), done: make(chan struct{}), took: -1}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			if t.requests.Load() != before {
				w.took = time.Since(killed)
				return
			}
			select {
			case <-w.quit:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// stop ends the watch and returns how long after the kill the app was
// called again; -1: not yet.
func (w *recallWatch) stop() time.Duration {
	w.once.Do(func() { close(w.quit) })
	<-w.done
	return w.took
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

// worstWait names the message published in [start, end) that waited
// longest, and returns what the couriers logged from a second before it
// was published until it was called.
func worstWait(t *tally, sent []time.Time, start, end time.Time, logs []courierLog) (string, []string) {
	worst, wait := -1, time.Duration(0)
	for id, at := range sent {
		if at.Before(start) || !at.Before(end) || !t.seen[id].Load() {
			continue
		}
		if d := time.Duration(t.lat[id].Load()); d > wait {
			worst, wait = id, d
		}
	}
	if worst < 0 {
		return "", nil
	}
	from, to := sent[worst].Add(-time.Second), sent[worst].Add(wait)
	var lines []logLine
	for i, l := range logs {
		for _, ln := range l.lines {
			if !ln.at.Before(from) && !ln.at.After(to) && !startUpLine(ln.msg) {
				ln.courier = i
				lines = append(lines, ln)
			}
		}
	}
	slices.SortFunc(lines, func(a, b logLine) int { return a.at.Compare(b.at) })
	var out []string
	for _, ln := range lines {
		if len(out) == 12 {
			out = append(out, fmt.Sprintf("... and %d more", len(lines)-12))
			break
		}
		out = append(out, fmt.Sprintf("%+.3fs c%d %s", ln.at.Sub(sent[worst]).Seconds(), ln.courier, ln.text))
	}
	name := fmt.Sprintf("message %d (entity e%d), published %+.3fs into the event, waited %s",
		worst, worst%rolloutEntities, sent[worst].Sub(start).Seconds(), fmtSec(wait))
	return name, out
}

// startUpLine reports whether msg is one of the lines every courier logs
// as it starts or stops, which say nothing of a stall.
func startUpLine(msg string) bool {
	if msg == "consuming" { // not "consuming again", which may be the cause
		return true
	}
	for _, p := range []string{"courier starting", "features in force", "connected to NATS", "dedup keys in a shared",
		"catching max-deliveries", "sharing the durable's partitions", "summary", "courier stopped"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// rolloutSet is the couriers of one run: each a process with a log, a
// dedup directory and an admin port of its own, calling the app on a path
// of its own (/messages/c<i>) so that the app tells who called last.
type rolloutSet struct {
	b      *bench
	cl     *cluster
	run    uint64
	stream string
	e      rolloutEvent
	m      rolloutMode
	mu     sync.Mutex
	cs     []*child
	logs   []string
}

func newRolloutSet(b *bench, cl *cluster, run uint64, stream string, e rolloutEvent, m rolloutMode) *rolloutSet {
	return &rolloutSet{b: b, cl: cl, run: run, stream: stream, e: e, m: m}
}

// start starts the next courier and, with ready, waits until its /readyz
// answers 200.
func (s *rolloutSet) start(ctx context.Context, ready bool) (int, error) {
	i := len(s.cs)
	port, err := freePort()
	if err != nil {
		return 0, err
	}
	extra := append([]string{
		"NATS_URL=" + s.cl.nodeFirst(i),
		"COURIER_APP_URL=" + s.b.app.URL() + "/c" + strconv.Itoa(i),
		"COURIER_ADMIN_ADDR=127.0.0.1:" + strconv.Itoa(port),
		"COURIER_STREAM_REPLICAS=3",
		"COURIER_ACK_WAIT=" + s.e.ackWait().String(),
	}, s.m.env...)
	c, logPath, err := s.b.launchReplica(dedupShared, s.run, s.stream, rolloutInflight, i, extra...)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.cs, s.logs = append(s.cs, c), append(s.logs, logPath)
	s.mu.Unlock()
	if !ready {
		return i, nil
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", port)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return i, nil
			}
		}
		select {
		case <-c.Exited():
			return i, fmt.Errorf("courier %d exited before it was ready", i)
		case <-ctx.Done():
			return i, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return i, fmt.Errorf("courier %d not ready within 60s", i)
		}
	}
}

// stopAll stops every courier still running, and returns what each logged.
func (s *rolloutSet) stopAll() []courierLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range s.cs {
		wg.Go(func() { _ = c.stop(stopGrace) })
	}
	wg.Wait()
	out := make([]courierLog, len(s.logs))
	for i, p := range s.logs {
		out[i] = readCourierLog(p)
		_ = os.Remove(p)
	}
	s.cs, s.logs = nil, nil
	return out
}

// courierLog is what one courier logged, line by line.
type courierLog struct{ lines []logLine }

// logLine is one line of courier's JSON log: when, and the rest as text.
type logLine struct {
	at      time.Time
	msg     string
	text    string
	courier int
}

// readCourierLog reads a log of courier's JSON lines.
func readCourierLog(path string) courierLog {
	var out courierLog
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			continue
		}
		at, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(rec["time"]))
		msg := fmt.Sprint(rec["msg"])
		text := fmt.Sprint(rec["level"], " ", msg)
		keys := make([]string, 0, len(rec))
		for k := range rec {
			if k != "time" && k != "level" && k != "msg" {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			text += fmt.Sprintf(" %s=%v", k, rec[k])
		}
		if len(text) > 300 {
			text = text[:300] + "…"
		}
		out.lines = append(out.lines, logLine{at: at, msg: msg, text: text})
	}
	return out
}

// kill ends the process with SIGKILL and waits for it; stop is a no-op
// after.
func (c *child) kill() {
	c.stopOnce.Do(func() {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.exited
	})
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
		if r.event == crash {
			called := "  the app not called again after the kill\n"
			if r.recalled >= 0 {
				called = fmt.Sprintf("  the app called again %s after the kill\n", fmtSec(r.recalled))
			}
			fmt.Fprint(w, called)
		}
		fmt.Fprintf(w, "  %d published, %d duplicate requests, %d first called before an earlier message of their entity%s\n",
			r.published, r.dups, r.disorder, noteIf(r.err))
		if r.worst != "" {
			fmt.Fprintf(w, "  longest wait during: %s; the couriers' log meanwhile:\n", r.worst)
			for _, l := range r.cause {
				fmt.Fprintf(w, "    %s\n", l)
			}
		}
	}
}
