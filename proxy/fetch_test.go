package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

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

	poll.Until(t, 10*time.Second, "the queue filled", func() bool {
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
	poll.Until(t, 10*time.Second, "every message delivered", func() bool { return e.calls.Load() == n && e.settled(t) })
}

// An operator lowers the consumer's pull limit while courier runs: the
// refused pulls make courier re-read the consumer and pull within the new
// limit, without a restart.
func TestPullLimitLoweredWhileRunning(t *testing.T) {
	e := setup(t)
	r, _ := e.runWith(t, nil, proxy.Options{AckWait: 5 * time.Second, InfoInterval: time.Hour})
	poll.Until(t, 10*time.Second, "the consumer bound", func() bool { return r.Ready() == nil })
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: 5, AckWait: 5 * time.Second, MaxRequestBatch: 3})
	const n = 30
	e.publish(t, n, []byte("x"))
	poll.Until(t, 10*time.Second, "every message delivered within the new limit", func() bool { return e.calls.Load() == n && e.settled(t) })
}

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
	poll.Until(t, 10*time.Second, "bound", func() bool { return r.Ready() == nil })
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
