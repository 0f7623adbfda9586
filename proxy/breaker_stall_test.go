package proxy_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// A probe message that turns out to be a duplicate (acked without a
// request) must not leave the breaker open for good: another probe follows,
// and once the app recovers the rest is delivered.
func TestDuplicateProbeDoesNotStallBreaker(t *testing.T) {
	e := setup(t)
	a := newStormApp(t, e)
	a.storming.Store(true)
	st := openStore(t)
	if err := st.Record(context.Background(), "k-dup"); err != nil {
		t.Fatal(err)
	}
	// A and B open the breaker; C (a duplicate) is the first probe; D
	// waits behind it.
	e.publishKeyed(t, "s.a", "k-a")
	e.publishKeyed(t, "s.b", "k-b")
	e.publishKeyed(t, "s.c", "k-dup")
	e.publishKeyed(t, "s.d", "k-d")
	r, _ := e.runWith(t, st, proxy.Options{
		MaxDeliver: 5, MaxInflight: 1, BreakerFailures: 2, BreakerProbe: 100 * time.Millisecond,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
	})
	waitBreakerOpen(t, r)
	poll.Until(t, 10*time.Second, "the duplicate probe to go", func() bool {
		return counter(t, e.reg, "courier_messages_total", "duplicate") >= 1
	})
	a.storming.Store(false)
	poll.Until(t, 10*time.Second, "k-d delivered after the app recovered", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.keys["k-d"] == 1
	})
}

// restartableApp is an app on a fixed address that can be stopped (no
// connection can be made: refused) and started again.
type restartableApp struct {
	addr string
	h    http.Handler
	srv  *httptest.Server
}

func (a *restartableApp) start(t *testing.T) {
	t.Helper()
	var ln net.Listener
	var err error
	for range 100 {
		if ln, err = net.Listen("tcp", a.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	a.srv = httptest.NewUnstartedServer(a.h)
	a.srv.Listener = ln
	a.srv.Start()
	a.addr = ln.Addr().String()
}

// A probe that finds the app unreachable (it restarts while its dependency
// is down) must not leave the breaker open for good once the app is back.
func TestProbeMeetingUnreachableAppDoesNotStallBreaker(t *testing.T) {
	e := setup(t)
	sa := &stormApp{failing: map[string]bool{}, keys: map[string]int{}}
	sa.storming.Store(true)
	app := &restartableApp{addr: "127.0.0.1:0", h: sa}
	app.start(t)
	t.Cleanup(func() { app.srv.Close() })
	e.url = app.srv.URL
	e.publishKeyed(t, "s.a", "k-a")
	e.publishKeyed(t, "s.b", "k-b")
	e.publishKeyed(t, "s.c", "k-c")
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 5, MaxInflight: 1, BreakerFailures: 2, BreakerProbe: 300 * time.Millisecond,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
	})
	waitBreakerOpen(t, r)
	app.srv.Close() // the app goes away before the probe
	poll.Until(t, 10*time.Second, "the probe to find the app unavailable", func() bool {
		err := r.Ready()
		return err != nil && contains(err.Error(), "app unavailable")
	})
	sa.storming.Store(false)
	app.start(t)
	poll.Until(t, 10*time.Second, "k-c delivered after the app came back", func() bool {
		sa.mu.Lock()
		defer sa.mu.Unlock()
		return sa.keys["k-c"] == 1
	})
}

// With every held message on its last allowed delivery (always, with
// MaxDeliver 1), the breaker still probes: with such a message, whose
// failed probe is held again rather than dead-lettered. A and B, failing
// before the breaker opened, are dead-lettered as exhausted; C, held through
// the storm and probed with again and again, reaches the app once it is
// back, and is not dead-lettered.
func TestBreakerWithOnlyLastDeliveriesDoesNotStall(t *testing.T) {
	e := setup(t)
	a, r := openInStorm(t, e, 1, proxy.Options{
		BreakerProbe: 100 * time.Millisecond, BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
	})
	// Two failed probes with C, at least.
	poll.Until(t, 10*time.Second, "C probed twice", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.times) >= 4
	})
	if err := r.Ready(); err == nil || !contains(err.Error(), "breaker open") {
		t.Fatalf("Ready = %v during the storm, want breaker open", err)
	}
	a.storming.Store(false)
	poll.Until(t, 10*time.Second, "k-c delivered after the app recovered", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.keys["k-c"] == 1
	})
	poll.Until(t, 10*time.Second, "every message settled", func() bool { return e.settled(t) })
	if got := e.deadLetters(t); got != 2 {
		t.Errorf("%d dead letters, want 2 (A and B, exhausted before the breaker opened; none from a probe)", got)
	}
}

// A storm that outlasts the queued messages: each failed probe NAKs its
// message, fetching is stopped while the breaker is open, so once the queue
// is empty no message is left to probe with. Deliveries must still resume
// when the app recovers.
func TestStormLongerThanQueueDoesNotStall(t *testing.T) {
	e := setup(t)
	a, _ := openInStorm(t, e, 20, proxy.Options{
		BreakerProbe: 50 * time.Millisecond, BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
	})
	time.Sleep(4 * time.Second) // the storm outlasts the queue
	a.mu.Lock()
	t.Logf("%d requests in the storm", len(a.times))
	a.mu.Unlock()
	a.storming.Store(false)
	poll.Until(t, 10*time.Second, "every message delivered after the storm", func() bool { return a.ok.Load() >= 3 && e.settled(t) })
	if got := e.deadLetters(t); got != 0 {
		t.Errorf("%d dead letters from a storm", got)
	}
}

// openInStorm starts a runner with options o on A, B and C against an app
// answering 503 to everything, the consumer allowing maxDeliver deliveries,
// and returns once A and B have opened the breaker.
func openInStorm(t *testing.T, e *env, maxDeliver int, o proxy.Options) (*stormApp, *proxy.Runner) {
	t.Helper()
	a := newStormApp(t, e)
	a.storming.Store(true)
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: maxDeliver, AckWait: 5 * time.Second})
	e.publishKeyed(t, "s.a", "k-a")
	e.publishKeyed(t, "s.b", "k-b")
	e.publishKeyed(t, "s.c", "k-c")
	o.MaxDeliver, o.MaxInflight, o.BreakerFailures = maxDeliver, 1, 2
	r, _ := e.runWith(t, nil, o)
	waitBreakerOpen(t, r)
	return a, r
}
