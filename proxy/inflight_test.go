package proxy_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// poolApp is an app served by a fixed number of workers: a request that
// finds them all busy waits inside the app for one, as in a server with a
// worker pool. With shed set it answers 503 at once instead of waiting.
type poolApp struct {
	workers chan struct{}
	service atomic.Int64 // how long a worker takes, in nanoseconds
	shed    bool

	mu       sync.Mutex
	inside   int           // requests in the app, served or waiting
	area     time.Duration // ∫ inside dt: mean inside = area / elapsed
	last     time.Time
	most     int
	requests int
	shedded  int
}

func newPoolApp(t *testing.T, e *env, workers int, service time.Duration, shed bool) *poolApp {
	t.Helper()
	a := &poolApp{workers: make(chan struct{}, workers), shed: shed}
	a.service.Store(int64(service))
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return a
}

// enter notes a request coming in (d = 1) or leaving (d = -1).
func (a *poolApp) enter(d int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if !a.last.IsZero() {
		a.area += time.Duration(a.inside) * now.Sub(a.last)
	}
	a.last = now
	a.inside += d
	a.most = max(a.most, a.inside)
	if d > 0 {
		a.requests++
	}
}

func (a *poolApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	a.enter(1)
	defer a.enter(-1)
	if a.shed {
		select {
		case a.workers <- struct{}{}:
		default:
			a.mu.Lock()
			a.shedded++
			a.mu.Unlock()
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
	} else {
		a.workers <- struct{}{}
	}
	time.Sleep(time.Duration(a.service.Load()))
	<-a.workers
}

// mean is the mean number of requests inside the app since from (area and
// time at from).
func (a *poolApp) meanSince(area0 time.Duration, t0 time.Time) float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return float64(a.area-area0) / float64(a.last.Sub(t0))
}

func (a *poolApp) mark() (time.Duration, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.area, a.last
}

func autoOptions() proxy.Options {
	return proxy.Options{
		MaxDeliver: 5, AckWait: 10 * time.Second, HTTPTimeout: 2 * time.Second,
		MaxInflight: 64, InflightAuto: true,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
	}
}

// With an automatic limit, a backlog drains with few requests waiting
// inside an app of 4 workers, where a fixed 64 would queue 60 of them;
// when the app slows down five times mid-drain, the limit follows with no
// request timing out, and nothing is dead-lettered.
func TestAutoLimitKeepsTheAppsQueueShort(t *testing.T) {
	e := setup(t)
	const workers = 4
	a := newPoolApp(t, e, workers, 5*time.Millisecond, false)
	e.publish(t, 1500, []byte("x"))
	o := autoOptions()
	e.runWith(t, nil, o)
	poll.Until(t, 30*time.Second, "500 requests served", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.requests >= 500
	})
	area, at := a.mark()
	poll.Until(t, 30*time.Second, "500 more served", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.requests >= 1000
	})
	fast := a.meanSince(area, at)
	limitFast := counter(t, e.reg, "courier_inflight_limit", "")
	a.service.Store(int64(25 * time.Millisecond)) // five times slower
	area, at = a.mark()
	poll.Until(t, 60*time.Second, "every message settled", func() bool { return e.settled(t) })
	slow := a.meanSince(area, at)
	t.Logf("mean requests inside the app: %.1f at 5ms (limit %v), %.1f at 25ms (limit %v); most at once %d",
		fast, limitFast, slow, counter(t, e.reg, "courier_inflight_limit", ""), a.most)
	// The app's own workers are 4: a queue inside it as long again is
	// allowed for the noise of a loaded machine; a fixed 64 would keep 60
	// waiting.
	for _, m := range []float64{fast, slow} {
		if m > 2*workers {
			t.Errorf("mean %.1f requests inside an app of %d workers, want at most %d", m, workers, 2*workers)
		}
	}
	if n := counter(t, e.reg, "courier_app_requests_total", "timeout"); n > 0 {
		t.Errorf("%v requests timed out", n)
	}
	if n := e.deadLetters(t); n > 0 {
		t.Errorf("%d dead letters", n)
	}
	if counter(t, e.reg, "courier_inflight_limit_min_rtt_seconds", "") <= 0 {
		t.Error("no unloaded answer time measured")
	}
}

