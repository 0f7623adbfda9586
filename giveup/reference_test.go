package giveup_test

import (
	"context"
	"errors"
	"net/textproto"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

// envelopeSize is the wire size of h as nats.go encodes it.
func envelopeSize(h nats.Header) int {
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(textproto.TrimString(v)) + 4
		}
	}
	return n
}

// The delivery loop stored a reference dead letter (its envelope, with the
// app's error, was too large to carry the body) and left the original in
// its work-queue stream, where replay reads the body. JetStream then gives
// up on the original and its max-deliveries advisory is handled within the
// DLQ's duplicate window: the catcher's own, smaller envelope fits with the
// body, the DLQ calls it a duplicate of the reference dead letter, and the
// original must still be kept, for the stored dead letter has no body.
func TestGiveUpCatcherDuplicateOfReferenceKeepsOriginal(t *testing.T) {
	t.Parallel()
	const maxPayload = 8192
	srv := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = maxPayload }})
	_, js := natstest.Connect(t, srv)
	e := newEnvOn(t, srv, js, jetstream.WorkQueuePolicy)

	seq := storeLoopReference(t, e, maxPayload, 2)

	c := e.newCatcher(nil).run(t)
	e.exhaust()
	poll.Until(t, 15*time.Second, "the advisory handled", func() bool {
		return c.handled(giveup.ResultDuplicate)+c.handled(giveup.ResultDeadLettered) > 0
	})
	poll.Until(t, 15*time.Second, "the advisory acked", e.settled)

	dls := e.deadLetters()
	if len(dls) != 1 || dls[0].Header.Get(dlq.HeaderBody) != dlq.BodyOmittedTooLarge {
		t.Fatalf("%d dead letters, want the one reference dead letter", len(dls))
	}
	if !e.originalExists(seq) {
		t.Error("original removed from its work-queue stream, though its only dead letter does not carry its body: the body is lost")
	}
}

// The delivery loop stored a reference dead letter of a message and left
// the original in its work-queue stream, marked (proxy.Runner's
// ReferenceStored). JetStream gives up on the original after the DLQ's
// duplicate window, where the dead letter's Nats-Msg-Id no longer stops a
// second one: the catcher stores none (its own envelope would fit with the
// body, and then it would remove the original), counts the advisory as a
// duplicate and keeps the original. A mark that cannot be read at first has
// the advisory handled again, not dead-lettered blind.
func TestGiveUpCatcherMarkedReferenceNoSecondLetter(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = 8192 }})
	_, js := natstest.Connect(t, srv)
	// A duplicate window far shorter than the time JetStream takes to give
	// up (two ack waits).
	if _, err := js.CreateStream(ctx(t, 5*time.Second), jetstream.StreamConfig{
		Name: dlq.StreamName(dlqSubject), Subjects: []string{dlqSubject}, Storage: jetstream.FileStorage,
		Duplicates: 100 * time.Millisecond,
	}); err != nil {
		t.Fatal(err)
	}
	e := newEnvOn(t, srv, js, jetstream.WorkQueuePolicy)

	seq := storeLoopReference(t, e, 8192, 1)

	var asked, stored atomic.Int32
	c := e.newCatcher(nil, func(o *giveup.Options) {
		o.ReferenceStored = func(_ context.Context, s uint64) (bool, error) {
			if asked.Add(1) == 1 {
				return false, errors.New("dedup store unavailable")
			}
			return s == seq, nil
		}
		o.OnDeadLetter = func() { stored.Add(1) }
	}).run(t)
	e.exhaust()
	poll.Until(t, 15*time.Second, "the advisory handled", func() bool {
		return c.handled(giveup.ResultDuplicate)+c.handled(giveup.ResultDeadLettered) > 0
	})
	poll.Until(t, 15*time.Second, "the advisory acked", e.settled)

	if got := c.handled(giveup.ResultRetry); got != 1 {
		t.Errorf("advisory handled again %d times after the mark could not be read, want 1", got)
	}
	if got := c.handled(giveup.ResultDuplicate); got != 1 {
		t.Errorf("%d advisories counted as duplicates, want 1", got)
	}
	if got := stored.Load(); got != 0 {
		t.Errorf("%d dead letters counted by the catcher, want 0", got)
	}
	if dls := e.deadLetters(); len(dls) != 1 || dls[0].Header.Get(dlq.HeaderBody) != dlq.BodyOmittedTooLarge {
		t.Errorf("%d dead letters, want the one reference dead letter", len(dls))
	}
	if !e.originalExists(seq) {
		t.Error("original removed from its work-queue stream, though its only dead letter does not carry its body")
	}
}

// storeLoopReference publishes a message whose body fits in a dead letter
// with the catcher's envelope but not with the delivery loop's (a 400 with
// a long error, after attempts), and stores the delivery loop's dead letter
// of it: a reference, without the body. It returns the message's sequence.
func storeLoopReference(t *testing.T, e *env, maxPayload, attempts int) uint64 {
	t.Helper()
	longest := time.Date(2025, 6, 1, 12, 0, 0, 123456789, time.UTC) // the longest RFC 3339 form
	base := dlq.Letter{
		Subject: "orders.created", Stream: "ORDERS", StreamCreated: e.src.CachedInfo().Created,
		Sequence: 1, Consumer: consumer, Published: longest, FailedAt: longest,
	}
	catcherLetter := base
	catcherLetter.Reason, catcherLetter.Attempts = dlq.ReasonMaxDeliveries, 2
	catcherLetter.Error = "JetStream gave up after 2 deliveries without an ack (ack wait expired each time)"
	body := strings.Repeat("x", maxPayload-envelopeSize(dlq.Envelope(catcherLetter))-20)

	seq := e.publish("orders.created", body, nil)
	orig, err := e.src.GetMsg(ctx(t, 5*time.Second), seq)
	if err != nil {
		t.Fatal(err)
	}
	loop := base
	loop.Sequence, loop.Published, loop.Data = seq, orig.Time, orig.Data
	loop.Reason, loop.Status, loop.Attempts = dlq.ReasonRejected, 400, attempts
	loop.Error = strings.Repeat("e", 1000)
	if err := e.pub.DeadLetter(ctx(t, 5*time.Second), loop); !errors.Is(err, dlq.ErrBodyOmitted) {
		t.Fatalf("delivery loop's dead letter = %v, want stored as a reference", err)
	}
	return seq
}
