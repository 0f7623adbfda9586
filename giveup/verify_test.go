package giveup_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/verdict"
)

// A max-deliveries advisory published by someone other than the server
// (anyone allowed to publish on its subject can) dead-letters nothing: the
// consumer's state says it did not give up on the message. On a work-queue
// stream it would also have removed the message before the app got it.
func TestGiveUpCatcherRefusesForgedAdvisory(t *testing.T) {
	t.Parallel()
	for _, retention := range []jetstream.RetentionPolicy{jetstream.WorkQueuePolicy, jetstream.LimitsPolicy} {
		t.Run(retention.String(), func(t *testing.T) {
			e := newEnv(t, retention)
			c := e.newCatcher(nil).run(t)
			seq := e.publish("orders.created", "not yet delivered", nil)
			e.sendAdvisory(advisoryJSON(seq, 2, time.Now()))
			poll.Until(t, 15*time.Second, "the advisory refused", func() bool { return c.handled(giveup.ResultRefused) == 1 })
			poll.Until(t, 15*time.Second, "the advisory settled", e.settled)
			if n := len(e.deadLetters()); n != 0 {
				t.Errorf("%d dead letters, want none", n)
			}
			if !e.originalExists(seq) {
				t.Error("the message was removed from its stream")
			}
			if n := c.handled(giveup.ResultDeadLettered) + c.handled(giveup.ResultDuplicate); n != 0 {
				t.Errorf("dead_lettered+duplicate = %d, want 0", n)
			}

			// The message then delivered and given up on by the server
			// is dead-lettered as ever.
			e.exhaust()
			poll.Until(t, 15*time.Second, "the dead letter", func() bool { return len(e.deadLetters()) == 1 })
			checkLetter(t, e, e.deadLetters()[0], seq, "not yet delivered", nil)
		})
	}
}

// An advisory naming a message the consumer was never handed (not of its
// filter subjects), or naming a consumer without a delivery limit, is
// refused too, though the consumer has delivered past its sequence.
func TestGiveUpCatcherRefusesAdvisoryOfMessageNotOfConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.WorkQueuePolicy)
	if _, err := e.js.CreateOrUpdateConsumer(ctx(t, 5*time.Second), "ORDERS", jetstream.ConsumerConfig{
		Durable: consumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxDeliver: 2,
		FilterSubject: "orders.created",
	}); err != nil {
		t.Fatal(err)
	}
	c := e.newCatcher(nil).run(t)
	other := e.publish("orders.paid", "another consumer's", nil)
	mine := e.publish("orders.created", "mine", nil)
	cons, err := e.js.Consumer(ctx(t, 5*time.Second), "ORDERS", consumer)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if meta, _ := m.Metadata(); meta == nil || meta.Sequence.Stream != mine {
			t.Fatalf("fetched %v, want sequence %d", meta, mine)
		}
		_ = m.Ack()
	}
	e.sendAdvisory(advisoryJSON(other, 2, time.Now()))
	poll.Until(t, 15*time.Second, "the advisory refused", func() bool { return c.handled(giveup.ResultRefused) == 1 })

	// Without a delivery limit the server gives up on nothing.
	if _, err := e.js.CreateOrUpdateConsumer(ctx(t, 5*time.Second), "ORDERS", jetstream.ConsumerConfig{
		Durable: consumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxDeliver: -1,
	}); err != nil {
		t.Fatal(err)
	}
	e.sendAdvisory(advisoryJSON(other, 2, time.Now()))
	poll.Until(t, 15*time.Second, "the second advisory refused", func() bool { return c.handled(giveup.ResultRefused) == 2 })
	poll.Until(t, 15*time.Second, "the advisories settled", e.settled)
	if n := len(e.deadLetters()); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
	if !e.originalExists(other) {
		t.Error("another consumer's message was removed from the work queue")
	}
}

