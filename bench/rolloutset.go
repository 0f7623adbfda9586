package main

// The couriers of one run of the rollout scenario (rollout.go): started,
// rolled, killed and stopped as a Deployment and a crash do it.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

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

// update is a rolling update: a new courier started and ready, then
// SIGTERM to an old one, one at a time. It returns how long each stop
// took and, in bad, the couriers that stopped badly (not exiting 0 within
// stopGrace), a finding of the run; err is a courier that would not
// start, which ends the update.
func (s *rolloutSet) update(ctx context.Context) (stops []time.Duration, bad, err error) {
	for old := range rolloutReplicas {
		if _, err := s.start(ctx, true); err != nil {
			return stops, bad, err
		}
		stopping := time.Now()
		if err := s.cs[old].stop(stopGrace); err != nil {
			bad = errors.Join(bad, fmt.Errorf("courier %d: %w", old, err))
		}
		stops = append(stops, time.Since(stopping))
	}
	return stops, bad, nil
}

// crash kills the courier that called the app last, starts a new one at
// once and waits out rolloutCrashWindow from the kill. It returns the
// watch on when the app is called again, which its caller must stop.
func (s *rolloutSet) crash(ctx context.Context, t *tally) (*recallWatch, error) {
	last := s.b.app.lastCaller()
	if last < 0 || last >= len(s.cs) {
		return nil, errors.New("no courier has called the app")
	}
	before := t.requests.Load()
	s.cs[last].kill()
	killed := time.Now()
	recall := watchRecall(t, before, killed)
	if _, err := s.start(ctx, false); err != nil {
		return recall, err
	}
	sleepCtx(ctx, rolloutCrashWindow-time.Since(killed))
	return recall, nil
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
