package dlq_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/natstest"
)

// toolsEnv is a server with a source stream ORDERS on orders.> and a
// dead-letter stream for subject.
type toolsEnv struct {
	t       *testing.T
	js      jetstream.JetStream
	subject string
	pub     *dlq.Publisher
	orders  jetstream.Stream
	created time.Time // ORDERS' creation time
}

const toolsSubject = "dlq.ORDERS.courier"

func newToolsEnv(t *testing.T, adjust ...func(*jetstream.StreamConfig)) *toolsEnv {
	t.Helper()
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	cfg := jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}
	for _, f := range adjust {
		f(&cfg)
	}
	orders, err := js.CreateStream(ctx(t, 5*time.Second), cfg)
	if err != nil {
		t.Fatalf("create ORDERS: %v", err)
	}
	ensure(t, js, toolsSubject)
	return &toolsEnv{t: t, js: js, subject: toolsSubject, pub: dlq.NewPublisher(js, toolsSubject), orders: orders, created: orders.CachedInfo().Created}
}

// deadLetter stores a dead letter of an original at seq in ORDERS (which
// need not exist) and returns its dead-letter sequence.
func (e *toolsEnv) deadLetter(seq uint64, subject, reason string, hdr nats.Header, body string, change ...func(*dlq.Letter)) uint64 {
	e.t.Helper()
	l := dlq.Letter{
		Subject: subject, Data: []byte(body), Header: hdr,
		Stream: "ORDERS", StreamCreated: e.created, Sequence: seq, Published: time.Now(),
		Consumer: "courier", Reason: reason, Status: 422, Error: "no", Attempts: 1,
	}
	for _, f := range change {
		f(&l)
	}
	ack, err := e.pub.Publish(ctx(e.t, 5*time.Second), l)
	if err != nil || ack.Duplicate {
		e.t.Fatalf("publish dead letter: %+v, %v", ack, err)
	}
	return ack.Sequence
}

// publishOriginal stores an original in ORDERS and returns it as stored.
func (e *toolsEnv) publishOriginal(subject, body string, hdr nats.Header) *jetstream.RawStreamMsg {
	e.t.Helper()
	ack, err := e.js.PublishMsg(ctx(e.t, 5*time.Second), &nats.Msg{Subject: subject, Header: hdr, Data: []byte(body)})
	if err != nil || ack.Duplicate {
		e.t.Fatalf("publish original: %+v, %v", ack, err)
	}
	m, err := e.orders.GetMsg(ctx(e.t, 5*time.Second), ack.Sequence)
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

// letterOf stores the dead letter of a stored original.
func (e *toolsEnv) letterOf(m *jetstream.RawStreamMsg, reason string) uint64 {
	e.t.Helper()
	return e.deadLetter(m.Sequence, m.Subject, reason, m.Header, string(m.Data), func(l *dlq.Letter) { l.Published = m.Time })
}

func (e *toolsEnv) queue() *dlq.Queue {
	e.t.Helper()
	q, err := dlq.Open(ctx(e.t, 5*time.Second), e.js, e.subject)
	if err != nil {
		e.t.Fatalf("Open: %v", err)
	}
	return q
}

// originals returns every message in ORDERS.
func (e *toolsEnv) originals() []*jetstream.RawStreamMsg {
	e.t.Helper()
	info, err := e.orders.Info(ctx(e.t, 5*time.Second))
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		if m, err := e.orders.GetMsg(ctx(e.t, 5*time.Second), seq); err == nil {
			out = append(out, m)
		}
	}
	return out
}

func seqs(ds []*dlq.DeadLetter) []uint64 {
	var out []uint64
	for _, d := range ds {
		out = append(out, d.Sequence)
	}
	return out
}