// An app that sheds load with 503 beyond its 4 workers gets few requests
// it must shed, and nothing is dead-lettered.
func TestAutoLimitHeedsAnAppThatSheds(t *testing.T) {
	e := setup(t)
	a := newPoolApp(t, e, 4, 5*time.Millisecond, true)
	e.publish(t, 800, []byte("x"))
	e.runWith(t, nil, autoOptions())
	poll.Until(t, 60*time.Second, "every message settled", func() bool { return e.settled(t) })
	a.mu.Lock()
	shed, requests := a.shedded, a.requests
	a.mu.Unlock()
	t.Logf("%d of %d requests shed with 503; limit changes for overload: %v", shed, requests,
		counter(t, e.reg, "courier_inflight_limit_changes_total", "overload"))
	if float64(shed) > 0.1*float64(requests) {
		t.Errorf("%d of %d requests shed, want at most a tenth", shed, requests)
	}
	if n := e.deadLetters(t); n > 0 {
		t.Errorf("%d dead letters", n)
	}
}

// A fixed limit is exactly COURIER_MAX_INFLIGHT: the app never has more,
// and has that many while there is a backlog.
func TestFixedLimitIsExact(t *testing.T) {
	e := setup(t)
	a := newPoolApp(t, e, 64, 20*time.Millisecond, false)
	e.publish(t, 200, []byte("x"))
	o := autoOptions()
	o.InflightAuto, o.MaxInflight = false, 6
	e.runWith(t, nil, o)
	poll.Until(t, 30*time.Second, "every message settled", func() bool { return e.settled(t) })
	if a.most != 6 {
		t.Errorf("at most %d requests in the app at once, want exactly 6", a.most)
	}
	if got := counter(t, e.reg, "courier_inflight_limit", ""); got != 6 {
		t.Errorf("courier_inflight_limit %v, want 6", got)
	}
}

// With an automatic limit, a storm of 503s opens the breaker, which holds
// everything and probes, and an app that is not there at all holds
// everything too: neither teaches the limit a wrong lesson (no answer is
// not a slow answer), nothing is dead-lettered, and once the app is back
// the backlog drains with the limit free to rise again.
func TestAutoLimitThroughBreakerAndOutage(t *testing.T) {
	e := setup(t)
	var storming atomic.Bool
	storming.Store(true)
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		if storming.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		time.Sleep(2 * time.Millisecond)
	}))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	e.publish(t, 300, []byte("x"))
	o := autoOptions()
	o.BreakerFailures, o.BreakerProbe = 5, 100*time.Millisecond
	r, _ := e.runWith(t, nil, o)
	waitBreakerOpen(t, r)
	before := counter(t, e.reg, "courier_inflight_limit", "")
	poll.Until(t, 10*time.Second, "probes during the storm", func() bool { return calls.Load() > 8 })
	if got := counter(t, e.reg, "courier_inflight_limit", ""); got < 1 {
		t.Fatalf("limit %v during the breaker's probes, want at least 1", got)
	}
	storming.Store(false)
	poll.Until(t, 30*time.Second, "every message settled", func() bool { return e.settled(t) })
	if n := e.deadLetters(t); n > 0 {
		t.Errorf("%d dead letters", n)
	}
	t.Logf("limit %v when the breaker opened, %v after the backlog; overload changes %v",
		before, counter(t, e.reg, "courier_inflight_limit", ""), counter(t, e.reg, "courier_inflight_limit_changes_total", "overload"))
}

// An app that cannot be reached holds every message without spending an
// attempt, and teaches the automatic limit nothing: once it is back the
// backlog drains and nothing is dead-lettered.
func TestAutoLimitAppUnreachable(t *testing.T) {
	e := setup(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	addr := srv.Listener.Addr().String()
	srv.Close() // nobody listens there yet
	e.url = "http://" + addr
	e.publish(t, 100, []byte("x"))
	e.runWith(t, nil, autoOptions())
	time.Sleep(500 * time.Millisecond) // real time passes while the app is away
	if got := counter(t, e.reg, "courier_inflight_limit_changes_total", "timeout") +
		counter(t, e.reg, "courier_inflight_limit_changes_total", "overload") +
		counter(t, e.reg, "courier_inflight_limit_changes_total", "queueing"); got != 0 {
		t.Errorf("the limit was lowered %v times by an app that was not there", got)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", addr, err)
	}
	back := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	})}}
	back.Start()
	t.Cleanup(back.Close)
	poll.Until(t, 30*time.Second, "every message settled", func() bool { return e.settled(t) })
	if n := e.deadLetters(t); n > 0 {
		t.Errorf("%d dead letters", n)
	}
}