// openStore opens a dedup store (Badger) in a temporary directory, closed
// when the test ends.
func openStore(t *testing.T) *dedup.Store {
	t.Helper()
	s, err := dedup.Open(t.TempDir(), dedup.Options{TTL: time.Hour, Scope: "ORDERS/courier"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// deliverOnce pulls the next message from durable "courier" and returns
// it, not acked: courier has it.
func (e *env) deliverOnce() jetstream.Msg {
	e.t.Helper()
	cons, err := e.js.Consumer(ctx(e.t, 5*time.Second), "ORDERS", consumer)
	if err != nil {
		e.t.Fatal(err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(3 * time.Second))
	if err != nil {
		e.t.Fatalf("next: %v", err)
	}
	return m
}

// A forged advisory naming a message courier processed (its idempotency
// key recorded in the dedup store) dead-letters nothing, though the
// consumer delivered the message: on a limits stream it was acked and
// stays; on a work-queue stream its ack was lost (else it would be gone),
// and it is removed, as the ack would have. The key is the one the
// delivery loop records: the idempotency header's, the Nats-Msg-Id, or one
// derived from the stream and sequence. A message the server then gives up
// on is dead-lettered as ever.
func TestGiveUpCatcherRefusesAdvisoryOfProcessedMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		hdr  nats.Header
		key  func(e *env, seq uint64) string
	}{
		{"idempotency header", nats.Header{"Idempotency-Key": {"pay-7"}, "Nats-Msg-Id": {"order-7"}},
			func(*env, uint64) string { return "pay-7" }},
		{"Nats-Msg-Id", nats.Header{"Nats-Msg-Id": {"order-7"}}, func(*env, uint64) string { return "order-7" }},
		{"derived", nil, func(e *env, seq uint64) string {
			return dlq.DerivedKey("ORDERS", e.src.CachedInfo().Created, seq)
		}},
	}
	for _, retention := range []jetstream.RetentionPolicy{jetstream.WorkQueuePolicy, jetstream.LimitsPolicy} {
		for _, tt := range tests {
			t.Run(retention.String()+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, retention)
				store := openStore(t)
				c := e.newCatcher(nil, func(o *giveup.Options) {
					o.Dedup, o.IdempotencyHeader = store, "Idempotency-Key"
				}).run(t)
				seq := e.publish("orders.created", "processed", tt.hdr)
				m := e.deliverOnce()
				if err := store.Record(ctx(t, 5*time.Second), tt.key(e, seq)); err != nil {
					t.Fatal(err)
				}
				if retention == jetstream.LimitsPolicy {
					if err := m.DoubleAck(ctx(t, 5*time.Second)); err != nil {
						t.Fatal(err)
					}
				}
				e.sendAdvisory(advisoryJSON(seq, 2, time.Now()))
				poll.Until(t, 15*time.Second, "the advisory settled as processed", func() bool { return c.handled(giveup.ResultProcessed) == 1 })
				poll.Until(t, 15*time.Second, "the advisory settled", e.settled)
				if n := len(e.deadLetters()); n != 0 {
					t.Errorf("%d dead letters of a processed message, want none", n)
				}
				if kept := e.originalExists(seq); kept != (retention == jetstream.LimitsPolicy) {
					t.Errorf("original still in its %s stream: %v", retention, kept)
				}

				// One not processed, which the server gives up on.
				other := e.publish("orders.created", "given up", nil)
				e.exhaust()
				poll.Until(t, 15*time.Second, "the dead letter", func() bool { return len(e.deadLetters()) == 1 })
				checkLetter(t, e, e.deadLetters()[0], other, "given up", nil)
			})
		}
	}
}