func TestListFiltersGapsAndSharedStream(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	// A stream shared with other subjects, as an operator might create.
	createStream(t, js, jetstream.StreamConfig{Name: "DEAD", Subjects: []string{"dlq.>"}, Duplicates: time.Minute})
	e := &toolsEnv{t: t, js: js, subject: toolsSubject, pub: dlq.NewPublisher(js, toolsSubject), created: time.Unix(1, 0)}
	noise := func() {
		if _, err := js.Publish(ctx(t, 5*time.Second), "dlq.other.courier", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}

	noise()
	a := e.deadLetter(1, "orders.created", dlq.ReasonRejected, nil, "a")
	b := e.deadLetter(2, "orders.eu.paid", dlq.ReasonExhausted, nil, "b")
	noise()
	gone := e.deadLetter(3, "orders.created", dlq.ReasonRejected, nil, "gone")
	other := e.deadLetter(4, "orders.created", dlq.ReasonRejected, nil, "other consumer", func(l *dlq.Letter) { l.Consumer = "other" })
	time.Sleep(10 * time.Millisecond) // distinct stored times for --since
	c := e.deadLetter(5, "orders.us.paid", dlq.ReasonExpired, nil, "c")
	noise()

	q := e.queue()
	stream, err := js.Stream(ctx(t, 5*time.Second), "DEAD")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(ctx(t, 5*time.Second), gone); err != nil {
		t.Fatal(err)
	}
	cAt, err := q.Show(ctx(t, 5*time.Second), c)
	if err != nil {
		t.Fatal(err)
	}

	mine := dlq.Selection{Stream: "ORDERS", Consumer: "courier"}
	with := func(f func(*dlq.Selection)) dlq.Selection { s := mine; f(&s); return s }
	tests := []struct {
		name string
		sel  dlq.Selection
		want []uint64
	}{
		{"everything", dlq.Selection{}, []uint64{a, b, other, c}},
		{"this consumer", mine, []uint64{a, b, c}},
		{"other stream", dlq.Selection{Stream: "PAYMENTS"}, nil},
		{"reason", with(func(s *dlq.Selection) { s.Reason = dlq.ReasonRejected }), []uint64{a}},
		{"literal subject", with(func(s *dlq.Selection) { s.Subject = "orders.created" }), []uint64{a}},
		{"star", with(func(s *dlq.Selection) { s.Subject = "orders.*.paid" }), []uint64{b, c}},
		{"greater than", with(func(s *dlq.Selection) { s.Subject = "orders.>" }), []uint64{a, b, c}},
		{"no match", with(func(s *dlq.Selection) { s.Subject = "orders" }), nil},
		{"since", with(func(s *dlq.Selection) { s.Since = cAt.Time }), []uint64{c}},
		{"sequences", with(func(s *dlq.Selection) { s.Sequences = []uint64{c, gone, a, 1, 999} }), []uint64{a, c}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := q.List(ctx(t, 5*time.Second), tt.sel)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			if !slices.Equal(seqs(got), tt.want) {
				t.Errorf("List = %v, want %v", seqs(got), tt.want)
			}
		})
	}
}

func TestShowParsesEnvelope(t *testing.T) {
	e := newToolsEnv(t)
	failed := time.Date(2025, 3, 4, 5, 6, 7, 8, time.UTC)
	published := time.Date(2025, 3, 4, 5, 6, 0, 9, time.UTC)
	hdr := nats.Header{"X-Tenant": {"acme"}, "Nats-Msg-Id": {"id-1"}}
	seq := e.deadLetter(7, "orders.created", dlq.ReasonRejected, hdr, "body\x00", func(l *dlq.Letter) {
		l.FailedAt, l.Published, l.Attempts, l.Status, l.Error = failed, published, 3, 409, "conflict"
	})
	d, err := e.queue().Show(ctx(t, 5*time.Second), seq)
	if err != nil {
		t.Fatalf("Show: %v", err)
	}
	if d.Sequence != seq || d.Reason != dlq.ReasonRejected || d.Status != 409 || d.Error != "conflict" ||
		d.Attempts != 3 || d.Subject != "orders.created" || d.Stream != "ORDERS" || d.StreamSequence != 7 ||
		d.Consumer != "courier" || !d.FailedAt.Equal(failed) || !d.Published.Equal(published) ||
		string(d.Data) != "body\x00" || time.Since(d.Time) > time.Minute {
		t.Errorf("Show = %+v", d)
	}
	for _, server := range []string{"Nats-Stream", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Subject"} {
		if _, ok := d.Header[server]; ok {
			t.Errorf("Header carries the server's %s", server)
		}
	}
	if got := dlq.Original(d.Header); !maps.EqualFunc(got, hdr, slices.Equal) {
		t.Errorf("Original(Header) = %v, want %v", got, hdr)
	}

	if _, err := e.queue().Show(ctx(t, 5*time.Second), seq+1); !errors.Is(err, dlq.ErrNotFound) {
		t.Errorf("Show(missing) = %v, want ErrNotFound", err)
	}
	if _, err := dlq.Open(ctx(t, 5*time.Second), e.js, "dlq.nobody"); !errors.Is(err, dlq.ErrNoStream) {
		t.Errorf("Open(uncaptured) = %v, want ErrNoStream", err)
	}
}

