package consumerstats_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/courierhq/courier/consumerstats"
	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/natstest"
)

func TestCollector(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable: "courier", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := js.Publish(ctx, "orders.created", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(consumerstats.New(cons, consumerstats.Options{CacheFor: time.Nanosecond}))

	expect(t, reg, 3, 0, 0)

	// One delivered and NAK'd, then delivered again: redelivered, not
	// acked; one delivered, not acked.
	first := fetch(t, cons)
	// A NAK sent as a request is answered once the server processed it
	// (as DoubleAck does for an ack): the next fetch gets it back.
	if _, err := js.Conn().Request(first.Reply(), []byte("-NAK"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	again := fetch(t, cons)
	if md, _ := again.Metadata(); md.NumDelivered != 2 {
		t.Fatalf("second fetch delivered %d times, want the NAK'd message again", md.NumDelivered)
	}
	fetch(t, cons)
	expect(t, reg, 1, 2, 1)

	// No sample while the consumer cannot be asked.
	if err := js.DeleteConsumer(ctx, "ORDERS", "courier"); err != nil {
		t.Fatal(err)
	}
	fresh := prometheus.NewRegistry()
	fresh.MustRegister(consumerstats.New(cons, consumerstats.Options{}))
	if n, err := testutil.GatherAndCount(fresh); err != nil || n != 0 {
		t.Errorf("%d samples for a deleted consumer (%v), want none", n, err)
	}
}

func fetch(t *testing.T, cons jetstream.Consumer) jetstream.Msg {
	t.Helper()
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		return m
	}
	t.Fatalf("fetch: no message (%v)", batch.Error())
	return nil
}

// expect checks the three gauges gathered from reg, each labelled with the
// stream and the consumer, and that reg serves nothing else.
func expect(t *testing.T, reg *prometheus.Registry, pending, ackPending, redelivered float64) {
	t.Helper()
	want := map[string]float64{
		"courier_consumer_pending_messages":     pending,
		"courier_consumer_ack_pending_messages": ackPending,
		"courier_consumer_redelivered_messages": redelivered,
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != len(want) {
		t.Errorf("%d series gathered (%v), want %d", n, err, len(want))
	}
	for name, v := range want {
		v2, ok := metricstest.Lookup(t, reg, name, "stream", "ORDERS", "consumer", "courier")
		if !ok || v2 != v {
			t.Errorf("%s{stream=\"ORDERS\",consumer=\"courier\"} = %v (served %v), want %v", name, v2, ok, v)
		}
	}
}
