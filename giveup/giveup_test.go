package giveup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
)

const (
	dlqSubject = "dlq.ORDERS.courier"
	consumer   = "courier"
)

// ctx returns a context that ends with the test, or after d.
func ctx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return c
}

// env is a server with stream ORDERS, its durable "courier" (ack wait 1s,
// two deliveries) and a DLQ stream.
type env struct {
	t   *testing.T
	srv *server.Server
	js  jetstream.JetStream
	src jetstream.Stream
	pub *dlq.Publisher
}

func newEnv(t *testing.T, retention jetstream.RetentionPolicy) *env {
	t.Helper()
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	return newEnvOn(t, srv, js, retention)
}

// newEnvOn sets up env's streams and consumer on srv through js.
func newEnvOn(t *testing.T, srv *server.Server, js jetstream.JetStream, retention jetstream.RetentionPolicy) *env {
	t.Helper()
	if _, err := js.CreateStream(ctx(t, 5*time.Second), jetstream.StreamConfig{
		Name: "ORDERS", Subjects: []string{"orders.>"}, Retention: retention, AllowDirect: true,
	}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx(t, 5*time.Second), "ORDERS", jetstream.ConsumerConfig{
		Durable: consumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxDeliver: 2,
	}); err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	if _, _, err := dlq.EnsureStream(ctx(t, 5*time.Second), js, dlqSubject, 1); err != nil {
		t.Fatalf("dlq stream: %v", err)
	}
	src, err := js.Stream(ctx(t, 5*time.Second), "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, srv: srv, js: js, src: src, pub: dlq.NewPublisher(js, dlqSubject)}
}

// catcher is a Catcher set up and its registry.
type catcher struct {
	*giveup.Catcher
	t    testing.TB
	reg  *prometheus.Registry
	stop func()
}

// newCatcher creates and sets up a Catcher (adjust changes its options);
// it does not run it.
func (e *env) newCatcher(dl giveup.DeadLetterer, adjust ...func(*giveup.Options)) *catcher {
	e.t.Helper()
	if dl == nil {
		dl = e.pub
	}
	reg := prometheus.NewRegistry()
	o := giveup.Options{
		RetryInitial: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond, AckWait: 2 * time.Second,
		Registerer: reg,
	}
	for _, f := range adjust {
		f(&o)
	}
	c, err := giveup.New(e.js, e.src, consumer, dl, o)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	if err := c.Setup(ctx(e.t, 5*time.Second)); err != nil {
		e.t.Fatalf("Setup: %v", err)
	}
	return &catcher{Catcher: c, t: e.t, reg: reg, stop: func() {}}
}

// run runs c until the test ends (or stop), failing the test if Run errs.
func (c *catcher) run(t *testing.T) *catcher {
	t.Helper()
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	var once sync.Once
	c.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("Run did not return within 15s of its context ending")
			}
		})
	}
	t.Cleanup(c.stop)
	return c
}

// handled returns courier_giveup_advisories_total{result} of c (every
// result is served from the start, at 0).
func (c *catcher) handled(result string) int {
	c.t.Helper()
	return int(metricstest.Value(c.t, c.reg, "courier_giveup_advisories_total", "result", result))
}

// publish stores a message on ORDERS and returns its sequence.
func (e *env) publish(subject, body string, hdr nats.Header) uint64 {
	e.t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(body)
	for k, v := range hdr {
		m.Header[k] = v
	}
	ack, err := e.js.PublishMsg(ctx(e.t, 5*time.Second), m)
	if err != nil {
		e.t.Fatalf("publish: %v", err)
	}
	return ack.Sequence
}

// exhaust takes every delivery of the next message from durable "courier"
// and never acks it, like a courier killed during each attempt, then pulls
// once more. nats-server v2.15.2 sends the max-deliveries advisory when it
// would redeliver the message to a waiting pull request (its ack-wait timer
// path counts one delivery short): the last pull is what courier's delivery
// loop does when it runs again.
func (e *env) exhaust() { e.exhaustDelivered(0) }

