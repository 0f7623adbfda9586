package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/proxy"
)

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
	waitFor(t, "the first message sent", func() bool { return e.calls.Load() == 1 })
	time.Sleep(100 * time.Millisecond) // the second reaches the limiter
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
