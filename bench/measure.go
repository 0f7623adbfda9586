package main

// One measurement of one process under test: a drain of preloaded messages
// (drain), its memory at rest (idle) and the latency it adds at a paced
// rate (latency, pace); each starts the process (main.go's launch), and
// finish stops it and cleans up after it. rounds.go runs them in rounds and
// report.go prints what they return.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// stopGrace is how long a process under test gets to exit after SIGTERM:
// courier's default shutdown grace (25s) and a little more.
const stopGrace = 30 * time.Second

// logCount is what a process under test logged.
type logCount struct {
	lines int      // every line
	warns int      // lines at warn or error
	head  []string // the first warn or error lines
}

// countLog reads a log of JSON lines (courier's format when not on a
// terminal; the forwarder writes only errors, as plain text).
func countLog(data []byte) logCount {
	var lc logCount
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		lc.lines++
		if strings.Contains(line, `"level":"INFO"`) || strings.Contains(line, `"level":"DEBUG"`) {
			continue
		}
		lc.warns++
		if len(lc.head) < 3 {
			lc.head = append(lc.head, line)
		}
	}
	return lc
}

// finish stops c, removes what the measurement left on disk and the
// server, and returns c's exit error and what it logged.
func (b *bench) finish(ctx context.Context, c *child, run uint64, logPath string) (logs logCount, stopErr error) {
	stopErr = c.stop(stopGrace)
	b.app.measure(nil)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := b.broker.deleteStreams(dctx); err != nil {
		stopErr = errors.Join(stopErr, fmt.Errorf("deleting streams: %w", err))
	}
	_ = os.RemoveAll(b.dedupDir(run))
	if logPath != "" {
		if data, err := os.ReadFile(logPath); err == nil {
			logs = countLog(data)
		}
		_ = os.Remove(logPath)
	}
	return logs, stopErr
}

// awaitDrain waits until the app has all n messages of t and settled says
// the durable holds none, or until exited is closed (why: how the courier
// ended) or rctx ends (the run's timeout).
func (b *bench) awaitDrain(rctx context.Context, t *tally, n int, exited <-chan struct{}, why func() error, settled func(context.Context) error) error {
	select {
	case <-t.Done():
		return settled(rctx)
	case <-exited:
		return why()
	case <-rctx.Done():
		return fmt.Errorf("timed out after %s with %d/%d received", b.o.timeout, t.distinct.Load(), n)
	}
}

// anyExited is closed once the first of cs exits, unless ctx ends first.
func anyExited(ctx context.Context, cs []*child) <-chan struct{} {
	exited := make(chan struct{})
	var once sync.Once
	for _, c := range cs {
		go func() {
			select {
			case <-c.Exited():
				once.Do(func() { close(exited) })
			case <-ctx.Done():
			}
		}()
	}
	return exited
}

// finishAll stops every courier of cs together (before the streams and the
// bucket are deleted), then reads each one's log (logs[i]), and returns the
// warnings logged, their first lines, and err joined with the stop errors.
func (b *bench) finishAll(ctx context.Context, cs []*child, run uint64, logs []string, err error) (int, []string, error) {
	var wg sync.WaitGroup
	stopErrs := make([]error, len(cs))
	for i, c := range cs {
		wg.Go(func() { stopErrs[i] = c.stop(stopGrace) })
	}
	wg.Wait()
	err = errors.Join(append([]error{err}, stopErrs...)...)
	warns, head := 0, []string(nil)
	for i, c := range cs {
		lc, _ := b.finish(ctx, c, run, logs[i])
		warns += lc.warns
		head = append(head, lc.head...)
	}
	return warns, head, err
}

// drainResult is one drain of N preloaded messages.
type drainResult struct {
	v        variant
	inflight int
	n        int
	elapsed  time.Duration // process start → every message received and acked
	startup  time.Duration // process start → first message received
	steady   time.Duration // first → last message received
	cpu      time.Duration // the process's CPU time, start-up included
	hostCPU  time.Duration // the bench process's (nats-server and app) meanwhile
	// cpuFirst and hostCPUFirst are cpu and hostCPU when the app received
	// the first message; they are -1 when that was not read.
	cpuFirst, hostCPUFirst time.Duration
	peak                   memory // the peak of each part, sampled every 50ms
	hwm                    int64  // VmHWM at the end: the kernel's peak of the whole
	end                    memory // at the end, every message acked (keys held)
	requests               int64  // requests the app received
	distinct               int64  // messages among them
	strays                 int64  // requests carrying no message of this drain
	logs                   logCount
	err                    error // an anomaly: timeout, early exit, exit status
}

