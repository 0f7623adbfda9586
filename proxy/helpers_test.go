package proxy_test

// The helpers the tests of this package share: an embedded JetStream server
// with the stream S and its dead-letter stream (setup), runners on it
// (run, runWith), apps, stores, and polls of observable state.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/verdict"
	"github.com/courierhq/courier/proxy"
)

// checker is the embedded store, for test stores to wrap.
type checker struct{ *dedup.Store }

// flakyStore wraps a real Badger store with failures that cannot be produced
// on demand for real: a store that errors on check or on record.
type flakyStore struct {
	checker
	seenFails   atomic.Int32 // fail this many Check calls
	recordFails atomic.Int32 // fail this many Record calls
	failedKeys  atomic.Int32 // keys in the Record calls failed
}

var errStore = errors.New("disk on fire")

func (f *flakyStore) Check(ctx context.Context, key string) (verdict.Verdict, error) {
	if f.seenFails.Add(-1) >= 0 {
		return verdict.New, errStore
	}
	return f.checker.Check(ctx, key)
}

func (f *flakyStore) Record(ctx context.Context, keys ...string) error {
	if f.recordFails.Add(-1) >= 0 {
		f.failedKeys.Add(int32(len(keys)))
		return errStore
	}
	return f.Store.Record(ctx, keys...)
}

type env struct {
	js       jetstream.JetStream
	cons     jetstream.Consumer
	reg      *prometheus.Registry
	calls    atomic.Int32
	attempts atomic.Int32 // the last Courier-Attempt the app saw
	url      string
}

// streams creates S, the stream the tests consume (subjects s.>), and the
// stream that keeps the dead letters of dlq.s.
func streams(tb testing.TB, js jetstream.JetStream) {
	tb.Helper()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		tb.Fatal(err)
	}
	if _, _, err := dlq.EnsureStream(ctx, js, "dlq.s", 1); err != nil {
		tb.Fatal(err)
	}
}

func setup(t *testing.T) *env {
	t.Helper()
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	streams(t, js)
	cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{
		Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5, AckWait: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{js: js, cons: cons, reg: prometheus.NewRegistry()}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.calls.Add(1)
		if n, err := strconv.Atoi(r.Header.Get(proxy.HeaderAttempt)); err == nil {
			e.attempts.Store(int32(n))
		}
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
	return e
}

func (e *env) run(t *testing.T, dd proxy.Deduper) (stop func()) {
	t.Helper()
	_, stop = e.runWith(t, dd, proxy.Options{MaxDeliver: 5, AckWait: 5 * time.Second,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	return stop
}

func (e *env) settled(t *testing.T) bool {
	info, err := e.cons.Info(context.Background())
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0
}

func openStore(t *testing.T) checker {
	t.Helper()
	s, err := dedup.Open(t.TempDir(), dedup.Options{TTL: time.Hour, Scope: "S/c"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return checker{s}
}

// counter reads a counter or gauge from the registry, by one label value
// ("" for a metric without labels).
func counter(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == "" && len(m.GetLabel()) == 0
			for _, lp := range m.GetLabel() {
				match = match || lp.GetValue() == label
			}
			if match && m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			if match {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("metric %s{%s} not found", name, label)
	return 0
}

// runWith starts a runner on e's consumer with o (AppURL, Stream, Consumer
// and Registerer filled in) and returns its stop function and the runner.
func (e *env) runWith(t *testing.T, dd proxy.Deduper, o proxy.Options) (*proxy.Runner, func()) {
	t.Helper()
	o.AppURL, o.Stream, o.Consumer, o.Registerer = e.url, "S", "c", e.reg
	r, err := proxy.New(e.cons, dlq.NewPublisher(e.js, "dlq.s"), dd, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = r.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return r, stop
}

// updateConsumer changes the durable "c" on the server to cfg (its name and
// explicit acks filled in), as an operator or another courier would.
func (e *env) updateConsumer(t *testing.T, cfg jetstream.ConsumerConfig) {
	t.Helper()
	cfg.Durable, cfg.AckPolicy = "c", jetstream.AckExplicitPolicy
	cons, err := e.js.UpdateConsumer(context.Background(), "S", cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.cons = cons
}

func (e *env) publish(t *testing.T, n int, body []byte) {
	t.Helper()
	for i := range n {
		if _, err := e.js.Publish(context.Background(), fmt.Sprint("s.", i), body); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *env) slowApp(t *testing.T, d time.Duration) {
	t.Helper()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.calls.Add(1)
		// Read the body: only then does the server notice the client going.
		_, _ = io.Copy(io.Discard, r.Body)
		select { // returns early when courier abandons the request
		case <-time.After(d):
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

type nopDLQ struct{}

func (nopDLQ) DeadLetter(context.Context, dlq.Letter) error { return nil }

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

// waitBreakerOpen waits until r reports its breaker open (/readyz).
func waitBreakerOpen(t *testing.T, r *proxy.Runner) {
	t.Helper()
	poll.Until(t, 10*time.Second, "the breaker to open", func() bool {
		err := r.Ready()
		return err != nil && contains(err.Error(), "breaker open")
	})
}

// publishKeyed publishes one message on subj with an Idempotency-Key.
func (e *env) publishKeyed(t *testing.T, subj, key string) {
	t.Helper()
	m := nats.NewMsg(subj)
	m.Header.Set(proxy.HeaderIdempotencyKey, key)
	m.Data = []byte("x")
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// appLater points e at an address where no app listens yet, and returns
// the function that starts h there: an app outage from the start, ended
// when the test says. It skips the test if the port is taken meanwhile.
func appLater(t *testing.T, e *env) func(h http.Handler) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	e.url = "http://" + addr
	return func(h http.Handler) {
		t.Helper()
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("port taken meanwhile: %v", err)
		}
		app := httptest.NewUnstartedServer(h)
		app.Listener = ln
		app.Start()
		t.Cleanup(app.Close)
	}
}

// numbered is n keys: prefix0, prefix1, ...
func numbered(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}
