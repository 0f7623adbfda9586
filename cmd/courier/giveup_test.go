package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/poll"
)

// Messages JetStream gives up on outside courier's sight (README,
// "Dead letters", max-deliveries).
// "Courier killed on every attempt" is played by a plain client that pulls
// each delivery from courier's durable and never answers, as a killed
// courier would; the sidecars under test are real, in-process.

// giveUpEnv is courier's environment for these tests: two deliveries, a 1s
// ack wait, so JetStream gives up within seconds.
func giveUpEnv(h *harness, appURL string, extra ...string) []string {
	return h.env(appURL, append([]string{"COURIER_MAX_DELIVER=2", "COURIER_ACK_WAIT=1s"}, extra...)...)
}

// primeGiveUp runs courier once, so that its durable and the stream
// capturing its max-deliveries advisories exist, and stops it.
func primeGiveUp(t *testing.T, h *harness, environ []string) {
	t.Helper()
	c := start(t, environ)
	poll.Until(t, 10*time.Second, "the advisory consumer", func() bool { return h.advisoryConsumer() != nil })
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
}

// killEveryAttempt takes both deliveries of the next message from courier's
// durable and never acks them, like a courier killed during each attempt.
func (h *harness) killEveryAttempt() {
	h.t.Helper()
	for i := range 2 {
		if n := h.pullAndDrop(3 * time.Second); n != 1 {
			h.t.Fatalf("delivery %d: pulled %d messages, want 1", i+1, n)
		}
	}
}

// pullAndDrop pulls one message from courier's durable, waiting up to wait,
// and never acks it. It returns how many it got.
func (h *harness) pullAndDrop(wait time.Duration) int {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := h.js.Consumer(ctx, h.stream, "courier")
	if err != nil {
		h.t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(wait))
	if err != nil {
		h.t.Fatal(err)
	}
	n := 0
	for range batch.Messages() {
		n++
	}
	return n
}

// advisoryConsumer returns the state of courier's consumer of captured
// max-deliveries advisories, or nil.
func (h *harness) advisoryConsumer() *jetstream.ConsumerInfo {
	h.t.Helper()
	return h.consumerInfoOn(giveup.StreamName(h.stream, "courier"), giveup.ConsumerName("courier"))
}

// advisoriesCaptured returns how many advisories the capture stream holds.
func (h *harness) advisoriesCaptured() uint64 {
	h.t.Helper()
	return h.streamMsgsOf(giveup.StreamName(h.stream, "courier"))
}

// advisoriesSettled reports whether every captured advisory was handled.
func (h *harness) advisoriesSettled() bool {
	info := h.advisoryConsumer()
	return info != nil && info.NumPending == 0 && info.NumAckPending == 0
}

// original returns whether the stream still holds seq.
func (h *harness) original(seq uint64) bool {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := h.js.Stream(ctx, h.stream)
	if err != nil {
		h.t.Fatal(err)
	}
	_, err = s.GetMsg(ctx, seq)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		h.t.Fatal(err)
	}
	return err == nil
}

var giveUpHeaders = map[string]string{
	"Content-Type": "application/json",
	"X-Tenant":     "acme",
	"Nats-Msg-Id":  "order-77",
}

const giveUpBody = "{\"id\":77}\x00 and binary"

// checkMaxDeliveries checks that the DLQ holds exactly one dead letter, the
// max-deliveries one of seq, published with giveUpHeaders and giveUpBody.
func checkMaxDeliveries(t *testing.T, h *harness, seq uint64) {
	t.Helper()
	dls := h.deadLetters(dlqSubject)
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	dl := dls[0]
	if string(dl.Data) != giveUpBody {
		t.Errorf("dead letter body = %q, want %q", dl.Data, giveUpBody)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := h.js.Stream(ctx, h.stream)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		dlq.HeaderReason:   dlq.ReasonMaxDeliveries,
		dlq.HeaderAttempts: "2",
		dlq.HeaderSubject:  "orders.created",
		dlq.HeaderStream:   h.stream,
		dlq.HeaderSequence: strconv.FormatUint(seq, 10),
		dlq.HeaderConsumer: "courier",
		// The id the delivery loop would give this message's dead letter:
		// one original, one dead letter, whoever stores it.
		"Nats-Msg-Id": dlq.MsgID(dlq.Letter{Consumer: "courier", Stream: h.stream,
			StreamCreated: s.CachedInfo().Created, Sequence: seq}),
		"Courier-Original-Nats-Msg-Id": "order-77",
		"Content-Type":                 "application/json",
		"X-Tenant":                     "acme",
	}
	for k, v := range want {
		if got := dl.Header.Get(k); got != v {
			t.Errorf("dead letter %s = %q, want %q", k, got, v)
		}
	}
	if got := dl.Header.Get(dlq.HeaderError); !strings.Contains(got, "gave up after 2 deliveries") {
		t.Errorf("dead letter %s = %q", dlq.HeaderError, got)
	}
	if dl.Header.Get(dlq.HeaderStatus) != "" {
		t.Errorf("dead letter %s = %q, want none (the app never answered)", dlq.HeaderStatus, dl.Header.Get(dlq.HeaderStatus))
	}
	// The original's headers as published: nothing of the server's.
	orig := dlq.Original(dl.Header)
	if len(orig) != len(giveUpHeaders) {
		t.Errorf("original headers = %v, want %v", orig, giveUpHeaders)
	}
	for k, v := range giveUpHeaders {
		if got := orig.Get(k); got != v {
			t.Errorf("original header %s = %q, want %q", k, got, v)
		}
	}
}