// rate is messages per second from process start until all were acked.
func (r drainResult) rate() float64 { return float64(r.distinct) / r.elapsed.Seconds() }

// steadyRate is messages per second from the first received to the last.
func (r drainResult) steadyRate() float64 {
	if r.steady <= 0 {
		return 0
	}
	return float64(r.distinct-1) / r.steady.Seconds()
}

// drain preloads o.n messages, starts v, and measures how long it takes to
// deliver and ack them all. An error is returned only when the benchmark
// itself cannot go on; the process's misbehaviour is recorded in the result.
func (b *bench) drain(ctx context.Context, v variant, inflight int) (drainResult, error) {
	r := drainResult{v: v, inflight: inflight, n: b.o.n}
	run, stream, subject := b.next()
	pctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()
	captured := subject
	if v.keys() > 0 {
		captured = subject + ".>" // subject.<key> (preload)
	}
	if err := b.broker.createStream(pctx, stream, captured); err != nil {
		return r, err
	}
	if err := b.broker.preload(pctx, stream, subject, v.keys(), run, b.o.n, b.o.size); err != nil {
		return r, err
	}
	t := newTally(run, b.o.n)
	b.app.measure(t)
	if v == dedupBatchJSON {
		b.app.decodeBatches(true)
		defer b.app.decodeBatches(false)
	}

	hostBefore := selfCPU()
	c, logPath, err := b.launch(v, run, stream, inflight)
	if err != nil {
		return r, err
	}
	defer c.stop(stopGrace) // on every path; a no-op after finish
	rss := sampleRSS(c, 50*time.Millisecond)
	// The CPU used so far when the first message reaches the app, so that
	// start-up, which courier spends more on (its store, its streams), can
	// be told from the work per message.
	atFirst := make(chan [2]time.Duration, 1)
	quitFirst := make(chan struct{})
	go func() {
		defer close(atFirst)
		select {
		case <-t.First():
			if cpu, err := c.cpu(); err == nil {
				atFirst <- [2]time.Duration{cpu, selfCPU() - hostBefore}
			}
		case <-quitFirst:
		}
	}()
	rctx, cancelRun := context.WithTimeout(ctx, b.o.timeout)
	defer cancelRun()
	r.err = b.awaitDrain(rctx, t, b.o.n, c.Exited(), func() error { return fmt.Errorf("exited before draining: %v", c.err) },
		func(ctx context.Context) error { return b.broker.waitSettled(ctx, stream, consumerName) })
	r.elapsed = time.Since(c.started)
	r.hostCPU = selfCPU() - hostBefore
	r.cpu, _ = c.cpu()
	close(quitFirst)
	r.cpuFirst, r.hostCPUFirst = -1, -1
	if v, ok := <-atFirst; ok {
		r.cpuFirst, r.hostCPUFirst = v[0], v[1]
	}
	r.hwm, _ = c.hwm()
	r.end, _ = c.memory()
	r.peak = rss.stop()
	r.requests, r.distinct, r.strays = t.requests.Load(), t.distinct.Load(), t.strays.Load()
	if first := t.first.Load(); first != 0 {
		r.startup = time.Unix(0, first).Sub(c.started)
		if last := t.last.Load(); last != 0 {
			r.steady = time.Duration(last - first)
		}
	}
	logs, stopErr := b.finish(ctx, c, run, logPath)
	r.err = errors.Join(r.err, stopErr)
	r.logs = logs
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	return r, nil
}

// idleResult is a process's memory after start-up, with nothing to do.
type idleResult struct {
	v   variant
	mem memory
	hwm int64
	err error
}

