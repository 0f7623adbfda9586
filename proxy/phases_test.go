package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// An app that answered 2xx acted: if the grace period ends while courier is
// still reading the rest of that answer, the message must be acked, not given
// back for a second delivery.
func TestGraceEndingWhileReading2xxBodyStillAcks(t *testing.T) {
	e := setup(t)
	answered := make(chan struct{}, 1)
	release := make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok, and more to come"))
		w.(http.Flusher).Flush()
		answered <- struct{}{}
		select { // a slow tail to the answer
		case <-release:
		case <-time.After(5 * time.Second):
		}
	}))
	defer func() { close(release); app.Close() }()
	r, err := proxy.New(e.cons, dlq.NewPublisher(e.js, "dlq.s"), nil, proxy.Options{
		AppURL: app.URL, Stream: "S", Consumer: "c", MaxDeliver: 5, AckWait: 5 * time.Second,
		ShutdownGrace: 300 * time.Millisecond, Registerer: e.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	if _, err := e.js.Publish(context.Background(), "s.x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("app never called")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the 2xx'd message acked", func() bool { return e.settled(t) })
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
	poll.Until(t, 10*time.Second, "the first message sent", func() bool { return e.calls.Load() > 0 })
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
	poll.Until(t, 10*time.Second, "the request sent", func() bool { return e.calls.Load() == 1 })
	began := time.Now()
	stop()
	if took := time.Since(began); took > 3*time.Second {
		t.Errorf("stopping with no grace took %s: the running request was waited for", took)
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
	poll.Until(t, 10*time.Second, "the request sent", func() bool { return e.calls.Load() == 1 })
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

// A message on its last allowed delivery is sent within the grace period
// rather than given back (JetStream would give up on a NAK'd one without
// the app having seen it). If the grace period ends while it still waits for
// the rate limit, it was never sent: it is dead-lettered as not attempted,
// as giveBack does, not NAK'd for JetStream to give up on.
func TestLastDeliveryWaitingForRateLimitAtShutdownIsDeadLettered(t *testing.T) {
	e := setup(t)
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: 1, AckWait: 5 * time.Second})
	// One request per 20s: the first goes at once, the second waits.
	_, stop := e.runWith(t, nil, proxy.Options{MaxDeliver: 1, MaxInflight: 2, MaxRate: 0.05,
		ShutdownGrace: 300 * time.Millisecond})
	e.publish(t, 2, []byte("x"))
	poll.Until(t, 10*time.Second, "the first message sent", func() bool { return e.calls.Load() == 1 })
	// The second is fetched: on its last delivery it is sent within the
	// grace period, so it waits for the limiter whenever stop comes.
	poll.Until(t, 10*time.Second, "both messages fetched", func() bool {
		info, err := e.cons.Info(context.Background())
		// Delivered to courier, the first acked or not.
		return err == nil && info.Delivered.Stream == 2 && info.NumPending == 0
	})
	stop()
	if got := e.calls.Load(); got != 1 {
		t.Fatalf("app called %d times, want 1", got)
	}
	if got := counter(t, e.reg, "courier_messages_total", "released"); got != 0 {
		t.Errorf("%v messages NAK'd on their last delivery without the app having seen them", got)
	}
	q, err := dlq.Open(context.Background(), e.js, "dlq.s")
	if err != nil {
		t.Fatal(err)
	}
	letters, err := q.List(context.Background(), dlq.Selection{})
	if err != nil || len(letters) != 1 {
		t.Fatalf("dead letters: %d, %v; want the unsent message's", len(letters), err)
	}
	if got := letters[0].Reason; got != dlq.ReasonNotAttempted {
		t.Errorf("reason %q, want %q", got, dlq.ReasonNotAttempted)
	}
}
