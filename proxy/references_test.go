package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// A permanent failure is dead-lettered at once, with no retry.
// On a work-queue stream, a message too large to copy into its dead letter
// is stored as a reference dead letter and its original is not terminated
// (a Term would remove the body the dead letter refers to). It must not be
// sent to the app again on any redelivery: not by this runner, nor (the
// mark in the dedup store) by a runner started again on the same store or,
// with the shared store, another replica on an empty disk. Its
// redeliveries are given back until JetStream's budget is spent, and it
// stays in its stream with one dead letter.
//
// The DLQ's duplicate window is shorter than BackoffMax, so a second
// rejection would store a second dead letter; an app that accepts a later
// request would have a redelivery ack the original away.
func TestReferenceDeadLetterIsNotSentAgain(t *testing.T) {
	t.Parallel()
	type stores struct {
		first, second func(t *testing.T, js jetstream.JetStream) proxy.Deduper
	}
	none := func(*testing.T, jetstream.JetStream) proxy.Deduper { return nil }
	badgerDir := func(dir *string) func(*testing.T, jetstream.JetStream) proxy.Deduper {
		return func(t *testing.T, _ jetstream.JetStream) proxy.Deduper {
			if *dir == "" {
				*dir = t.TempDir()
			}
			s, err := dedup.Open(*dir, dedup.Options{TTL: time.Hour, Scope: "S/c"})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	shared := func(t *testing.T, js jetstream.JetStream) proxy.Deduper {
		local, err := dedup.Open(t.TempDir(), dedup.Options{TTL: time.Hour, Scope: "S/c"})
		if err != nil {
			t.Fatal(err)
		}
		var sh *dedup.Shared
		natstest.Try(t, "OpenShared", func(ctx context.Context) error {
			sh, err = dedup.OpenShared(ctx, js, local, dedup.SharedOptions{TTL: time.Hour, Scope: "S/c"})
			return err
		})
		return sh
	}
	var dir string
	for _, tc := range []struct {
		name string
		stores
		acceptLater bool // the app accepts any request after the first
		// backoffMax outlasts the first runner's shutdown (up to a pull's
		// wait, 1s) where a second one takes the redeliveries.
		backoffMax time.Duration
	}{
		{"dedup off, the app rejecting each time", stores{first: none}, false, 200 * time.Millisecond},
		{"dedup off, the app accepting later", stores{first: none}, true, 200 * time.Millisecond},
		{"badger store, runner started again", stores{first: badgerDir(&dir), second: badgerDir(&dir)}, true, 2 * time.Second},
		{"shared store, another replica on an empty disk", stores{first: shared, second: shared}, true, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testReferenceNotSentAgain(t, tc.first, tc.second, tc.acceptLater, tc.backoffMax)
		})
	}
}

func testReferenceNotSentAgain(t *testing.T, first, second func(*testing.T, jetstream.JetStream) proxy.Deduper, acceptLater bool, backoffMax time.Duration) {
	const maxDeliver = 3
	s := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = 8192 }})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"},
		Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	dlqStream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DLQ", Subjects: []string{"dlq.s"},
		Storage: jetstream.FileStorage, Duplicates: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "c",
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: maxDeliver, AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 || !acceptLater {
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	t.Cleanup(app.Close)
	ack, err := js.Publish(ctx, "s.big", make([]byte, 8000))
	if err != nil {
		t.Fatal(err)
	}

	run := func(dd proxy.Deduper) (*prometheus.Registry, func()) {
		reg := prometheus.NewRegistry()
		r, err := proxy.New(cons, dlq.NewPublisher(js, "dlq.s"), dd, proxy.Options{
			AppURL: app.URL, Stream: "S", Consumer: "c", MaxDeliver: maxDeliver, AckWait: 5 * time.Second,
			BackoffInitial: 50 * time.Millisecond, BackoffMax: backoffMax, Registerer: reg,
			MaxPayload: 8192, // the server's, as the sidecar passes it
		})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = r.Run(runCtx); close(done) }()
		var once sync.Once
		stop := func() {
			once.Do(func() {
				cancel()
				<-done
				if c, ok := dd.(interface{ Close() error }); ok {
					_ = c.Close()
				}
			})
		}
		t.Cleanup(stop)
		return reg, stop
	}

	reg, stop := run(first(t, js))
	poll.Until(t, 10*time.Second, "the large message dead-lettered", func() bool {
		return counter(t, reg, "courier_dead_letters_total", dlq.ReasonRejected) >= 1
	})
	regs := []*prometheus.Registry{reg}
	if second != nil {
		stop()
		reg, _ = run(second(t, js))
		regs = append(regs, reg)
	}
	// Settled: JetStream's budget spent (or, were the app called again,
	// the message acked).
	poll.Until(t, maxDeliver*backoffMax+10*time.Second, "the message settled", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && (info.Delivered.Consumer >= maxDeliver || calls.Load() > 1)
	})

	if got := calls.Load(); got != 1 {
		t.Errorf("the app was sent a rejected message %d times, want 1", got)
	}
	info, err := dlqStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("%d dead letters stored, want 1", info.State.Msgs)
	}
	total := 0.0
	for _, reg := range regs {
		total += counter(t, reg, "courier_dead_letters_total", dlq.ReasonRejected)
	}
	if total != 1 {
		t.Errorf("%v dead letters counted, want 1", total)
	}
	src, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.GetMsg(ctx, ack.Sequence); err != nil {
		t.Errorf("the original of the reference dead letter is no longer in its stream: %v", err)
	}
}

// A message near the server's max_payload can still be dead-lettered (the
// envelope's headers would push a copy over the limit): a dead letter that
// refers to the original is stored, and the only worker goes on to the next
// message.
func TestMessageNearMaxPayloadIsDeadLettered(t *testing.T) {
	s := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = 8192 }})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	streams(t, js)
	cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5})
	if err != nil {
		t.Fatal(err)
	}
	var ok atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > 1000 {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		ok.Add(1)
	}))
	t.Cleanup(app.Close)
	if _, err := js.Publish(ctx, "s.big", make([]byte, 8000)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := js.Publish(ctx, "s.small", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	r, err := proxy.New(cons, dlq.NewPublisher(js, "dlq.s"), nil, proxy.Options{
		AppURL: app.URL, Stream: "S", Consumer: "c", MaxInflight: 1, Registerer: reg, TermKeepsMessage: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	poll.Until(t, 10*time.Second, "the messages behind the large one delivered", func() bool { return ok.Load() == 3 })
	poll.Until(t, 10*time.Second, "the large message dead-lettered", func() bool {
		return counter(t, reg, "courier_dead_letters_total", dlq.ReasonRejected) == 1
	})
	q, err := dlq.Open(ctx, js, "dlq.s")
	if err != nil {
		t.Fatal(err)
	}
	letters, err := q.List(ctx, dlq.Selection{})
	if err != nil || len(letters) != 1 {
		t.Fatalf("dead letters: %d, %v", len(letters), err)
	}
}