// exhaustDelivered is exhaust for a message delivered n times already.
func (e *env) exhaustDelivered(n int) {
	e.t.Helper()
	cons, err := e.js.Consumer(ctx(e.t, 5*time.Second), "ORDERS", consumer)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := n; i < 3; i++ {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(3*time.Second))
		if err != nil {
			e.t.Fatalf("fetch %d: %v", i+1, err)
		}
		got := 0
		for range batch.Messages() {
			got++
		}
		if want := min(1, 2-i); got != want {
			e.t.Fatalf("fetch %d got %d messages (%v), want %d", i+1, got, batch.Error(), want)
		}
	}
}

// deadLetters returns what the DLQ stream holds.
func (e *env) deadLetters() []*jetstream.RawStreamMsg {
	e.t.Helper()
	s, err := e.js.Stream(ctx(e.t, 5*time.Second), dlq.StreamName(dlqSubject))
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(ctx(e.t, 5*time.Second))
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		if m, err := s.GetMsg(ctx(e.t, 5*time.Second), seq); err == nil {
			out = append(out, m)
		}
	}
	return out
}

// captured returns how many advisories the advisory stream holds.
func (e *env) captured() uint64 {
	e.t.Helper()
	s, err := e.js.Stream(ctx(e.t, 5*time.Second), giveup.StreamName("ORDERS", consumer))
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(ctx(e.t, 5*time.Second))
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

// advisoryConsumer returns the state of the advisory consumer.
func (e *env) advisoryConsumer() *jetstream.ConsumerInfo {
	e.t.Helper()
	c, err := e.js.Consumer(ctx(e.t, 5*time.Second), giveup.StreamName("ORDERS", consumer), giveup.ConsumerName(consumer))
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := c.Info(ctx(e.t, 5*time.Second))
	if err != nil {
		e.t.Fatal(err)
	}
	return info
}

// settled reports whether every advisory was acked or terminated.
func (e *env) settled() bool {
	info := e.advisoryConsumer()
	return info.NumPending == 0 && info.NumAckPending == 0
}

// sendAdvisory publishes a hand-made advisory on the captured subject.
func (e *env) sendAdvisory(data []byte) {
	e.t.Helper()
	nc := e.js.Conn()
	if err := nc.Publish(giveup.AdvisorySubject("ORDERS", consumer), data); err != nil {
		e.t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
}

func advisoryJSON(seq, deliveries uint64, at time.Time) []byte {
	b, _ := json.Marshal(map[string]any{
		"type": giveup.AdvisoryType, "id": fmt.Sprint("test-", seq), "timestamp": at,
		"stream": "ORDERS", "consumer": consumer, "stream_seq": seq, "deliveries": deliveries,
	})
	return b
}

// originalExists reports whether ORDERS still holds seq.
func (e *env) originalExists(seq uint64) bool {
	e.t.Helper()
	_, err := e.src.GetMsg(ctx(e.t, 5*time.Second), seq)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		e.t.Fatal(err)
	}
	return err == nil
}

func TestGiveUpCatcherDeadLetters(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		retention jetstream.RetentionPolicy
		removed   bool
	}{
		{"limits", jetstream.LimitsPolicy, false},
		{"work queue", jetstream.WorkQueuePolicy, true},
		{"interest", jetstream.InterestPolicy, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.retention)
			c := e.newCatcher(nil).run(t)
			hdr := nats.Header{
				"Content-Type":         {"application/json"},
				"X-Tenant":             {"acme", "second"},
				"Nats-Msg-Id":          {"order-7"},
				"Nats-Expected-Stream": {"ORDERS"},
			}
			seq := e.publish("orders.created", `{"id":7}`, hdr)
			e.exhaust()

			poll.Until(t, 15*time.Second, "the dead letter", func() bool { return len(e.deadLetters()) == 1 })
			poll.Until(t, 15*time.Second, "the advisory acked", e.settled)
			dl := e.deadLetters()[0]
			checkLetter(t, e, dl, seq, `{"id":7}`, hdr)
			if got := e.originalExists(seq); got == tt.removed {
				t.Errorf("original still in the stream: %v, want %v", got, !tt.removed)
			}
			if n := c.handled(giveup.ResultDeadLettered); n != 1 {
				t.Errorf("dead_lettered = %d, want 1", n)
			}
		})
	}
}

