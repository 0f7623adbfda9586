package partition

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
)

// ordersStream starts a server and creates ORDERS (orders.>, limits
// retention) with n messages of n keys (orders.k<i>.e).
func ordersStream(t *testing.T, n int) (jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	src, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := js.Publish(ctx, fmt.Sprintf("orders.k%d.e", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	return js, src
}

// logTo is a logger that writes JSON lines to b.
func logTo(b *testlog.Buffer) *slog.Logger { return slog.New(slog.NewJSONHandler(b, nil)) }

// A durable that exists on the stream from before partitions: the work
// stream Ensure creates starts after its ack floor, and says so; each
// partition's consumer is the template on the partition's subjects from
// its first message. A second Ensure creates nothing, says nothing, and
// keeps what Keep carries over (a pause) on the consumers that exist.
func TestEnsureAfterTheOldDurable(t *testing.T) {
	js, src := ordersStream(t, 5)
	ctx := context.Background()
	old, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := old.Fetch(2)
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var logs testlog.Buffer
	var kept []string
	o := EnsureOptions{Consumer: "c", Token: 2, Partitions: 4, Logger: logTo(&logs),
		Template: jetstream.ConsumerConfig{Durable: "c", Description: "the durable", AckPolicy: jetstream.AckExplicitPolicy,
			AckWait: 7 * time.Second, MaxDeliver: 5, DeliverPolicy: jetstream.DeliverNewPolicy, FilterSubjects: []string{"orders.>"}},
		Keep: func(want *jetstream.ConsumerConfig, have jetstream.ConsumerConfig) {
			kept = append(kept, have.Durable)
			want.PauseUntil = have.PauseUntil
		},
	}
	d, err := Ensure(ctx, js, src, o)
	if err != nil {
		t.Fatal(err)
	}
	work := d.Work.CachedInfo().Config
	if work.Name != StreamName("ORDERS", "c") || work.Sources[0].OptStartSeq != 3 {
		t.Errorf("work stream %s starting at %d, want %s at 3 (after the ack floor 2)", work.Name, work.Sources[0].OptStartSeq, StreamName("ORDERS", "c"))
	}
	poll.Until(t, 10*time.Second, "the 3 messages after the ack floor sourced", func() bool {
		info, err := d.Work.Info(ctx)
		return err == nil && info.State.Msgs == 3
	})
	if got := logs.String(); !strings.Contains(got, "starting after the ack floor of the durable it replaces") || !strings.Contains(got, `"after":2`) {
		t.Errorf("log %q does not say the work stream starts after the ack floor 2", got)
	}
	if len(d.Consumers) != 4 {
		t.Fatalf("%d consumers, want 4", len(d.Consumers))
	}
	for i, c := range d.Consumers {
		cc := c.CachedInfo().Config
		if cc.Durable != ConsumerName("c", i) || cc.FilterSubject != FilterSubject(i) || len(cc.FilterSubjects) != 0 ||
			cc.DeliverPolicy != jetstream.DeliverAllPolicy || cc.AckWait != 7*time.Second || cc.MaxDeliver != 5 || cc.Description != "the durable" {
			t.Errorf("partition %d's consumer: %+v, want the template named %s on %s from the first message", i, cc, ConsumerName("c", i), FilterSubject(i))
		}
	}
	if len(kept) != 0 {
		t.Errorf("Keep called for %v, with no consumer there", kept)
	}

	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	if _, err := js.PauseConsumer(ctx, work.Name, ConsumerName("c", 1), until); err != nil {
		t.Fatal(err)
	}
	before := logs.String()
	d, err = Ensure(ctx, js, src, o)
	if err != nil {
		t.Fatal(err)
	}
	if logs.String() != before {
		t.Errorf("the second Ensure logged %q", strings.TrimPrefix(logs.String(), before))
	}
	if len(kept) != 4 {
		t.Errorf("Keep called for %v, want the 4 consumers there", kept)
	}
	if p := d.Consumers[1].CachedInfo().Config.PauseUntil; p == nil || !p.Equal(until) {
		t.Errorf("partition 1 paused until %v after the second Ensure, want %v (kept)", p, until)
	}
}

// Without a durable from before, a new work stream starts at StartAt, and
// the log says it was created.
func TestEnsureStartAt(t *testing.T) {
	js, src := ordersStream(t, 3)
	var logs testlog.Buffer
	at := time.Now().UTC()
	d, err := Ensure(context.Background(), js, src, EnsureOptions{Consumer: "c", Token: 2, Partitions: 2, StartAt: at, Logger: logTo(&logs),
		Template: jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy}})
	if err != nil {
		t.Fatal(err)
	}
	source := d.Work.CachedInfo().Config.Sources[0]
	if source.OptStartTime == nil || !source.OptStartTime.Equal(at) || source.OptStartSeq != 0 {
		t.Errorf("work stream source starts at %v / sequence %d, want %v", source.OptStartTime, source.OptStartSeq, at)
	}
	if got := logs.String(); !strings.Contains(got, `"msg":"created the partitions' work stream"`) || strings.Contains(got, "ack floor") {
		t.Errorf("log %q, want the work stream created, no ack floor", got)
	}
}

// What Ensure cannot do fails for good, saying what it was doing, unless
// Transient says time fixes it: then the error is the server's as it came,
// for the caller's retry. A configuration StreamConfig refuses says so by
// itself.
func TestEnsureErrors(t *testing.T) {
	js, src := ordersStream(t, 0)
	ctx := context.Background()
	base := EnsureOptions{Consumer: "c", Token: 2, Partitions: 4, Template: jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy}}
	if _, err := Ensure(ctx, js, src, base); err != nil {
		t.Fatal(err)
	}
	// Partition 1's consumer made anew with a replay policy JetStream
	// cannot change.
	work := StreamName("ORDERS", "c")
	if err := js.DeleteConsumer(ctx, work, ConsumerName("c", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, work, jetstream.ConsumerConfig{Durable: ConsumerName("c", 1), FilterSubject: FilterSubject(1),
		AckPolicy: jetstream.AckExplicitPolicy, ReplayPolicy: jetstream.ReplayOriginalPolicy}); err != nil {
		t.Fatal(err)
	}
	wq, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WQ", Subjects: []string{"wq.>"}, Retention: jetstream.WorkQueuePolicy})
	if err != nil {
		t.Fatal(err)
	}
	transient := func(error) bool { return true }
	for _, tc := range []struct {
		name      string
		src       jetstream.Stream
		o         func(*EnsureOptions)
		want      string // the error's beginning
		apiError  bool   // the server's error, unwrapped
		transient bool
	}{
		{"work stream partitioned otherwise", src, func(o *EnsureOptions) { o.Partitions = 8 }, "COURIER_ORDER_PARTITIONS: the partitions' work stream " + work + " was made for 4 partitions", false, false},
		{"work stream partitioned otherwise, transient", src, func(o *EnsureOptions) { o.Partitions, o.Transient = 8, transient }, "the partitions' work stream " + work + " was made for 4 partitions", false, true},
		{"consumer refused", src, func(*EnsureOptions) {}, `cannot create or update consumer "c-p1" of partition 1 on stream "` + work + `": `, true, false},
		{"consumer refused, transient", src, func(o *EnsureOptions) { o.Transient = transient }, "nats: API error", true, true},
		{"stream refused", wq, func(o *EnsureOptions) { o.Transient = transient }, `stream "WQ" has WorkQueue retention`, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.o(&o)
			d, err := Ensure(ctx, js, tc.src, o)
			if err == nil || d != nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("Ensure: %v, %v; want an error beginning %q", d, err, tc.want)
			}
			var apiErr *jetstream.APIError
			if tc.apiError && !errors.As(err, &apiErr) {
				t.Errorf("%v does not carry the server's error", err)
			}
			if tc.transient && tc.apiError && err != error(apiErr) {
				t.Errorf("a transient error came wrapped: %v", err)
			}
		})
	}
}

