package proxy_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/testlog"
	"github.com/courierhq/courier/proxy"
)

// stormApp answers 503 to everything while storming is set, else 200 (or
// 503 for keys in failing, always).
type stormApp struct {
	storming atomic.Bool
	failing  map[string]bool
	ok       atomic.Int32
	mu       sync.Mutex
	times    []time.Time
	keys     map[string]int // 2xx per key
}

func (a *stormApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.times = append(a.times, time.Now())
	a.mu.Unlock()
	key := r.Header.Get(proxy.HeaderIdempotencyKey)
	if a.storming.Load() || a.failing[key] {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	a.mu.Lock()
	a.keys[key]++
	a.mu.Unlock()
	a.ok.Add(1)
}

func newStormApp(t *testing.T, e *env, failing ...string) *stormApp {
	a := &stormApp{failing: map[string]bool{}, keys: map[string]int{}}
	for _, k := range failing {
		a.failing[k] = true
	}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return a
}

func (e *env) deadLetters(t *testing.T) uint64 {
	t.Helper()
	s, err := e.js.Stream(context.Background(), dlq.StreamName("dlq.s"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// A storm of 503s (the app is up, its database is not) dead-letters nothing:
// the breaker stops sending, probes, and everything is delivered after.
func TestStormDeadLettersNothing(t *testing.T) {
	e := setup(t)
	a := newStormApp(t, e)
	a.storming.Store(true)
	const n = 40
	e.publish(t, n, []byte("x"))
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 3, MaxInflight: 4, BreakerFailures: 5, BreakerProbe: 100 * time.Millisecond,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
	})
	waitBreakerOpen(t, r)
	time.Sleep(time.Second) // the storm goes on
	a.mu.Lock()
	requestsInStorm := len(a.times)
	a.mu.Unlock()
	a.storming.Store(false)
	waitFor(t, "every message delivered after the storm", func() bool { return a.ok.Load() >= n && e.settled(t) })
	if got := e.deadLetters(t); got != 0 {
		t.Errorf("%d dead letters from a storm", got)
	}
	if requestsInStorm > 3*n/2 {
		t.Errorf("%d requests during the storm for %d messages: the breaker did not stop sending", requestsInStorm, n)
	}
	waitFor(t, "ready again", func() bool { return r.Ready() == nil })
	t.Logf("%d requests during a 1s+ storm for %d messages", requestsInStorm, n)
}

// Two messages that always fail among steady successes never open the
// breaker and slow nothing down: the rest are delivered as they come, and the
// two are dead-lettered once their budget is spent.
func TestFailingMessagesAmongSuccessesDoNotOpenBreaker(t *testing.T) {
	e := setup(t)
	a := newStormApp(t, e, "bad-1", "bad-2")
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 4, MaxInflight: 4, BreakerFailures: 5, BreakerProbe: time.Hour,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
	})
	// Steady successes: a good message every 2ms until both bad ones are
	// dead-lettered.
	stop := make(chan struct{})
	published := make(chan int)
	go func() {
		n := 0
		defer func() { published <- n }()
		tk := time.NewTicker(2 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				if _, err := e.js.Publish(context.Background(), "s.good", []byte("x")); err == nil {
					n++
				}
			}
		}
	}()
	for _, k := range []string{"bad-1", "bad-2"} {
		m := nats.NewMsg("s.bad")
		m.Header.Set(proxy.HeaderIdempotencyKey, k)
		if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both bad messages dead-lettered", func() bool { return e.deadLetters(t) == 2 })
	close(stop)
	n := <-published
	waitFor(t, "every good message delivered", func() bool { return int(a.ok.Load()) == n })
	if err := r.Ready(); err != nil {
		t.Errorf("not ready: %v", err)
	}
	if got := counter(t, e.reg, "courier_delivery_held_seconds_total", "breaker_open"); got != 0 {
		t.Errorf("the breaker was open for %vs", got)
	}
}

// COURIER_MAX_RATE caps requests per second across workers.
func TestMaxRateCapsRequests(t *testing.T) {
	e := setup(t)
	a := newStormApp(t, e)
	const n, perSecond = 30, 20.0
	e.publish(t, n, []byte("x"))
	_, _ = e.runWith(t, nil, proxy.Options{MaxInflight: 8, MaxRate: perSecond})
	waitFor(t, "every message delivered", func() bool { return a.ok.Load() == n })
	a.mu.Lock()
	defer a.mu.Unlock()
	// In any window of one second, at most perSecond+1 requests (the
	// bucket starts with one token).
	for i := range a.times {
		in := 0
		for j := i; j < len(a.times) && a.times[j].Sub(a.times[i]) < time.Second; j++ {
			in++
		}
		if in > int(perSecond)+1 {
			t.Fatalf("%d requests within one second from request %d, cap %v/s", in, i, perSecond)
		}
	}
	if got := counter(t, e.reg, "courier_rate_limit_wait_seconds_total", ""); got <= 0 {
		t.Errorf("no time counted waiting for the rate limit (%v)", got)
	}
}