// checkLetter checks a max-deliveries dead letter of seq.
func checkLetter(t *testing.T, e *env, dl *jetstream.RawStreamMsg, seq uint64, body string, hdr nats.Header) {
	t.Helper()
	if string(dl.Data) != body {
		t.Errorf("dead letter body = %q, want %q", dl.Data, body)
	}
	info, err := e.src.Info(ctx(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		dlq.HeaderReason:   dlq.ReasonMaxDeliveries,
		dlq.HeaderAttempts: "2",
		dlq.HeaderSubject:  "orders.created",
		dlq.HeaderStream:   "ORDERS",
		dlq.HeaderSequence: strconv.FormatUint(seq, 10),
		dlq.HeaderConsumer: consumer,
		"Nats-Msg-Id": dlq.MsgID(dlq.Letter{Consumer: consumer, Stream: "ORDERS",
			StreamCreated: info.Created, Sequence: seq}),
	}
	for k, v := range want {
		if got := dl.Header.Get(k); got != v {
			t.Errorf("dead letter %s = %q, want %q", k, got, v)
		}
	}
	if got := dl.Header.Get(dlq.HeaderError); !strings.Contains(got, "gave up after 2 deliveries") {
		t.Errorf("dead letter %s = %q", dlq.HeaderError, got)
	}
	if _, err := time.Parse(time.RFC3339Nano, dl.Header.Get(dlq.HeaderPublished)); err != nil {
		t.Errorf("dead letter %s = %q: %v", dlq.HeaderPublished, dl.Header.Get(dlq.HeaderPublished), err)
	}
	// The original's headers, exactly as published: none of the server's
	// direct-get headers.
	orig := dlq.Original(dl.Header)
	if len(orig) != len(hdr) {
		t.Errorf("original headers = %v, want %v", orig, hdr)
	}
	for k, v := range hdr {
		if !slices.Equal(orig[k], v) {
			t.Errorf("original header %s = %q, want %q", k, orig[k], v)
		}
	}
}

func TestGiveUpCatcherAdvisoryFiredWhileDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.LimitsPolicy)
	c := e.newCatcher(nil) // set up (capturing), not running
	seq := e.publish("orders.created", "late", nil)
	e.exhaust()
	poll.Until(t, 15*time.Second, "the advisory captured", func() bool { return e.captured() == 1 })
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters before the catcher ran", n)
	}
	c.run(t)
	poll.Until(t, 15*time.Second, "the dead letter", func() bool { return len(e.deadLetters()) == 1 })
	checkLetter(t, e, e.deadLetters()[0], seq, "late", nil)
	poll.Until(t, 15*time.Second, "the advisory acked", e.settled)
}

func TestGiveUpCatcherTwoReplicasOneDeadLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.LimitsPolicy)
	a := e.newCatcher(nil).run(t)
	b := e.newCatcher(nil).run(t)
	seq := e.publish("orders.created", "twice", nil)
	// The same advisory three times (as a server would send it again if
	// an ack were lost): the real one and two copies.
	e.exhaust()
	adv := advisoryJSON(seq, 2, time.Now().Add(time.Minute))
	e.sendAdvisory(adv)
	e.sendAdvisory(adv)
	poll.Until(t, 15*time.Second, "three advisories handled", func() bool {
		total := 0
		for _, c := range []*catcher{a, b} {
			total += c.handled(giveup.ResultDeadLettered) + c.handled(giveup.ResultDuplicate)
		}
		return total == 3
	})
	poll.Until(t, 15*time.Second, "the advisories acked", e.settled)
	if n := len(e.deadLetters()); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
	if n := a.handled(giveup.ResultDeadLettered) + b.handled(giveup.ResultDeadLettered); n != 1 {
		t.Errorf("dead_lettered = %d across replicas, want 1", n)
	}
}

func TestGiveUpCatcherNothingToDeadLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.LimitsPolicy)
	c := e.newCatcher(nil).run(t)
	// A sequence the stream never held.
	e.sendAdvisory(advisoryJSON(999, 2, time.Now()))
	// A message stored after the advisory fired: the stream was created
	// again, and the sequence is another message.
	seq := e.publish("orders.created", "newer", nil)
	e.sendAdvisory(advisoryJSON(seq, 2, time.Now().Add(-time.Hour)))
	poll.Until(t, 10*time.Second, "two advisories gone", func() bool { return c.handled(giveup.ResultGone) == 2 })
	poll.Until(t, 15*time.Second, "the advisories acked", e.settled)
	if n := len(e.deadLetters()); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}