// Find finds the work stream and the partitions' consumers Ensure made,
// and no other consumer there; nothing where there is no work stream, or where the one of that name
// copies another stream (stream names are upper-cased).
func TestFind(t *testing.T) {
	js, src := ordersStream(t, 0)
	ctx := context.Background()
	if d, err := Find(ctx, js, "ORDERS", "c"); d != nil || err != nil {
		t.Fatalf("Find before Ensure: %v, %v; want nothing", d, err)
	}
	if _, err := Ensure(ctx, js, src, EnsureOptions{Consumer: "c", Token: 2, Partitions: 3,
		Template: jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy}}); err != nil {
		t.Fatal(err)
	}
	// Another consumer on the work stream is not a partition's.
	if _, err := js.CreateConsumer(ctx, StreamName("ORDERS", "c"), jetstream.ConsumerConfig{Durable: "other", FilterSubject: "9.>",
		AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	d, err := Find(ctx, js, "ORDERS", "c")
	if err != nil || d == nil {
		t.Fatalf("Find: %v, %v", d, err)
	}
	if d.Work.CachedInfo().Config.Name != StreamName("ORDERS", "c") || len(d.Consumers) != 3 {
		t.Errorf("Find: work stream %s with %d consumers, want %s with 3", d.Work.CachedInfo().Config.Name, len(d.Consumers), StreamName("ORDERS", "c"))
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "orders", Subjects: []string{"lower.>"}}); err != nil {
		t.Fatal(err)
	}
	if d, err := Find(ctx, js, "orders", "c"); d != nil || err != nil {
		t.Errorf("Find of orders/c: %v, %v; want nothing (the work stream of that name copies ORDERS)", d, err)
	}
}