// An advisory naming a message the delivery loop is still delivering
// (Options.Delivering) dead-letters nothing while it is: it is handled
// again later. The server may have given up on the message meanwhile (its
// ack wait lapsed on its last delivery while courier held it): once the
// delivery loop is done with it, the message is dead-lettered, unless its
// key was recorded, when nothing is. The advisory is never lost.
func TestGiveUpCatcherWaitsForMessageBeingDelivered(t *testing.T) {
	t.Parallel()
	for _, processed := range []bool{false, true} {
		t.Run(fmt.Sprint("processed=", processed), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, jetstream.WorkQueuePolicy)
			store := openStore(t)
			var seq atomic.Uint64
			var delivering atomic.Bool
			delivering.Store(true)
			c := e.newCatcher(nil, func(o *giveup.Options) {
				o.Dedup = store
				o.Delivering = func(s uint64) bool { return s == seq.Load() && delivering.Load() }
			}).run(t)
			seq.Store(e.publish("orders.created", "held", nil))
			e.deliverOnce()
			e.sendAdvisory(advisoryJSON(seq.Load(), 2, time.Now())) // before the server gave up
			e.exhaustDelivered(1)                                   // and its own, as it gives up
			poll.Until(t, 15*time.Second, "both advisories handled again, twice each", func() bool {
				return c.handled(giveup.ResultRetry) >= 4 && e.captured() == 2
			})
			if n := len(e.deadLetters()); n != 0 {
				t.Fatalf("%d dead letters of a message being delivered, want none", n)
			}
			if !e.originalExists(seq.Load()) {
				t.Fatal("the message being delivered was removed from its work-queue stream")
			}

			if processed {
				if err := store.Record(ctx(t, 5*time.Second), dlq.DerivedKey("ORDERS", e.src.CachedInfo().Created, seq.Load())); err != nil {
					t.Fatal(err)
				}
			}
			delivering.Store(false)
			poll.Until(t, 15*time.Second, "the advisories settled", e.settled)
			// The first settles the message; the second finds it gone from
			// the work queue.
			if n := c.handled(giveup.ResultGone); n != 1 {
				t.Errorf("gone = %d, want 1", n)
			}
			if e.originalExists(seq.Load()) {
				t.Error("original still in its work-queue stream")
			}
			if processed {
				if n := len(e.deadLetters()); n != 0 {
					t.Errorf("%d dead letters of a processed message, want none", n)
				}
				if n := c.handled(giveup.ResultProcessed); n != 1 {
					t.Errorf("processed = %d, want 1", n)
				}
				return
			}
			if n := len(e.deadLetters()); n != 1 {
				t.Fatalf("%d dead letters, want 1", n)
			}
			checkLetter(t, e, e.deadLetters()[0], seq.Load(), "held", nil)
			if n := c.handled(giveup.ResultDeadLettered); n != 1 {
				t.Errorf("dead_lettered = %d, want 1", n)
			}
		})
	}
}

// With the shared dedup store, an advisory naming a message whose key
// another replica's delivery claims is handled again later; once that
// replica records the key, nothing is dead-lettered.
func TestGiveUpCatcherWaitsForAnotherReplicasDelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.LimitsPolicy)
	shared := func() *dedup.Shared {
		local := openStore(t)
		var s *dedup.Shared
		natstest.Try(t, "OpenShared", func(ctx context.Context) error {
			var err error
			s, err = dedup.OpenShared(ctx, e.js, local, dedup.SharedOptions{TTL: time.Hour, Scope: "ORDERS/courier"})
			return err
		})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	mine, other := shared(), shared()
	c := e.newCatcher(nil, func(o *giveup.Options) { o.Dedup = mine }).run(t)
	seq := e.publish("orders.created", "elsewhere", nats.Header{"Nats-Msg-Id": {"order-9"}})
	m := e.deliverOnce()
	if v, err := other.Check(ctx(t, 5*time.Second), "order-9"); err != nil || v != verdict.New {
		t.Fatalf("the other replica's claim: %v, %v", v, err)
	}
	e.sendAdvisory(advisoryJSON(seq, 2, time.Now()))
	poll.Until(t, 15*time.Second, "the advisory handled again, twice", func() bool { return c.handled(giveup.ResultRetry) >= 2 })
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters of a message another replica is delivering, want none", n)
	}
	if err := other.Record(ctx(t, 5*time.Second), "order-9"); err != nil {
		t.Fatal(err)
	}
	if err := m.DoubleAck(ctx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 15*time.Second, "the advisory settled as processed", func() bool { return c.handled(giveup.ResultProcessed) == 1 })
	poll.Until(t, 15*time.Second, "the advisory settled", e.settled)
	if n := len(e.deadLetters()); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}
