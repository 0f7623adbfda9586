package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// flakyKeysApp fails each key in fails with 503 that many times, then
// answers 200; other keys get 200 at once. It counts the 2xx per key.
type flakyKeysApp struct {
	storming atomic.Bool // every request answered 503 while set
	mu       sync.Mutex
	fails    map[string]int // failures still to give, per key
	ok       map[string]int // 2xx per key
	requests int
}

func newFlakyKeysApp(t *testing.T, e *env) *flakyKeysApp {
	t.Helper()
	a := &flakyKeysApp{fails: map[string]int{}, ok: map[string]int{}}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return a
}

func (a *flakyKeysApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(proxy.HeaderIdempotencyKey)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests++
	if a.storming.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if a.fails[key] > 0 {
		a.fails[key]--
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	a.ok[key]++
}

func (a *flakyKeysApp) delivered(keys ...string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range keys {
		if a.ok[k] == 0 {
			return false
		}
	}
	return true
}

// Messages that fail on their own among successes, each a few times, are
// retried at their backoff and delivered: their retries, coming back
// together, are no sign of an outage and must not open the breaker (which
// would hold a healthy app back, its probes being such retries in turn).
// Reproduces a stall of over a minute with 20 messages unsettled.
func TestRetryBacklogDoesNotOpenBreaker(t *testing.T) {
	e := setup(t)
	a := newFlakyKeysApp(t, e)
	var keys []string
	for i := range 20 {
		bad, good := fmt.Sprintf("bad-%d", i), fmt.Sprintf("good-%d", i)
		a.fails[bad] = 3
		e.publishKeyed(t, "s.bad", bad)
		e.publishKeyed(t, "s.good", good)
		keys = append(keys, bad, good)
	}
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 5, MaxInflight: 4, BreakerFailures: 10, BreakerProbe: 5 * time.Second,
		BackoffInitial: 100 * time.Millisecond, BackoffMax: time.Second,
	})
	poll.Until(t, 20*time.Second, "every message delivered", func() bool { return a.delivered(keys...) && e.settled(t) })
	if got := e.deadLetters(t); got != 0 {
		t.Errorf("%d dead letters, want none", got)
	}
	if got := counter(t, e.reg, "courier_delivery_held_seconds_total", "breaker_open"); got != 0 {
		t.Errorf("the breaker was open for %vs", got)
	}
	if err := r.Ready(); err != nil {
		t.Errorf("not ready: %v", err)
	}
}

// After a restart, the messages a killed courier was retrying come back
// first: redeliveries, each failing once more before it succeeds. Their
// failures in a row say nothing of the app and must not open the breaker.
func TestRedeliveriesAfterRestartDoNotOpenBreaker(t *testing.T) {
	e := setup(t)
	a := newFlakyKeysApp(t, e)
	var keys []string
	for i := range 20 {
		k := fmt.Sprintf("k-%d", i)
		a.fails[k] = 1
		e.publishKeyed(t, "s.k", k)
		keys = append(keys, k)
	}
	// A courier that fetched them all and died: each is redelivered, its
	// first delivery spent.
	b, err := e.cons.Fetch(len(keys), jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range b.Messages() {
		if err := m.Nak(); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != len(keys) {
		t.Fatalf("fetched %d of %d", n, len(keys))
	}
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 5, MaxInflight: 4, BreakerFailures: 5, BreakerProbe: 5 * time.Second,
		BackoffInitial: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
	})
	poll.Until(t, 20*time.Second, "every message delivered", func() bool { return a.delivered(keys...) && e.settled(t) })
	if got := counter(t, e.reg, "courier_delivery_held_seconds_total", "breaker_open"); got != 0 {
		t.Errorf("the breaker was open for %vs", got)
	}
	if err := r.Ready(); err != nil {
		t.Errorf("not ready: %v", err)
	}
}

// A probe that fails on a message's last allowed delivery is held again,
// still owning its key's flight; the next probe may go to a held message of
// the same key, which must wait for that flight. Waiting, it must hand its
// probe on: the first probe then goes again, and once the app recovers
// everything is delivered. (Reproduced: the waiting probe kept its token, no
// probe was ever sent again, and /readyz said "breaker open" for good.)
func TestProbeWaitingOnItsKeyDoesNotStopProbing(t *testing.T) {
	e := setup(t)
	a := newFlakyKeysApp(t, e)
	a.storming.Store(true)
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: 1, AckWait: 5 * time.Second})
	e.publishKeyed(t, "s.a", "k-a")
	e.publishKeyed(t, "s.b", "k-b")
	r, _ := e.runWith(t, openStore(t), proxy.Options{
		MaxDeliver: 1, MaxInflight: 4, BreakerFailures: 2, BreakerProbe: 100 * time.Millisecond,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
	})
	waitBreakerOpen(t, r)
	// Two of one key, one of another, fetched while the breaker is open.
	for _, k := range []string{"k-c", "k-c", "k-d"} {
		m := nats.NewMsg("s.c")
		m.Header.Set(proxy.HeaderIdempotencyKey, k)
		m.Data = []byte(k)
		if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	// Enough failed probes for every held message to have had a turn.
	poll.Until(t, 10*time.Second, "the held messages probed", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.requests >= 2+6
	})
	a.storming.Store(false)
	poll.Until(t, 15*time.Second, "k-c and k-d delivered after the app recovered", func() bool { return a.delivered("k-c", "k-d") })
	poll.Until(t, 15*time.Second, "ready again", func() bool { return r.Ready() == nil })
	a.mu.Lock()
	okC := a.ok["k-c"]
	a.mu.Unlock()
	if okC != 1 {
		t.Errorf("k-c reached the app %d times with a 2xx, want 1 (the second is a duplicate)", okC)
	}
	if got := e.deadLetters(t); got != 2 {
		t.Errorf("%d dead letters, want 2 (A and B, exhausted before the breaker opened)", got)
	}
}
