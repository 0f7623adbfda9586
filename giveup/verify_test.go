package giveup_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/poll"
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