// The advisory fires while courier is down: it is captured, and dead-lettered
// once courier starts.
func TestGiveUpAdvisoryFiredWhileCourierDown(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	environ := giveUpEnv(h, a.URL)
	primeGiveUp(t, h, environ)

	seq := h.publish("orders.created", giveUpBody, giveUpHeaders)
	h.killEveryAttempt()
	// The server gives up when it would deliver the message again: here
	// to another client's pull, while no courier runs.
	if n := h.pullAndDrop(3 * time.Second); n != 0 {
		t.Fatalf("pulled %d messages after the last delivery, want none", n)
	}
	poll.Until(t, 10*time.Second, "the advisory captured", func() bool { return h.advisoriesCaptured() == 1 })
	if n := len(h.deadLetters(dlqSubject)); n != 0 {
		t.Fatalf("%d dead letters while courier was down", n)
	}

	c := start(t, environ)
	poll.Until(t, 15*time.Second, "the dead letter", func() bool { return len(h.deadLetters(dlqSubject)) == 1 })
	poll.Until(t, 10*time.Second, "the advisory handled", h.advisoriesSettled)
	checkMaxDeliveries(t, h, seq)
	if n := a.count(); n != 0 {
		t.Errorf("the app received %d requests, want none", n)
	}
	admin := adminAddr(t, c)
	if v := metricstest.Value(t, metrics(admin), "courier_giveup_advisories_total", "result", "dead_lettered"); v != 1 {
		t.Errorf("courier_giveup_advisories_total{result=dead_lettered} = %v, want 1", v)
	}
	// Counted with every other dead letter, by reason.
	if v := metricstest.Value(t, metrics(admin), "courier_dead_letters_total", "reason", "max-deliveries"); v != 1 {
		t.Errorf(`courier_dead_letters_total{reason="max-deliveries"} = %v, want 1`, v)
	}
	if err := c.stop(); err != nil {
		t.Errorf("courier: %v", err)
	}
}

// Courier killed on every attempt, then running again: the server gives up
// on the message while courier is up, and courier dead-letters it without
// calling the app. On a work-queue stream the original is then removed; on a
// limits stream it stays.
func TestGiveUpWhileCourierRuns(t *testing.T) {
	tests := []struct {
		name      string
		retention jetstream.RetentionPolicy
		removed   bool
	}{
		{"limits", jetstream.LimitsPolicy, false},
		{"work queue", jetstream.WorkQueuePolicy, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, func(sc *jetstream.StreamConfig) { sc.Retention = tt.retention })
			a := newApp(t, nil)
			environ := giveUpEnv(h, a.URL)
			primeGiveUp(t, h, environ)

			seq := h.publish("orders.created", giveUpBody, giveUpHeaders)
			h.killEveryAttempt()
			start(t, environ)
			poll.Until(t, 15*time.Second, "the dead letter", func() bool { return len(h.deadLetters(dlqSubject)) == 1 })
			poll.Until(t, 10*time.Second, "the advisory handled", h.advisoriesSettled)
			checkMaxDeliveries(t, h, seq)
			if n := a.count(); n != 0 {
				t.Errorf("the app received %d requests, want none", n)
			}
			if tt.removed {
				poll.Until(t, 15*time.Second, "the original removed", func() bool { return !h.original(seq) })
			} else if !h.original(seq) {
				t.Errorf("original removed from a %s stream", tt.name)
			}

			// The catch does not stop the delivery loop: a fresh message
			// still reaches the app.
			h.publish("orders.created", "fresh", nil)
			poll.Until(t, 10*time.Second, "the fresh message delivered", func() bool { return a.count() == 1 })
		})
	}
}

