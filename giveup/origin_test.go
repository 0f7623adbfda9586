package giveup_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/partition"
)

// A message of the partitions' work stream that JetStream gives up on is
// dead-lettered as the message it copies (the same subject, stream,
// sequence, consumer and Nats-Msg-Id as without partitions), and its copy
// is removed from the work stream; the stream courier consumes keeps it.
func TestGiveUpCatcherWorkStream(t *testing.T) {
	e := newEnv(t, jetstream.LimitsPolicy)
	cfg, err := partition.StreamConfig(partition.StreamOptions{Source: e.src.CachedInfo().Config, Consumer: consumer, Token: 2, Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	work, _, err := partition.EnsureStream(ctx(t, 5*time.Second), e.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	part, err := e.js.CreateOrUpdateConsumer(ctx(t, 5*time.Second), cfg.Name, jetstream.ConsumerConfig{
		Durable: partition.ConsumerName(consumer, 0), FilterSubject: partition.FilterSubject(0),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxDeliver: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := giveup.New(e.js, work, giveup.AllConsumers, e.pub, giveup.Options{
		RetryInitial: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond, AckWait: 2 * time.Second,
		Registerer: prometheus.NewRegistry(), Origin: &giveup.Origin{Stream: e.src.CachedInfo(), Consumer: consumer},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Setup(ctx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	(&catcher{Catcher: c, t: t}).run(t)

	hdr := nats.Header{"Content-Type": {"application/json"}, "Nats-Msg-Id": {"order-7"}}
	seq := e.publish("orders.created", `{"id":7}`, hdr)
	poll.Until(t, 10*time.Second, "the message copied into the work stream", func() bool {
		info, err := work.Info(ctx(t, 5*time.Second))
		return err == nil && info.State.Msgs == 1
	})
	for i := range 3 { // every delivery taken, none acked; the last pull finds none
		batch, err := part.Fetch(1, jetstream.FetchMaxWait(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for range batch.Messages() {
			n++
		}
		if want := min(1, 2-i); n != want {
			t.Fatalf("fetch %d got %d messages, want %d", i+1, n, want)
		}
	}
	poll.Until(t, 15*time.Second, "the dead letter", func() bool { return len(e.deadLetters()) == 1 })
	checkLetter(t, e, e.deadLetters()[0], seq, `{"id":7}`, hdr)
	poll.Until(t, 15*time.Second, "the copy removed from the work stream", func() bool {
		info, err := work.Info(ctx(t, 5*time.Second))
		return err == nil && info.State.Msgs == 0
	})
	if !e.originalExists(seq) {
		t.Error("the original is gone from the stream courier consumes")
	}
}

// AllConsumers goes with a work stream's Origin, and only with it.
func TestGiveUpAllConsumersNeedsOrigin(t *testing.T) {
	e := newEnv(t, jetstream.LimitsPolicy)
	if _, err := giveup.New(e.js, e.src, giveup.AllConsumers, e.pub, giveup.Options{}); err == nil {
		t.Error("New with AllConsumers and no Origin succeeded")
	}
	if _, err := giveup.New(e.js, e.src, consumer, e.pub, giveup.Options{Origin: &giveup.Origin{Stream: e.src.CachedInfo(), Consumer: consumer}}); err == nil {
		t.Error("New with Origin for one consumer succeeded")
	}
}