func TestAllStopsAtLastSequenceOfItsStart(t *testing.T) {
	e := newToolsEnv(t)
	first := e.deadLetter(1, "orders.a", dlq.ReasonRejected, nil, "1")
	second := e.deadLetter(2, "orders.a", dlq.ReasonRejected, nil, "2")
	var got []uint64
	for d, err := range e.queue().All(ctx(t, 5*time.Second), dlq.Selection{}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, d.Sequence)
		// A live sidecar storing dead letters meanwhile.
		e.deadLetter(100+d.Sequence, "orders.a", dlq.ReasonRejected, nil, "new")
	}
	if !slices.Equal(got, []uint64{first, second}) {
		t.Errorf("All = %v, want %v", got, []uint64{first, second})
	}
}

func TestReplayRestoresOriginal(t *testing.T) {
	e := newToolsEnv(t, func(c *jetstream.StreamConfig) { c.AllowMsgTTL = true })
	hdr := nats.Header{
		"Content-Type":                {"application/json"},
		"X-Multi":                     {"a", "b"},
		"traceparent":                 {"00-abc-def-01"},
		"Nats-Msg-Id":                 {"order-1"},
		"Nats-TTL":                    {"1h"},
		"Nats-Expected-Stream":        {"ORDERS"},
		"Nats-Expected-Last-Sequence": {"41"},
		"Courier-Reason":              {"the publisher's own"},
		// As an original fetched with GetMsg carries them.
		"Nats-Stream":     {"ORDERS"},
		"Nats-Sequence":   {"7"},
		"Nats-Time-Stamp": {"2025-01-01T00:00:00Z"},
		"Nats-Subject":    {"orders.created"},
	}
	body := "{\"id\":1}\x00\xff"
	seq := e.deadLetter(7, "orders.created", dlq.ReasonRejected, hdr, body)

	var results []dlq.ReplayResult
	sum, err := e.queue().Replay(ctx(t, 10*time.Second), dlq.Selection{Stream: "ORDERS", Consumer: "courier"},
		dlq.ReplayOptions{Progress: func(r dlq.ReplayResult) { results = append(results, r) }})
	if err != nil || sum != (dlq.ReplaySummary{Replayed: 1}) {
		t.Fatalf("Replay = %+v, %v; want 1 replayed", sum, err)
	}
	if len(results) != 1 || results[0].Outcome != dlq.Replayed || results[0].Earlier || results[0].Letter.Sequence != seq {
		t.Errorf("progress = %+v", results)
	}

	got := e.originals()
	if len(got) != 1 {
		t.Fatalf("ORDERS holds %d messages, want the republished one", len(got))
	}
	m := got[0]
	if m.Subject != "orders.created" || string(m.Data) != body {
		t.Errorf("republished %q on %s, want %q on orders.created", m.Data, m.Subject, body)
	}
	want := nats.Header{
		"Content-Type":   {"application/json"},
		"X-Multi":        {"a", "b"},
		"traceparent":    {"00-abc-def-01"},
		"Nats-Msg-Id":    {"order-1"},
		"Nats-TTL":       {"1h"},
		"Courier-Reason": {"the publisher's own"},
	}
	// ORDERS allows no direct get: the headers come back exactly as stored.
	stored := m.Header
	if !maps.EqualFunc(stored, want, slices.Equal) {
		t.Errorf("republished headers = %v, want %v", stored, want)
	}
	if left, _ := e.queue().List(ctx(t, 5*time.Second), dlq.Selection{}); len(left) != 0 {
		t.Errorf("%d dead letters left, want 0", len(left))
	}
}