// idle starts v against an empty stream, waits until its consumer exists and
// one second more, and reads its resident memory.
func (b *bench) idle(ctx context.Context, v variant) (idleResult, error) {
	r := idleResult{v: v}
	run, stream, subject := b.next()
	ctx2, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()
	if err := b.broker.createStream(ctx2, stream, subject); err != nil {
		return r, err
	}
	c, logPath, err := b.launch(v, run, stream, focusInflight)
	if err != nil {
		return r, err
	}
	defer c.stop(stopGrace)
	if _, err := b.broker.waitConsumer(ctx2, stream, consumerName); err != nil {
		r.err = err
	} else {
		select {
		case <-time.After(time.Second):
		case <-ctx2.Done():
		}
		r.mem, _ = c.memory()
		r.hwm, _ = c.hwm()
	}
	_, stopErr := b.finish(ctx, c, run, logPath)
	r.err = errors.Join(r.err, stopErr)
	return r, ctx.Err()
}

// latencyResult is the latency phase of one variant.
type latencyResult struct {
	v        variant
	inflight int
	achieved float64         // publish rate actually reached, msgs/s
	lat      []time.Duration // publish → app, sorted
	err      error
}

// pct is the q-quantile of the latencies (nearest rank).
func (r latencyResult) pct(q float64) time.Duration {
	return percentile(r.lat, q)
}

// latencyWarmup messages are delivered before the paced phase, so that
// connections are open and the process warm.
const latencyWarmup = 100

// latency starts v on an empty stream, publishes o.latencyN messages paced at
// o.rate, each stamped with its publish time, and records when the app
// receives each.
func (b *bench) latency(ctx context.Context, v variant, inflight int) (latencyResult, error) {
	r := latencyResult{v: v, inflight: inflight}
	run, stream, subject := b.next()
	publishing := time.Duration(float64(b.o.latencyN) / b.o.rate * float64(time.Second))
	rctx, cancel := context.WithTimeout(ctx, b.o.timeout+publishing)
	defer cancel()
	if err := b.broker.createStream(rctx, stream, subject); err != nil {
		return r, err
	}
	t := newTally(run, latencyWarmup+b.o.latencyN)
	b.app.measure(t)
	c, logPath, err := b.launch(v, run, stream, inflight)
	if err != nil {
		return r, err
	}
	defer c.stop(stopGrace)

	r.achieved, r.err = b.pace(rctx, t, run, stream, subject)
	if r.err == nil {
		select {
		case <-t.Done():
			r.err = b.broker.waitSettled(rctx, stream, consumerName)
		case <-c.Exited():
			r.err = fmt.Errorf("exited early: %v", c.err)
		case <-rctx.Done():
			r.err = fmt.Errorf("timed out with %d/%d received", t.distinct.Load(), t.n)
		}
	}
	r.lat = t.latencies(latencyWarmup)
	slices.Sort(r.lat)
	_, stopErr := b.finish(ctx, c, run, logPath)
	r.err = errors.Join(r.err, stopErr)
	return r, ctx.Err()
}

// pace waits for the consumer, delivers the warm-up messages, then publishes
// the measured ones at o.rate on a fixed schedule (a late publish does not
// shift the ones after it). It returns the publish rate reached.
func (b *bench) pace(ctx context.Context, t *tally, run uint64, stream, subject string) (float64, error) {
	if _, err := b.broker.waitConsumer(ctx, stream, consumerName); err != nil {
		return 0, err
	}
	for id := range latencyWarmup {
		if err := b.broker.publish(ctx, subject, run, id, b.o.size); err != nil {
			return 0, err
		}
	}
	for t.distinct.Load() < latencyWarmup {
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("warm-up: %d/%d received: %w", t.distinct.Load(), latencyWarmup, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	interval := time.Duration(float64(time.Second) / b.o.rate)
	begin := time.Now()
	for i := range b.o.latencyN {
		if wait := time.Until(begin.Add(time.Duration(i) * interval)); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		if err := b.broker.publish(ctx, subject, run, latencyWarmup+i, b.o.size); err != nil {
			return 0, err
		}
	}
	// The last publish is due (n-1) intervals after the first.
	return float64(b.o.latencyN-1) / time.Since(begin).Seconds(), nil
}
