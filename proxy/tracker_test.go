package proxy_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// The in-progress signals follow the consumer's ack wait on the server, not
// courier's own setting: in a rollout that lowers it, an old instance would
// otherwise signal too late and its in-flight messages reach the app twice.
func TestInProgressFollowsServerAckWait(t *testing.T) {
	e := setup(t)
	e.slowApp(t, 2500*time.Millisecond)
	// courier believes 30s; the server is changed to 1s once it runs.
	_, _ = e.runWith(t, nil, proxy.Options{AckWait: 30 * time.Second, InfoInterval: 100 * time.Millisecond, MaxInflight: 2})
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: 5, AckWait: time.Second})
	// Nothing outside the runner shows that it re-read the consumer: let
	// three InfoIntervals pass (real time passing is what the re-read needs).
	time.Sleep(300 * time.Millisecond)
	e.publish(t, 2, []byte("x"))
	poll.Until(t, 10*time.Second, "both messages acked", func() bool { return e.settled(t) && e.calls.Load() >= 2 })
	if got := e.calls.Load(); got != 2 {
		t.Errorf("app called %d times for 2 messages: the ack wait expired under a running request", got)
	}
}
