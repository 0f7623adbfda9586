package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/proxy"
)

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

// The in-progress signals follow the consumer's ack wait on the server, not
// courier's own setting: in a rollout that lowers it, an old instance would
// otherwise signal too late and its in-flight messages reach the app twice.
func TestInProgressFollowsServerAckWait(t *testing.T) {
	e := setup(t)
	e.slowApp(t, 2500*time.Millisecond)
	// courier believes 30s; the server is changed to 1s once it runs.
	_, _ = e.runWith(t, nil, proxy.Options{AckWait: 30 * time.Second, InfoInterval: 100 * time.Millisecond, MaxInflight: 2})
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: 5, AckWait: time.Second})
	time.Sleep(300 * time.Millisecond) // at least one re-read of the settings
	e.publish(t, 2, []byte("x"))
	waitFor(t, "both messages acked", func() bool { return e.settled(t) && e.calls.Load() >= 2 })
	if got := e.calls.Load(); got != 2 {
		t.Errorf("app called %d times for 2 messages: the ack wait expired under a running request", got)
	}
}

// An operator lowers the consumer's pull limit while courier runs: the
// refused pulls make courier re-read the consumer and pull within the new
// limit, without a restart.
func TestPullLimitLoweredWhileRunning(t *testing.T) {
	e := setup(t)
	r, _ := e.runWith(t, nil, proxy.Options{AckWait: 5 * time.Second, InfoInterval: time.Hour})
	waitFor(t, "the consumer bound", func() bool { return r.Ready() == nil })
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: 5, AckWait: 5 * time.Second, MaxRequestBatch: 3})
	const n = 30
	e.publish(t, n, []byte("x"))
	waitFor(t, "every message delivered within the new limit", func() bool { return e.calls.Load() == n && e.settled(t) })
}

// With one delivery allowed, messages fetched but not started when courier
// stops are sent within the grace period, not NAK'd (JetStream would give up
// on them without the app having seen them).
func TestLastDeliveryNotGivenBackAtShutdown(t *testing.T) {
	e := setup(t)
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: 1, AckWait: 5 * time.Second})
	e.slowApp(t, 20*time.Millisecond)
	const n = 20
	e.publish(t, n, []byte("x"))
	_, stop := e.runWith(t, nil, proxy.Options{MaxDeliver: 1, MaxInflight: 1, ShutdownGrace: 10 * time.Second})
	waitFor(t, "the first message sent", func() bool { return e.calls.Load() > 0 })
	stop()
	if got := e.calls.Load(); got != n {
		t.Errorf("the app saw %d of %d messages; the rest were given back on their last delivery", got, n)
	}
	if got := counter(t, e.reg, "courier_messages_total", "released"); got != 0 {
		t.Errorf("%v messages released on their last delivery", got)
	}
}

// A grace period of 0 means none: a running request is abandoned at once.
func TestZeroGraceAbandonsAtOnce(t *testing.T) {
	e := setup(t)
	e.slowApp(t, 5*time.Second)
	e.publish(t, 1, []byte("x"))
	_, stop := e.runWith(t, nil, proxy.Options{ShutdownGrace: 0})
	waitFor(t, "the request sent", func() bool { return e.calls.Load() == 1 })
	began := time.Now()
	stop()
	if took := time.Since(began); took > 3*time.Second {
		t.Errorf("stopping with no grace took %s: the running request was waited for", took)
	}
}

