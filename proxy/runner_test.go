package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

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

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, what, cond)
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

// A store that cannot answer a check is an outage like the app's: the
// message is held (never sent unchecked, no attempt spent) and delivered once
// the store answers again.
func TestStoreCheckErrorHoldsSpendsNothing(t *testing.T) {
	e := setup(t)
	fs := &flakyStore{checker: openStore(t)}
	fs.seenFails.Store(4)
	e.run(t, fs)
	if _, err := e.js.Publish(context.Background(), "s.x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "delivery after the store recovers", func() bool { return e.calls.Load() == 1 && e.settled(t) })
	if got := counter(t, e.reg, "courier_dedup_errors_total", "check"); got != 4 {
		t.Errorf("check errors counted %v, want 4", got)
	}
	if got := e.attempts.Load(); got != 1 {
		t.Errorf("the app saw Courier-Attempt %d, want 1: a store that could not answer spent attempts", got)
	}
	if got := counter(t, e.reg, "courier_messages_total", "retried"); got != 0 {
		t.Errorf("%v messages NAK'd while the store could not answer, want 0", got)
	}
}

// A store that fails to record after a 2xx: the messages are acked anyway
// (the effect happened), every key of the failed batch counted, and the keys
// of later batches recorded.
func TestStoreRecordErrorStillAcks(t *testing.T) {
	e := setup(t)
	fs := &flakyStore{checker: openStore(t)}
	fs.recordFails.Store(1)
	const n = 50
	for i := range n {
		if _, err := e.js.Publish(context.Background(), fmt.Sprint("s.", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	e.run(t, fs)
	waitFor(t, "every message acked", func() bool { return e.calls.Load() == n && e.settled(t) })
	failed := fs.failedKeys.Load()
	if failed == 0 {
		t.Fatal("no Record call failed")
	}
	if got := counter(t, e.reg, "courier_dedup_errors_total", "record"); got != float64(failed) {
		t.Errorf("record errors counted %v, want %d (every key of the failed batch)", got, failed)
	}
	if got := counter(t, e.reg, "courier_messages_total", "delivered"); got != n {
		t.Errorf("%v delivered, want %d", got, n)
	}
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

// batchWatcher is a store that commits slowly (a busy disk) and checks, at
// each Record, that none of the messages whose keys it records has been
// acked yet.
type batchWatcher struct {
	checker
	cons      jetstream.Consumer
	calls     atomic.Int32
	keys      atomic.Int32
	early     atomic.Int32 // keys recorded after their message was acked
	maxKeysIn atomic.Int32
}

func (b *batchWatcher) Record(ctx context.Context, keys ...string) error {
	b.calls.Add(1)
	b.keys.Add(int32(len(keys)))
	if n := int32(len(keys)); n > b.maxKeysIn.Load() {
		b.maxKeysIn.Store(n) // one recorder calls Record: no race to lose
	}
	info, err := b.cons.Info(ctx)
	if err != nil {
		return err
	}
	if info.NumAckPending < len(keys) {
		b.early.Add(int32(len(keys) - info.NumAckPending))
	}
	time.Sleep(20 * time.Millisecond)
	return b.Store.Record(ctx, keys...)
}

// The keys of concurrent deliveries are recorded together, each message
// acked only after its key is recorded.
func TestKeysOfConcurrentDeliveriesRecordedTogether(t *testing.T) {
	e := setup(t)
	bw := &batchWatcher{checker: openStore(t), cons: e.cons}
	const n = 300
	for i := range n {
		if _, err := e.js.Publish(context.Background(), fmt.Sprint("s.", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	e.run(t, bw)
	waitFor(t, "every message delivered and acked", func() bool { return e.calls.Load() == n && e.settled(t) })
	if got := bw.keys.Load(); got != n {
		t.Errorf("%d keys recorded, want %d", got, n)
	}
	if got := bw.early.Load(); got != 0 {
		t.Errorf("%d messages acked before their key was recorded", got)
	}
	calls := bw.calls.Load()
	if calls > n/4 {
		t.Errorf("%d Record calls for %d deliveries: want their keys recorded together", calls, n)
	}
	t.Logf("%d keys in %d Record calls, at most %d in one", n, calls, bw.maxKeysIn.Load())
}

// The fetch queue holds at most its byte budget: large messages are pulled
// a few at a time, not as many as the queue has slots for.
func TestFetchQueueBoundedInBytes(t *testing.T) {
	e := setup(t)
	release := make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
	}))
	t.Cleanup(app.Close)
	e.url = app.URL

	const n, size = 40, 512 << 10 // 20 MiB in all; the budget is 8 MiB
	body := make([]byte, size)
	for range n {
		if _, err := e.js.Publish(context.Background(), "s.big", body); err != nil {
			t.Fatal(err)
		}
	}
	r, err := proxy.New(e.cons, dlq.NewPublisher(e.js, "dlq.s"), nil, proxy.Options{
		AppURL: e.url, Stream: "S", Consumer: "c", MaxInflight: 1, AckWait: 5 * time.Second,
		Registerer: e.reg, MaxPayload: 1 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	t.Cleanup(func() { close(release) }) // first: the held request ends

	waitFor(t, "the queue filled", func() bool {
		info, err := e.cons.Info(context.Background())
		return err == nil && info.NumAckPending > 4
	})
	time.Sleep(300 * time.Millisecond) // give an unbounded fetch loop time to overreach
	info, err := e.cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// One with the app, and at most 8 MiB of 512 KiB messages queued.
	if most := 1 + (8<<20)/size; info.NumAckPending > most {
		t.Errorf("%d messages fetched and not settled, want at most %d (the byte budget)", info.NumAckPending, most)
	}
	t.Logf("%d of %d messages fetched while the app holds one", info.NumAckPending, n)
}

// A consumer that limits the size of a pull request (its own setting, or the
// server's max_request_batch applied to it) is pulled within the limit; a
// bigger pull would be refused every time and nothing delivered.
func TestPullWithinConsumerRequestLimits(t *testing.T) {
	e := setup(t)
	cons, err := e.js.CreateOrUpdateConsumer(context.Background(), "S", jetstream.ConsumerConfig{
		Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5, AckWait: 5 * time.Second,
		MaxRequestBatch: 5, MaxRequestMaxBytes: 4096,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.cons = cons
	const n = 40
	for i := range n {
		if _, err := e.js.Publish(context.Background(), fmt.Sprint("s.", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	e.run(t, nil)
	waitFor(t, "every message delivered", func() bool { return e.calls.Load() == n && e.settled(t) })
}
