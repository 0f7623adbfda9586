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
	const ackWait = time.Second
	ctx, js, cons := trackerConsumer(t, ackWait)
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

// What has lapsed is not counted as this courier's when a pin comes back
// (fetcher.checkPin): JetStream may have delivered it to the courier that
// had the pin meanwhile, and the consumer counts that delivery as out.
func TestTrackerCountsWhatLapsed(t *testing.T) {
	ctx, js, cons := trackerConsumer(t, 0)
	for _, subj := range []string{"s.a", "s.b", "s.c"} {
		if _, err := js.Publish(ctx, subj, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := cons.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != 3 {
		t.Fatalf("fetched %d messages, want 3", len(msgs))
	}
	tr := newTracker(time.Minute, time.Now, func() {})
	for _, m := range msgs {
		tr.add(m)
	}
	var moved atomic.Bool
	tr.lapse(msgs[0], moved.Load)
	tr.lapse(msgs[1], func() bool { return false }) // sent before the pin moved
	if n := tr.lapsedOf(nil); n != 0 {
		t.Fatalf("%d lapsed while the pin is this courier's, want 0", n)
	}
	moved.Store(true)
	if n := tr.lapsedOf(nil); n != 1 {
		t.Errorf("%d lapsed once the pin moved, want 1", n)
	}
	tr.remove(msgs[0])
	if n := tr.lapsedOf(nil); n != 0 {
		t.Errorf("%d lapsed once the lapsed one was given back, want 0", n)
	}
	if n := tr.lapsedOf(new(atomic.Int64)); n != 0 {
		t.Errorf("%d lapsed of a partition none of them is of, want 0", n)
	}
}

// trackerConsumer starts a server with stream S (subjects s.>) and its
// durable c, explicit acks, with ackWait (0: the server's).
func trackerConsumer(t *testing.T, ackWait time.Duration) (context.Context, jetstream.JetStream, jetstream.Consumer) {
	t.Helper()
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, js, cons
}