// A dead-letter stream that refuses a dead letter (too large for it) holds
// that message and says so in readiness, but does not take the only worker:
// the messages behind it are delivered.
func TestRefusingDLQDoesNotTakeTheWorker(t *testing.T) {
	e := setup(t)
	if _, err := e.js.UpdateStream(context.Background(), jetstream.StreamConfig{
		Name: dlq.StreamName("dlq.s"), Subjects: []string{"dlq.s"}, MaxMsgSize: 512,
	}); err != nil {
		t.Fatal(err)
	}
	var ok atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > 100 {
			w.WriteHeader(http.StatusUnprocessableEntity) // rejected: dead-lettered
			return
		}
		ok.Add(1)
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
	if _, err := e.js.Publish(context.Background(), "s.big", make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	r, _ := e.runWith(t, nil, proxy.Options{MaxInflight: 1})
	e.publish(t, 5, []byte("small"))
	waitFor(t, "the messages behind the refused dead letter delivered", func() bool { return ok.Load() == 5 })
	waitFor(t, "readiness to name the dead letters", func() bool {
		err := r.Ready()
		return err != nil && contains(err.Error(), "dead letters cannot be stored")
	})
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// While the connection is down courier sends no pull: nats.go's Fetch would
// subscribe, fail to send the request, and leak the subscription, one per
// retry for the length of the outage.
func TestNoPullLeakWhileDisconnected(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	ctx := context.Background()
	// No reconnect buffer: a publish while disconnected fails at once, as
	// a full buffer does in a long outage.
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	app := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(app.Close)
	r, err := proxy.New(cons, nopDLQ{}, nil, proxy.Options{AppURL: app.URL, Stream: "S", Consumer: "c", Connected: nc.IsConnected})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "bound", func() bool { return r.Ready() == nil })
	before := nc.NumSubscriptions()
	s.Shutdown()
	s.WaitForShutdown()
	time.Sleep(3 * time.Second) // an outage: courier retries its pulls meanwhile
	after := nc.NumSubscriptions()
	t.Logf("subscriptions: %d before the outage, %d after 3s of it", before, after)
	if after > before+1 {
		t.Errorf("%d subscriptions after a 3s outage, %d before: pulls leaked them", after, before)
	}
}

type nopDLQ struct{}

func (nopDLQ) DeadLetter(context.Context, dlq.Letter) error { return nil }

// A message near the server's max_payload can still be dead-lettered (the
// envelope's headers would push a copy over the limit): a dead letter that
// refers to the original is stored, and the only worker goes on to the next
// message.
func TestMessageNearMaxPayloadIsDeadLettered(t *testing.T) {
	s := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = 8192 }})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	streams(t, js)
	cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5})
	if err != nil {
		t.Fatal(err)
	}
	var ok atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > 1000 {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		ok.Add(1)
	}))
	t.Cleanup(app.Close)
	if _, err := js.Publish(ctx, "s.big", make([]byte, 8000)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := js.Publish(ctx, "s.small", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	r, err := proxy.New(cons, dlq.NewPublisher(js, "dlq.s"), nil, proxy.Options{
		AppURL: app.URL, Stream: "S", Consumer: "c", MaxInflight: 1, Registerer: reg, TermKeepsMessage: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the messages behind the large one delivered", func() bool { return ok.Load() == 3 })
	waitFor(t, "the large message dead-lettered", func() bool {
		return counter(t, reg, "courier_dead_letters_total", dlq.ReasonRejected) == 1
	})
	q, err := dlq.Open(ctx, js, "dlq.s")
	if err != nil {
		t.Fatal(err)
	}
	letters, err := q.List(ctx, dlq.Selection{})
	if err != nil || len(letters) != 1 {
		t.Fatalf("dead letters: %d, %v", len(letters), err)
	}
}

// A full disk (here: a floor above the file system's free space, which the
// store measures for real) is a clear state: courier holds the message
// (never sent unchecked, no attempt spent), readiness says why, nothing
// crashes.
func TestFullDiskHoldsMessages(t *testing.T) {
	e := setup(t)
	s, err := dedup.Open(t.TempDir(), dedup.Options{TTL: time.Hour, Scope: "S/c", DiskFloor: 1 << 60, DiskInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	e.publish(t, 3, []byte("x"))
	r, _ := e.runWith(t, s, proxy.Options{})
	waitFor(t, "readiness to name the store", func() bool {
		err := r.Ready()
		return err != nil && strings.Contains(err.Error(), "dedup store unavailable")
	})
	time.Sleep(300 * time.Millisecond)
	if got := e.calls.Load(); got != 0 {
		t.Errorf("the app was called %d times with the disk full: sent unchecked", got)
	}
	info, err := e.cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 {
		t.Errorf("%d messages redelivered while held", info.NumRedelivered)
	}
	if got := counter(t, e.reg, "courier_delivery_held", "store_unavailable"); got != 1 {
		t.Errorf("courier_delivery_held{cause=store_unavailable} = %v", got)
	}
}

// A request abandoned when the grace period ends, on the message's last
// allowed delivery, is dead-lettered (exhausted, saying why) rather than
// given back for JetStream to give up on with an error about the ack wait.
func TestAbandonedLastDeliveryIsDeadLettered(t *testing.T) {
	e := setup(t)
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: 1, AckWait: 5 * time.Second})
	e.slowApp(t, 10*time.Second)
	e.publish(t, 1, []byte("x"))
	_, stop := e.runWith(t, nil, proxy.Options{MaxDeliver: 1, ShutdownGrace: 200 * time.Millisecond})
	waitFor(t, "the request sent", func() bool { return e.calls.Load() == 1 })
	stop()
	q, err := dlq.Open(context.Background(), e.js, "dlq.s")
	if err != nil {
		t.Fatal(err)
	}
	letters, err := q.List(context.Background(), dlq.Selection{})
	if err != nil || len(letters) != 1 {
		t.Fatalf("dead letters: %d, %v", len(letters), err)
	}
	if got := letters[0].Reason; got != dlq.ReasonExhausted {
		t.Errorf("reason %q, want %q", got, dlq.ReasonExhausted)
	}
	if !strings.Contains(letters[0].Error, "abandoned") {
		t.Errorf("error %q does not say the request was abandoned", letters[0].Error)
	}
}