func TestGiveUpCatcherMalformed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.LimitsPolicy)
	c := e.newCatcher(nil).run(t)
	seq := e.publish("orders.created", "x", nil)
	wrongType, _ := json.Marshal(map[string]any{"type": "io.nats.jetstream.advisory.v1.nak", "stream": "ORDERS", "consumer": consumer, "stream_seq": seq})
	wrongConsumer, _ := json.Marshal(map[string]any{"type": giveup.AdvisoryType, "stream": "ORDERS", "consumer": "other", "stream_seq": seq})
	noSeq, _ := json.Marshal(map[string]any{"type": giveup.AdvisoryType, "stream": "ORDERS", "consumer": consumer})
	for _, data := range [][]byte{[]byte("not json"), wrongType, wrongConsumer, noSeq} {
		e.sendAdvisory(data)
	}
	poll.Until(t, 10*time.Second, "four advisories terminated", func() bool { return c.handled(giveup.ResultMalformed) == 4 })
	poll.Until(t, 15*time.Second, "the advisories settled", e.settled)
	if n := len(e.deadLetters()); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}

// A message JetStream gave up on that is too large to dead-letter with its
// body is dead-lettered as a reference, and left in its work-queue stream,
// where replay reads it, rather than removed (issue #17.2).
func TestGiveUpCatcherTooLargeKeepsOriginal(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = 8192 }})
	_, js := natstest.Connect(t, srv)
	e := newEnvOn(t, srv, js, jetstream.WorkQueuePolicy)
	c := e.newCatcher(nil).run(t)
	seq := e.publish("orders.created", strings.Repeat("x", 8000), nats.Header{"Content-Type": {"text/plain"}})
	e.exhaust()

	poll.Until(t, 15*time.Second, "the dead letter", func() bool { return len(e.deadLetters()) == 1 })
	poll.Until(t, 15*time.Second, "the advisory acked", e.settled)
	dl := e.deadLetters()[0]
	if len(dl.Data) != 0 || dl.Header.Get(dlq.HeaderBody) != dlq.BodyOmittedTooLarge || dl.Header.Get(dlq.HeaderSequence) != strconv.FormatUint(seq, 10) {
		t.Errorf("dead letter: %d bytes of body, %s=%q, %s=%q; want a reference to sequence %d", len(dl.Data),
			dlq.HeaderBody, dl.Header.Get(dlq.HeaderBody), dlq.HeaderSequence, dl.Header.Get(dlq.HeaderSequence), seq)
	}
	if !e.originalExists(seq) {
		t.Error("original removed from its work-queue stream, though its dead letter does not carry its body")
	}
	if n := c.handled(giveup.ResultDeadLettered); n != 1 {
		t.Errorf("dead_lettered = %d, want 1", n)
	}
}

// flaky fails its first n publishes.
type flaky struct {
	dl    giveup.DeadLetterer
	fails atomic.Int32
}

func (f *flaky) DeadLetter(ctx context.Context, l dlq.Letter) error {
	if f.fails.Add(-1) >= 0 {
		return errors.New("dlq down")
	}
	return f.dl.DeadLetter(ctx, l)
}

func TestGiveUpCatcherRetriesUntilStored(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.WorkQueuePolicy)
	f := &flaky{dl: e.pub}
	f.fails.Store(3)
	c := e.newCatcher(f).run(t)
	seq := e.publish("orders.created", "kept", nil)
	e.exhaust()
	poll.Until(t, 15*time.Second, "the dead letter", func() bool { return len(e.deadLetters()) == 1 })
	poll.Until(t, 15*time.Second, "the advisory acked", e.settled)
	if n := c.handled(giveup.ResultRetry); n != 3 {
		t.Errorf("retry = %d, want 3", n)
	}
	if e.originalExists(seq) {
		t.Errorf("original still in the work-queue stream")
	}
}

func TestGiveUpCatcherKeepsOriginalUntilStored(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.WorkQueuePolicy)
	f := &flaky{dl: e.pub}
	f.fails.Store(1 << 30) // never stores
	c := e.newCatcher(f).run(t)
	seq := e.publish("orders.created", "kept", nil)
	e.exhaust()
	poll.Until(t, 15*time.Second, "a few failed tries", func() bool { return c.handled(giveup.ResultRetry) >= 3 })
	c.stop()
	if !e.originalExists(seq) {
		t.Errorf("original removed although its dead letter was never stored")
	}
	if info := e.advisoryConsumer(); uint64(info.NumAckPending)+info.NumPending != 1 {
		t.Errorf("advisory consumer: %d pending, %d ack pending; want the advisory kept", info.NumPending, info.NumAckPending)
	}
}