func TestReplayGivesMsgIDWhenOriginalHasNone(t *testing.T) {
	e := newToolsEnv(t)
	seq := e.deadLetter(7, "orders.created", dlq.ReasonRejected, nats.Header{"X-A": {"1"}}, "x")
	d, err := e.queue().Show(ctx(t, 5*time.Second), seq)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Republish("").Header.Get("Nats-Msg-Id"); got != d.Header.Get("Nats-Msg-Id") || got == "" {
		t.Errorf("Republish Nats-Msg-Id = %q, want the dead letter's %q", got, d.Header.Get("Nats-Msg-Id"))
	}
	if _, ok := d.Original()["Nats-Msg-Id"]; ok {
		t.Errorf("Original() invents a Nats-Msg-Id")
	}
}

func TestReplayDuplicateOfOriginalIsKept(t *testing.T) {
	e := newToolsEnv(t, func(c *jetstream.StreamConfig) { c.Duplicates = 90 * time.Second })
	orig := e.publishOriginal("orders.created", "x", nats.Header{"Nats-Msg-Id": {"order-1"}})
	seq := e.letterOf(orig, dlq.ReasonRejected)

	var res dlq.ReplayResult
	sum, err := e.queue().Replay(ctx(t, 10*time.Second), orders, dlq.ReplayOptions{Progress: func(r dlq.ReplayResult) { res = r }})
	if err != nil || sum.Kept != 1 || sum.Replayed != 0 || sum.Failed != 0 {
		t.Fatalf("Replay = %+v, %v; want 1 kept", sum, err)
	}
	wantAt := orig.Time.Add(90 * time.Second)
	if res.Outcome != dlq.Kept || !res.RetryAt.Equal(wantAt) || !sum.RetryAt.Equal(wantAt) {
		t.Errorf("result = %+v (summary retry %v), want kept until %v", res, sum.RetryAt, wantAt)
	}
	if res.Ack == nil || !res.Ack.Duplicate || res.Ack.Sequence != orig.Sequence {
		t.Errorf("ack = %+v, want a duplicate of %d", res.Ack, orig.Sequence)
	}
	if _, err := e.queue().Show(ctx(t, 5*time.Second), seq); err != nil {
		t.Errorf("dead letter gone: %v", err)
	}
	if n := len(e.originals()); n != 1 {
		t.Errorf("ORDERS holds %d messages, want 1", n)
	}
}

func TestReplayAfterInterruptedReplay(t *testing.T) {
	for _, tt := range []struct {
		name string
		hdr  nats.Header
	}{
		{"original id", nats.Header{"Nats-Msg-Id": {"order-1"}}},
		{"no original id", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newToolsEnv(t)
			// The original left the duplicate window long ago (sequence
			// 7 is not in the stream); the interrupted replay stored
			// its copy but did not remove the dead letter.
			seq := e.deadLetter(7, "orders.created", dlq.ReasonRejected, tt.hdr, "x")
			q := e.queue()
			d, err := q.Show(ctx(t, 5*time.Second), seq)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.js.PublishMsg(ctx(t, 5*time.Second), d.Republish("")); err != nil {
				t.Fatal(err)
			}

			var res dlq.ReplayResult
			sum, err := q.Replay(ctx(t, 10*time.Second), orders, dlq.ReplayOptions{Progress: func(r dlq.ReplayResult) { res = r }})
			if err != nil || sum != (dlq.ReplaySummary{Replayed: 1}) || !res.Earlier {
				t.Fatalf("Replay = %+v, %v, %+v; want 1 replayed, found republished earlier", sum, err, res)
			}
			if left, _ := q.List(ctx(t, 5*time.Second), dlq.Selection{}); len(left) != 0 {
				t.Errorf("%d dead letters left", len(left))
			}
			if n := len(e.originals()); n != 1 {
				t.Errorf("ORDERS holds %d copies, want 1", n)
			}
		})
	}
}