// Two couriers on one durable: one dead letter.
func TestGiveUpTwoCouriersOneDeadLetter(t *testing.T) {
	h := newHarness(t, func(sc *jetstream.StreamConfig) { sc.Retention = jetstream.WorkQueuePolicy })
	a := newApp(t, nil)
	primeGiveUp(t, h, giveUpEnv(h, a.URL))

	seq := h.publish("orders.created", giveUpBody, giveUpHeaders)
	h.killEveryAttempt()
	c1 := start(t, giveUpEnv(h, a.URL, "COURIER_DEDUP_DIR="+t.TempDir()))
	c2 := start(t, giveUpEnv(h, a.URL, "COURIER_DEDUP_DIR="+t.TempDir()))
	for _, c := range []*courier{c1, c2} {
		poll.Until(t, 10*time.Second, "both couriers catching advisories", func() bool {
			return len(logLines(c, "catching max-deliveries advisories")) == 1
		})
	}
	poll.Until(t, 15*time.Second, "the dead letter", func() bool { return len(h.deadLetters(dlqSubject)) == 1 })
	poll.Until(t, 10*time.Second, "the advisory handled", h.advisoriesSettled)
	poll.Until(t, 15*time.Second, "the original removed", func() bool { return !h.original(seq) })
	checkMaxDeliveries(t, h, seq)

	var total float64
	for _, c := range []*courier{c1, c2} {
		admin := adminAddr(t, c)
		total += metricstest.Value(t, metrics(admin), "courier_giveup_advisories_total", "result", "dead_lettered") +
			metricstest.Value(t, metrics(admin), "courier_giveup_advisories_total", "result", "duplicate")
	}
	if total != 1 {
		t.Errorf("advisories dead-lettered across both couriers = %v, want 1", total)
	}
	if n := a.count(); n != 0 {
		t.Errorf("the app received %d requests, want none", n)
	}
}

// A message the app rejects, too large to copy into its dead letter, on a
// work-queue stream: its reference dead letter is stored and the original
// kept. Its redelivery is not sent to the app, and when JetStream gives up
// on it the catch, asking the delivery loop, stores no second dead letter
// (the DLQ's duplicate window, here shorter than the wait, would not stop
// one) and leaves the original in place for replay.
func TestGiveUpReferenceDeadLetterNotStoredTwice(t *testing.T) {
	h := newHarness(t, func(c *jetstream.StreamConfig) { c.Retention = jetstream.WorkQueuePolicy })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := h.js.CreateStream(ctx, jetstream.StreamConfig{Name: "DEAD", Subjects: []string{dlqSubject},
		Storage: jetstream.FileStorage, Duplicates: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	a := newApp(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusBadRequest) })
	start(t, giveUpEnv(h, a.URL))

	// The largest body the server accepts, less a little: any envelope
	// pushes its dead letter over max_payload.
	seq := h.publish("orders.created", strings.Repeat("x", int(h.nc.MaxPayload())-64), nil)
	poll.Until(t, 15*time.Second, "the advisory handled", func() bool {
		info := h.advisoryConsumer()
		return info != nil && info.Delivered.Consumer >= 1 && info.NumPending == 0 && info.NumAckPending == 0
	})
	dls := h.deadLetters(dlqSubject)
	if len(dls) != 1 || dls[0].Header.Get(dlq.HeaderBody) != dlq.BodyOmittedTooLarge {
		t.Errorf("%d dead letters, want the one reference dead letter", len(dls))
	}
	if n := a.count(); n != 1 {
		t.Errorf("the app received %d requests, want 1", n)
	}
	if !h.original(seq) {
		t.Error("the original of the reference dead letter was removed from its work-queue stream")
	}
}

// A max-deliveries advisory published by someone other than the server,
// naming a message courier is delivering (the app has it), dead-letters
// nothing while courier is; once the app has answered 2xx (its key
// recorded), it dead-letters nothing either: the message was processed. Its
// idempotency key is longer than the dedup store holds as it is: the catch
// finds the key in the form the delivery loop recorded it.
func TestGiveUpForgedAdvisoryOfProcessedMessage(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	a := newApp(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		<-release
		w.WriteHeader(http.StatusOK)
	})
	answer := sync.OnceFunc(func() { close(release) })
	t.Cleanup(answer) // before the app closes, which waits for its requests
	c := start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "the advisory consumer", func() bool { return h.advisoryConsumer() != nil })
	admin := adminAddr(t, c)
	advisories := func(result string) float64 {
		return metricstest.Value(t, metrics(admin), "courier_giveup_advisories_total", "result", result)
	}

	key := strings.Repeat("k", 300)
	seq := h.publish("orders.created", "processed", map[string]string{"Idempotency-Key": key})
	poll.Until(t, 10*time.Second, "the app has the message", func() bool { return a.count() == 1 })
	forged, err := json.Marshal(map[string]any{
		"type": giveup.AdvisoryType, "id": "forged", "timestamp": time.Now(),
		"stream": h.stream, "consumer": "courier", "stream_seq": seq, "deliveries": 5,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.nc.Publish(giveup.AdvisorySubject(h.stream, "courier"), forged); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 15*time.Second, "the advisory handled again, twice", func() bool { return advisories("retry") >= 2 })
	if n := len(h.deadLetters(dlqSubject)); n != 0 {
		t.Fatalf("%d dead letters of a message the app has, want none", n)
	}

	answer()
	poll.Until(t, 15*time.Second, "the advisory settled as processed", func() bool { return advisories("processed") == 1 })
	poll.Until(t, 10*time.Second, "the advisory handled", h.advisoriesSettled)
	if n := len(h.deadLetters(dlqSubject)); n != 0 {
		t.Errorf("%d dead letters of a processed message, want none", n)
	}
	if n := a.count(); n != 1 {
		t.Errorf("the app received %d requests, want 1", n)
	}
}
