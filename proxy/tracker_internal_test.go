package proxy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
)

// A message whose key's line was handed on (the pin moved away) before it
// was sent is no longer kept in progress: JetStream redelivers it within an
// ack wait, to the courier pinned now, which awaits it that long. Until
// then it is kept as every held message is.
func TestTrackerLetsALapsedMessageGo(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	const ackWait = time.Second
	cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s.a", []byte("x")); err != nil {
		t.Fatal(err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	tr := newTracker(ackWait, time.Now, func() {})
	tr.add(m)
	var lapsed atomic.Bool
	tr.lapse(m, lapsed.Load)
	go tr.run(ctx)

	if again, err := cons.Next(jetstream.FetchMaxWait(3 * ackWait)); err == nil {
		t.Fatalf("redelivered while held and not lapsed (delivery %d)", deliveries(t, again))
	}
	lapsed.Store(true)
	again, err := cons.Next(jetstream.FetchMaxWait(3 * ackWait))
	if err != nil {
		t.Fatalf("not redelivered within three ack waits of lapsing: %v", err)
	}
	if n := deliveries(t, again); n != 2 {
		t.Errorf("redelivered as delivery %d, want 2", n)
	}
}

// deliveries is how many times m was delivered.
func deliveries(t *testing.T, m jetstream.Msg) uint64 {
	t.Helper()
	meta, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	return meta.NumDelivered
}