func TestReplayCancelledMidwayThenAgain(t *testing.T) {
	e := newToolsEnv(t)
	for i := range 4 {
		e.deadLetter(uint64(10+i), "orders.created", dlq.ReasonRejected, nil, strconv.Itoa(i))
	}
	q := e.queue()
	c, cancel := context.WithCancel(ctx(t, 10*time.Second))
	sum, err := q.Replay(c, orders, dlq.ReplayOptions{Progress: func(dlq.ReplayResult) { cancel() }})
	if !errors.Is(err, context.Canceled) || sum.Replayed != 1 {
		t.Fatalf("cancelled Replay = %+v, %v; want 1 replayed and context.Canceled", sum, err)
	}
	sum, err = q.Replay(ctx(t, 10*time.Second), orders, dlq.ReplayOptions{})
	if err != nil || sum != (dlq.ReplaySummary{Replayed: 3}) {
		t.Fatalf("second Replay = %+v, %v; want 3 replayed", sum, err)
	}
	var bodies []string
	for _, m := range e.originals() {
		bodies = append(bodies, string(m.Data))
	}
	slices.Sort(bodies)
	if !slices.Equal(bodies, []string{"0", "1", "2", "3"}) {
		t.Errorf("ORDERS holds %q, want each of 0..3 once", bodies)
	}
}

func TestReplayDryRunLimitRate(t *testing.T) {
	e := newToolsEnv(t)
	for i := range 3 {
		e.deadLetter(uint64(10+i), "orders.created", dlq.ReasonRejected, nil, strconv.Itoa(i))
	}
	q := e.queue()

	sum, err := q.Replay(ctx(t, 10*time.Second), orders, dlq.ReplayOptions{DryRun: true, Limit: 2})
	if err != nil || sum != (dlq.ReplaySummary{WouldReplay: 2}) {
		t.Errorf("dry run = %+v, %v; want 2 would replay", sum, err)
	}
	if left, _ := q.List(ctx(t, 5*time.Second), dlq.Selection{}); len(left) != 3 || len(e.originals()) != 0 {
		t.Fatalf("dry run changed something: %d dead letters, %d originals", len(left), len(e.originals()))
	}

	sum, err = q.Replay(ctx(t, 10*time.Second), orders, dlq.ReplayOptions{Limit: 2})
	if err != nil || sum != (dlq.ReplaySummary{Replayed: 2}) {
		t.Errorf("limited = %+v, %v; want 2 replayed", sum, err)
	}
	left, _ := q.List(ctx(t, 5*time.Second), dlq.Selection{})
	if len(left) != 1 || string(left[0].Data) != "2" {
		t.Errorf("left %v, want the last dead letter", seqs(left))
	}

	for i := range 2 {
		e.deadLetter(uint64(20+i), "orders.created", dlq.ReasonRejected, nil, "r")
	}
	start := time.Now()
	sum, err = q.Replay(ctx(t, 10*time.Second), orders, dlq.ReplayOptions{Rate: 10})
	// Three republishes at 10/s: the third no sooner than 200ms after the first.
	if elapsed := time.Since(start); err != nil || sum.Replayed != 3 || elapsed < 190*time.Millisecond {
		t.Errorf("rated Replay = %+v, %v in %s; want 3 replayed in at least 200ms", sum, err, elapsed)
	}
}

func TestReplayFailureKeepsDeadLetter(t *testing.T) {
	e := newToolsEnv(t)
	// ORDERS does not allow per-message TTLs: it refuses the republish.
	seq := e.deadLetter(7, "orders.created", dlq.ReasonRejected, nats.Header{"Nats-TTL": {"1h"}}, "x")
	ok := e.deadLetter(8, "orders.created", dlq.ReasonRejected, nil, "y")
	var failed []dlq.ReplayResult
	sum, err := e.queue().Replay(ctx(t, 10*time.Second), orders, dlq.ReplayOptions{Progress: func(r dlq.ReplayResult) {
		if r.Outcome == dlq.Failed {
			failed = append(failed, r)
		}
	}})
	if err != nil || sum != (dlq.ReplaySummary{Replayed: 1, Failed: 1}) {
		t.Fatalf("Replay = %+v, %v; want 1 replayed, 1 failed", sum, err)
	}
	if len(failed) != 1 || failed[0].Letter.Sequence != seq || !strings.Contains(failed[0].Err.Error(), "TTL") {
		t.Errorf("failed = %+v", failed)
	}
	left, _ := e.queue().List(ctx(t, 5*time.Second), dlq.Selection{})
	if !slices.Equal(seqs(left), []uint64{seq}) {
		t.Errorf("left %v, want only %d (not %d)", seqs(left), seq, ok)
	}
}