// A paused consumer is not fetched from, and readiness says so; resumed, it
// delivers.
func TestPausedConsumerIsNotFetched(t *testing.T) {
	e := setup(t)
	a := newStormApp(t, e)
	ctx := context.Background()
	if _, err := e.js.PauseConsumer(ctx, "S", "c", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	r, _ := e.runWith(t, nil, proxy.Options{InfoInterval: 50 * time.Millisecond})
	waitFor(t, "readiness to say paused", func() bool {
		err := r.Ready()
		return err != nil && contains(err.Error(), "consumer paused")
	})
	e.publish(t, 5, []byte("x"))
	time.Sleep(300 * time.Millisecond)
	if got := a.ok.Load(); got != 0 {
		t.Fatalf("%d messages delivered while paused", got)
	}
	if _, err := e.js.ResumeConsumer(ctx, "S", "c"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "delivery after resume", func() bool { return a.ok.Load() == 5 })
}

// A storm the app ends with a Retry-After: the breaker waits what the app
// asked before its first probe, and nothing is dead-lettered.
func TestStormEndedByRetryAfter(t *testing.T) {
	e := setup(t)
	var storming atomic.Bool
	storming.Store(true)
	var mu sync.Mutex
	var times []time.Time
	var ok atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		if storming.Load() {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		ok.Add(1)
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
	const n = 20
	e.publish(t, n, []byte("x"))
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 3, MaxInflight: 2, BreakerFailures: 3, BreakerProbe: 50 * time.Millisecond,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 5 * time.Second,
	})
	var opened time.Time
	waitFor(t, "the breaker to open", func() bool {
		err := r.Ready()
		if err != nil && contains(err.Error(), "breaker open") {
			opened = time.Now()
			return true
		}
		return false
	})
	time.Sleep(1500 * time.Millisecond) // the first probe is due after Retry-After: 1s
	storming.Store(false)
	waitFor(t, "every message delivered", func() bool { return ok.Load() == n && e.settled(t) })
	if got := e.deadLetters(t); got != 0 {
		t.Errorf("%d dead letters", got)
	}
	mu.Lock()
	defer mu.Unlock()
	// No request in the first 900ms after the breaker opened: the app's
	// Retry-After (1s) wins over BreakerProbe (50ms).
	for _, at := range times {
		if d := at.Sub(opened); d > 50*time.Millisecond && d < 900*time.Millisecond {
			t.Errorf("a request %s after the breaker opened, before the app's Retry-After", d.Round(time.Millisecond))
		}
	}
}

// At the default level there is no line per delivered message: a summary of
// counts every interval in which there was traffic (none while idle), and
// one at shutdown.
func TestSummaryInsteadOfALinePerMessage(t *testing.T) {
	e := setup(t)
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	e.publish(t, 20, []byte("x"))
	_, stop := e.runWith(t, nil, proxy.Options{Logger: log, SummaryInterval: 100 * time.Millisecond})
	delivered := func() int { // over every periodic summary so far
		n := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if !strings.Contains(line, "msg=summary ") {
				continue
			}
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, "delivered="); ok {
					k, _ := strconv.Atoi(v)
					n += k
				}
			}
		}
		return n
	}
	waitFor(t, "summaries of the 20 deliveries", func() bool { return delivered() == 20 })
	idle := strings.Count(logs.String(), "msg=summary ")
	time.Sleep(400 * time.Millisecond) // four intervals without traffic
	if n := strings.Count(logs.String(), "msg=summary "); n != idle {
		t.Errorf("%d summaries logged while idle", n-idle)
	}
	stop()
	out := logs.String()
	if strings.Contains(out, "msg=delivered") {
		t.Errorf("a line per delivered message at info:\n%s", out)
	}
	if !strings.Contains(out, "summary at shutdown") {
		t.Errorf("no summary at shutdown:\n%s", out)
	}
}

// waitBreakerOpen waits until r reports its breaker open (/readyz).
func waitBreakerOpen(t *testing.T, r *proxy.Runner) {
	t.Helper()
	waitFor(t, "the breaker to open", func() bool {
		err := r.Ready()
		return err != nil && contains(err.Error(), "breaker open")
	})
}
