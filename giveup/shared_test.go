package giveup_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/poll"
)

// Two couriers with the same consumer name (the default, "courier") on two
// streams, whose advisories one existing stream captures (an audit stream of
// every advisory): each catch must keep its own advisory consumer. Sharing
// one durable, the second Setup rewrote the first's filter: the first
// stream's advisories were no longer consumed, and the messages JetStream
// gave up on there never dead-lettered.
func TestGiveUpCatcherSharedCaptureTwoStreamsSameConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.LimitsPolicy)
	auditStream(t, e)
	// PAYMENTS, with a durable of the same name and its own DLQ.
	if _, err := e.js.CreateStream(ctx(t, 5*time.Second), jetstream.StreamConfig{
		Name: "PAYMENTS", Subjects: []string{"payments.>"}, AllowDirect: true,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.CreateOrUpdateConsumer(ctx(t, 5*time.Second), "PAYMENTS", jetstream.ConsumerConfig{
		Durable: consumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxDeliver: 2,
	}); err != nil {
		t.Fatal(err)
	}
	const paymentsDLQ = "dlq.PAYMENTS.courier"
	if _, _, err := dlq.EnsureStream(ctx(t, 5*time.Second), e.js, paymentsDLQ, 1); err != nil {
		t.Fatal(err)
	}
	payments, err := e.js.Stream(ctx(t, 5*time.Second), "PAYMENTS")
	if err != nil {
		t.Fatal(err)
	}

	start := func(src jetstream.Stream, dl giveup.DeadLetterer) {
		t.Helper()
		reg := prometheus.NewRegistry()
		c, err := giveup.New(e.js, src, consumer, dl, giveup.Options{Registerer: reg, AckWait: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Setup(ctx(t, 5*time.Second)); err != nil {
			t.Fatalf("Setup: %v", err)
		}
		(&catcher{Catcher: c, reg: reg}).run(t)
	}
	start(e.src, e.pub)                                  // ORDERS' catch first,
	start(payments, dlq.NewPublisher(e.js, paymentsDLQ)) // then PAYMENTS'

	seq := e.publish("orders.created", "lost?", nil)
	e.exhaust()
	poll.Until(t, 15*time.Second, "ORDERS' dead letter", func() bool { return len(e.deadLetters()) == 1 })
	checkLetter(t, e, e.deadLetters()[0], seq, "lost?", nil)
}

// In such a stream, an advisory consumer of the old name that already
// filters this consumer's advisories is kept: a new one would replay the
// advisories the old one handled.
func TestGiveUpCatcherSharedCaptureKeepsOldConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.LimitsPolicy)
	auditStream(t, e)
	if _, err := e.js.CreateOrUpdateConsumer(ctx(t, 5*time.Second), "AUDIT", jetstream.ConsumerConfig{
		Durable: giveup.ConsumerName(consumer), FilterSubject: giveup.AdvisorySubject("ORDERS", consumer),
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
	}); err != nil {
		t.Fatal(err)
	}
	c, err := giveup.New(e.js, e.src, consumer, e.pub, giveup.Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Setup(ctx(t, 5*time.Second)); err != nil {
		t.Fatalf("Setup: %v", err)
	}
	audit, err := e.js.Stream(ctx(t, 5*time.Second), "AUDIT")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range audit.ConsumerNames(ctx(t, 5*time.Second)).Name() {
		names = append(names, n)
	}
	if len(names) != 1 || names[0] != giveup.ConsumerName(consumer) {
		t.Errorf("consumers of AUDIT = %v, want only %s", names, giveup.ConsumerName(consumer))
	}
}

// auditStream creates AUDIT, an existing stream capturing every advisory
// (as an operator's audit stream would), which the catch then uses.
func auditStream(t *testing.T, e *env) {
	t.Helper()
	if _, err := e.js.CreateStream(ctx(t, 5*time.Second), jetstream.StreamConfig{
		Name: "AUDIT", Subjects: []string{"$JS.EVENT.ADVISORY.>"},
	}); err != nil {
		t.Fatal(err)
	}
}