func TestPurge(t *testing.T) {
	e := newToolsEnv(t)
	a := e.deadLetter(1, "orders.a", dlq.ReasonRejected, nil, "a")
	b := e.deadLetter(2, "orders.b", dlq.ReasonExpired, nil, "b")
	c := e.deadLetter(3, "orders.c", dlq.ReasonRejected, nil, "c")
	q := e.queue()
	var purged []uint64
	sum, err := q.Purge(ctx(t, 5*time.Second), dlq.Selection{Reason: dlq.ReasonRejected}, dlq.PurgeOptions{Progress: func(r dlq.PurgeResult) {
		if r.Err == nil {
			purged = append(purged, r.Letter.Sequence)
		}
	}})
	if err != nil || sum != (dlq.PurgeSummary{Purged: 2}) || !slices.Equal(purged, []uint64{a, c}) {
		t.Fatalf("Purge = %+v, %v, purged %v; want %v", sum, err, purged, []uint64{a, c})
	}
	left, _ := q.List(ctx(t, 5*time.Second), dlq.Selection{})
	if !slices.Equal(seqs(left), []uint64{b}) {
		t.Errorf("left %v, want %v", seqs(left), []uint64{b})
	}
}

// gauge returns the value of courier_dead_letters_stored in reg, and whether it
// was there.
func gauge(t *testing.T, reg *prometheus.Registry) (float64, bool) {
	t.Helper()
	return metricstest.Lookup(t, reg, "courier_dead_letters_stored")
}

func TestDepthCollector(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	reg := prometheus.NewRegistry()
	reg.MustRegister(depthCollector(t, js, dlq.DepthOptions{CacheFor: time.Nanosecond}))

	if v, ok := gauge(t, reg); ok {
		t.Errorf("courier_dead_letters_stored = %v before any stream captures the subject, want no sample", v)
	}
	// Shared with another subject, which must not count.
	createStream(t, js, jetstream.StreamConfig{Name: "DEAD", Subjects: []string{"dlq.>"}})
	if _, err := js.Publish(ctx(t, 5*time.Second), "dlq.other", nil); err != nil {
		t.Fatal(err)
	}
	e := &toolsEnv{t: t, js: js, subject: toolsSubject, pub: dlq.NewPublisher(js, toolsSubject)}
	if v, ok := gauge(t, reg); !ok || v != 0 {
		t.Errorf("courier_dead_letters_stored = %v, %v; want 0", v, ok)
	}
	first := e.deadLetter(1, "orders.a", dlq.ReasonRejected, nil, "a")
	e.deadLetter(2, "orders.a", dlq.ReasonRejected, nil, "b")
	if v, ok := gauge(t, reg); !ok || v != 2 {
		t.Errorf("courier_dead_letters_stored = %v, %v; want 2", v, ok)
	}
	if _, err := e.queue().Purge(ctx(t, 5*time.Second), dlq.Selection{Sequences: []uint64{first}}, dlq.PurgeOptions{}); err != nil {
		t.Fatal(err)
	}
	if v, ok := gauge(t, reg); !ok || v != 1 {
		t.Errorf("courier_dead_letters_stored = %v, %v after a purge; want 1", v, ok)
	}
	if n, err := dlq.Depth(ctx(t, 5*time.Second), js, toolsSubject); err != nil || n != 1 {
		t.Errorf("Depth = %d, %v; want 1", n, err)
	}

	cached := prometheus.NewRegistry()
	cached.MustRegister(depthCollector(t, js, dlq.DepthOptions{CacheFor: time.Hour}))
	gauge(t, cached)
	e.deadLetter(3, "orders.a", dlq.ReasonRejected, nil, "c")
	if v, _ := gauge(t, cached); v != 1 {
		t.Errorf("cached courier_dead_letters_stored = %v, want the cached 1", v)
	}
}

func depthCollector(t *testing.T, js jetstream.JetStream, o dlq.DepthOptions) *dlq.DepthCollector {
	t.Helper()
	c, err := dlq.NewDepthCollector(js, toolsSubject, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