func TestGiveUpCatcherRunStops(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.LimitsPolicy)
	reg := prometheus.NewRegistry()
	c, err := giveup.New(e.js, e.src, consumer, e.pub, giveup.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(ctx(t, time.Second)); err == nil {
		t.Errorf("Run before Setup succeeded")
	}
	if err := c.Setup(ctx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := c.Setup(ctx(t, 5*time.Second)); err != nil {
		t.Errorf("Setup again: %v", err)
	}
	rctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	began := time.Now()
	if err := c.Run(rctx); err != nil {
		t.Errorf("Run: %v", err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("Run took %s to stop", took)
	}
	if _, err := giveup.New(e.js, e.src, consumer, e.pub, giveup.Options{Registerer: reg}); err == nil {
		t.Errorf("New registered its metrics twice on one registry")
	}
}

// With the permissions of a user limited to courier's own stream, the
// advisories cannot be acked: the log says what to grant.
func TestGiveUpCatcherAckDenied(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "admin", Password: "pw"},
			{Username: "app", Password: "pw", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{"$JS.API.>", "$JS.ACK.ORDERS.>", dlqSubject}},
			}},
		}
	}})
	connect := func(user string) jetstream.JetStream {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	e := newEnvOn(t, srv, connect("admin"), jetstream.LimitsPolicy)
	js := connect("app")
	src, err := js.Stream(ctx(t, 5*time.Second), "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	var logs testlog.Buffer
	reg := prometheus.NewRegistry()
	c, err := giveup.New(js, src, consumer, dlq.NewPublisher(js, dlqSubject), giveup.Options{
		Registerer: reg, StepTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Setup(ctx(t, 5*time.Second)); err != nil {
		t.Fatalf("Setup: %v", err)
	}
	(&catcher{Catcher: c, reg: reg}).run(t)
	e.publish("orders.created", "x", nil)
	e.exhaust()
	want := "grant courier's user publish to $JS.ACK." + giveup.StreamName("ORDERS", consumer) + ".>"
	poll.Until(t, 15*time.Second, "the error naming the grant", func() bool { return strings.Contains(logs.String(), want) })
	if n := len(e.deadLetters()); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
}

func TestGiveUpOptionsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.LimitsPolicy)
	tests := []struct {
		o     giveup.Options
		field string
	}{
		{giveup.Options{Replicas: -1}, "Replicas"},
		{giveup.Options{MaxAge: -time.Hour}, "MaxAge"},
		{giveup.Options{AckWait: -time.Second}, "AckWait"},
		{giveup.Options{RetryInitial: -time.Second}, "RetryInitial"},
		{giveup.Options{RetryMax: -time.Second}, "RetryMax"},
		{giveup.Options{StepTimeout: -time.Second}, "StepTimeout"},
		{giveup.Options{RetryInitial: time.Minute, RetryMax: time.Second}, "RetryMax"},
	}
	for _, tt := range tests {
		_, err := giveup.New(e.js, e.src, consumer, e.pub, tt.o)
		if err == nil || !strings.Contains(err.Error(), "Options."+tt.field) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tt.o, err, tt.field)
		}
	}
}

// A deleted advisory consumer is created again by Run, which goes on
// dead-lettering.
func TestGiveUpCatcherRecreatesConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.LimitsPolicy)
	e.newCatcher(nil).run(t)
	advisories := giveup.StreamName("ORDERS", consumer)
	poll.Until(t, 15*time.Second, "the catch pulling", func() bool { return e.advisoryConsumer().NumWaiting > 0 })
	if err := e.js.DeleteConsumer(ctx(t, 5*time.Second), advisories, giveup.ConsumerName(consumer)); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 15*time.Second, "the advisory consumer created again", func() bool {
		_, err := e.js.Consumer(ctx(t, 5*time.Second), advisories, giveup.ConsumerName(consumer))
		return err == nil
	})
	e.publish("orders.created", "after", nil)
	e.exhaust()
	poll.Until(t, 15*time.Second, "the dead letter", func() bool { return len(e.deadLetters()) == 1 })
}