// Pause pauses every partition's consumer until the time given, and a
// zero time resumes them all.
func TestPause(t *testing.T) {
	js, src := ordersStream(t, 0)
	ctx := context.Background()
	if _, err := Ensure(ctx, js, src, EnsureOptions{Consumer: "c", Token: 2, Partitions: 3,
		Template: jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy}}); err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	for _, at := range []time.Time{until, {}} {
		d, err := Find(ctx, js, "ORDERS", "c")
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Pause(ctx, at); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			info, err := js.Consumer(ctx, StreamName("ORDERS", "c"), ConsumerName("c", i))
			if err != nil {
				t.Fatal(err)
			}
			ci := info.CachedInfo()
			paused := ci.Paused && ci.Config.PauseUntil != nil && ci.Config.PauseUntil.Equal(until)
			if paused != !at.IsZero() {
				t.Errorf("Pause(%v): partition %d paused %v until %v", at, i, ci.Paused, ci.Config.PauseUntil)
			}
		}
	}
}

// Status sums the partitions' consumers and matches each partition's pin
// with the courier of the membership that says it holds it: a pin nobody
// claims has no holder, a partition nobody pulled no pin.
func TestStatus(t *testing.T) {
	const n = 30
	js, src := ordersStream(t, n)
	ctx := context.Background()
	d, err := Ensure(ctx, js, src, EnsureOptions{Consumer: "c", Token: 2, Partitions: 3,
		Template: jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, PriorityPolicy: jetstream.PriorityPolicyPinned,
			PriorityGroups: []string{"g"}, PinnedTTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "every message sourced", func() bool {
		info, err := d.Work.Info(ctx)
		return err == nil && info.State.Msgs == n
	})
	// Partitions 0 and 1 pulled once each (not acked); 2 never.
	pins := map[int]string{}
	for i := range 2 {
		batch, err := d.Consumers[i].Fetch(1, jetstream.FetchPriorityGroup("g"), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			pins[i] = m.Headers().Get("Nats-Pin-Id")
		}
		if pins[i] == "" {
			t.Fatalf("partition %d: no message with a pin (%v)", i, batch.Error())
		}
	}
	jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := Join(jctx, js, MembersBucket("ORDERS", "c"), Options{Instance: "a", Partitions: 3,
		Pins: func() map[int]string { return map[int]string{0: pins[0]} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.stopWatch)
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	if _, err := js.PauseConsumer(ctx, StreamName("ORDERS", "c"), ConsumerName("c", 2), until); err != nil {
		t.Fatal(err)
	}
	if d, err = Find(ctx, js, "ORDERS", "c"); err != nil {
		t.Fatal(err)
	}
	st := d.Status(ctx, js)
	if st.Pending != n-2 || st.AckPending != 2 || len(st.Couriers) != 1 || st.Couriers[0] != "a" || !st.PausedUntil.Equal(until) {
		t.Errorf("Status: pending %d, ack pending %d, couriers %v, paused until %v; want %d, 2, [a], %v",
			st.Pending, st.AckPending, st.Couriers, st.PausedUntil, n-2, until)
	}
	want := map[string]PartitionStatus{
		ConsumerName("c", 0): {Pin: pins[0], Holder: "a"},
		ConsumerName("c", 1): {Pin: pins[1]},
		ConsumerName("c", 2): {},
	}
	if len(st.Partitions) != 3 {
		t.Fatalf("Status has %d partitions, want 3", len(st.Partitions))
	}
	for _, p := range st.Partitions {
		w, ok := want[p.Consumer]
		if !ok || p.Pin != w.Pin || p.Holder != w.Holder || (p.Pin != "") == p.PinnedSince.IsZero() {
			t.Errorf("%s: pin %q held by %q since %v; want pin %q held by %q", p.Consumer, p.Pin, p.Holder, p.PinnedSince, w.Pin, w.Holder)
		}
	}
}

// courier cleanup keeps a work stream an operator made, and one a courier
// is pulling from unless forced; it may remove an idle one of its own.
func TestKeepReason(t *testing.T) {
	js, src := ordersStream(t, 0)
	ctx := context.Background()
	d, err := Ensure(ctx, js, src, EnsureOptions{Consumer: "c", Token: 2, Partitions: 2,
		Template: jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy}})
	if err != nil {
		t.Fatal(err)
	}
	found := func() *Durable {
		t.Helper()
		d, err := Find(ctx, js, "ORDERS", "c")
		if err != nil || d == nil {
			t.Fatalf("Find: %v, %v", d, err)
		}
		return d
	}
	if why := found().KeepReason(false); why != "" {
		t.Errorf("idle work stream kept: %q", why)
	}
	// A pull waiting on the empty partition 0.
	if _, err := d.Consumers[0].Fetch(1, jetstream.FetchMaxWait(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	var busy *Durable
	poll.Until(t, 10*time.Second, "the pull request waiting", func() bool {
		busy = found()
		return busy.Consumers[0].CachedInfo().NumWaiting+busy.Consumers[1].CachedInfo().NumWaiting == 1
	})
	if why := busy.KeepReason(false); !strings.Contains(why, "a courier seems to be consuming it (1 pull requests waiting)") {
		t.Errorf("work stream pulled from: kept for %q, want the pull named", why)
	}
	if why := busy.KeepReason(true); why != "" {
		t.Errorf("work stream pulled from, forced: kept for %q", why)
	}

	if err := js.DeleteStream(ctx, StreamName("ORDERS", "c")); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: StreamName("ORDERS", "c"), Description: "an operator's",
		Sources: []*jetstream.StreamSource{{Name: "ORDERS"}}}); err != nil {
		t.Fatal(err)
	}
	if why := found().KeepReason(true); !strings.HasPrefix(why, "not created by courier") {
		t.Errorf("an operator's stream of that name: kept for %q, want never removed", why)
	}
}
