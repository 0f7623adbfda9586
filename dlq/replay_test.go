package dlq_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natstest"
)

// orders selects the dead letters of stream ORDERS, which Replay needs.
var orders = dlq.Selection{Stream: "ORDERS"}

// replayAll replays every dead letter and returns the summary and the one
// result it expects.
func (e *toolsEnv) replayAll(opts dlq.ReplayOptions) (dlq.ReplaySummary, dlq.ReplayResult) {
	e.t.Helper()
	var res []dlq.ReplayResult
	opts.Progress = func(r dlq.ReplayResult) { res = append(res, r) }
	sum, err := e.queue().Replay(ctx(e.t, 10*time.Second), orders, opts)
	if err != nil || len(res) != 1 {
		e.t.Fatalf("Replay = %+v, %v, %d results; want one result", sum, err, len(res))
	}
	return sum, res[0]
}

// Replay publishes to the original's exact subject, not to the readable
// form the envelope shows (issue #17.7).
func TestReplayToExactSubject(t *testing.T) {
	for _, subject := range []string{"orders.caf\xe9", "orders.a\x01b"} {
		t.Run(subject, func(t *testing.T) {
			e := newToolsEnv(t)
			e.deadLetter(7, subject, dlq.ReasonRejected, nil, "x")
			// The stream API's JSON cannot carry such a subject as it is
			// (it gives U+FFFD): see it as a subscriber does.
			sub, err := e.js.Conn().SubscribeSync("orders.>")
			if err != nil {
				t.Fatal(err)
			}
			sum, res := e.replayAll(dlq.ReplayOptions{})
			if sum.Replayed != 1 {
				t.Fatalf("Replay = %+v, %v", sum, res.Err)
			}
			m, err := sub.NextMsg(5 * time.Second)
			if err != nil || m.Subject != subject {
				t.Errorf("republished to %q (%v), want %q", m.Subject, err, subject)
			}
		})
	}
}

// A duplicate ack that points at another message stored under the same
// Nats-Msg-Id (its publisher reused the id) is not an earlier replay's
// copy: the dead letter is kept, not deleted (issue #17.8).
func TestReplayDuplicateOfReusedIDIsKept(t *testing.T) {
	e := newToolsEnv(t)
	other := e.publishOriginal("orders.created", "another order", nats.Header{"Nats-Msg-Id": {"order-1"}})
	// The dead letter's original (sequence 7, gone) carried the same id.
	seq := e.deadLetter(7, "orders.created", dlq.ReasonRejected, nats.Header{"Nats-Msg-Id": {"order-1"}}, "the failed order")

	sum, res := e.replayAll(dlq.ReplayOptions{})
	if sum.Kept != 1 || res.Outcome != dlq.Kept || res.Earlier || !strings.Contains(res.Why, "another message") {
		t.Fatalf("Replay = %+v, %+v; want kept because another message holds the id", sum, res)
	}
	if res.RetryAt.IsZero() || !res.RetryAt.After(other.Time) {
		t.Errorf("RetryAt = %v, want the end of the window of the message at %v", res.RetryAt, other.Time)
	}
	if _, err := e.queue().Show(ctx(t, 5*time.Second), seq); err != nil {
		t.Errorf("dead letter deleted though its message was never stored again: %v", err)
	}

	// The same id and the same content: an earlier replay's copy.
	e2 := newToolsEnv(t)
	e2.publishOriginal("orders.created", "the failed order", nats.Header{"Nats-Msg-Id": {"order-1"}})
	e2.deadLetter(7, "orders.created", dlq.ReasonRejected, nats.Header{"Nats-Msg-Id": {"order-1"}}, "the failed order")
	if sum, res := e2.replayAll(dlq.ReplayOptions{}); sum.Replayed != 1 || !res.Earlier {
		t.Errorf("Replay of an earlier copy = %+v, %+v; want replayed (earlier)", sum, res)
	}
}

// An original whose key was derived is republished with that key in the
// idempotency header, so the app sees the same Idempotency-Key (issue #16).
func TestReplayRepublishesDerivedKey(t *testing.T) {
	tests := []struct {
		name string
		hdr  nats.Header
		want string // the idempotency header of the republish; "derived": DerivedKey
	}{
		{"derived", nats.Header{"X-A": {"1"}}, "derived"},
		{"no headers", nil, "derived"},
		{"own key", nats.Header{"Idempotency-Key": {"k-1"}}, "k-1"},
		{"own key in another case", nats.Header{"idempotency-key": {"k-2"}}, ""},
		{"msg id", nats.Header{"Nats-Msg-Id": {"order-1"}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newToolsEnv(t)
			e.deadLetter(7, "orders.created", dlq.ReasonRejected, tt.hdr, "x")
			if sum, res := e.replayAll(dlq.ReplayOptions{IdempotencyHeader: "Idempotency-Key"}); sum.Replayed != 1 {
				t.Fatalf("Replay = %+v, %v", sum, res.Err)
			}
			want := tt.want
			if want == "derived" {
				want = dlq.DerivedKey("ORDERS", e.created, 7)
			}
			if got := e.originals()[0].Header.Get("Idempotency-Key"); got != want {
				t.Errorf("Idempotency-Key = %q, want %q", got, want)
			}
		})
	}
}

// A reference dead letter (body too large to carry) is shown without its
// body, loaded from the source stream, and replayed with it; when the
// original is gone, replay says so and keeps the dead letter (issue #17.2).
func TestReplayReferenceDeadLetter(t *testing.T) {
	s := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = 8192 }})
	_, js := natstest.Connect(t, s)
	orders, err := js.CreateStream(ctx(t, 5*time.Second), jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	ensure(t, js, toolsSubject)
	e := &toolsEnv{t: t, js: js, subject: toolsSubject, pub: dlq.NewPublisher(js, toolsSubject), orders: orders, created: orders.CachedInfo().Created}

	body := strings.Repeat("b", 8000)
	orig := e.publishOriginal("orders.created", body, nats.Header{"Content-Type": {"text/plain"}})
	seq := e.letterOf(orig, dlq.ReasonRejected)
	q := e.queue()
	d, err := q.Show(ctx(t, 5*time.Second), seq)
	if err != nil {
		t.Fatal(err)
	}
	if !d.BodyOmitted || d.BodySize != len(body) || len(d.Data) != 0 {
		t.Fatalf("Show = omitted %v, size %d, %d bytes; want a reference to %d bytes", d.BodyOmitted, d.BodySize, len(d.Data), len(body))
	}
	if err := q.Load(ctx(t, 5*time.Second), d); err != nil || string(d.Data) != body {
		t.Fatalf("Load = %v, %d bytes; want the original's body", err, len(d.Data))
	}

	sum, res := e.replayAll(dlq.ReplayOptions{})
	if sum.Replayed != 1 {
		t.Fatalf("Replay = %+v, %v", sum, res.Err)
	}
	got := e.originals()
	if len(got) != 2 || string(got[1].Data) != body || got[1].Header.Get("Content-Type") != "text/plain" {
		t.Errorf("ORDERS holds %d messages; want the original and its republish with the body", len(got))
	}

	// Gone: the original was deleted.
	orig2 := e.publishOriginal("orders.created", body, nil)
	seq2 := e.letterOf(orig2, dlq.ReasonRejected)
	if err := orders.DeleteMsg(ctx(t, 5*time.Second), orig2.Sequence); err != nil {
		t.Fatal(err)
	}
	sum, res = e.replayAll(dlq.ReplayOptions{})
	if sum.Failed != 1 || !errors.Is(res.Err, dlq.ErrOriginalGone) || !strings.Contains(res.Err.Error(), "no longer holds it") {
		t.Errorf("Replay with the original gone = %+v, %v; want failed, ErrOriginalGone", sum, res.Err)
	}
	if _, err := q.Show(ctx(t, 5*time.Second), seq2); err != nil {
		t.Errorf("dead letter removed: %v", err)
	}
}

func TestReplayPurgeOptionsRefused(t *testing.T) {
	e := newToolsEnv(t)
	q := e.queue()
	if _, err := q.Replay(ctx(t, 5*time.Second), orders, dlq.ReplayOptions{Limit: -1}); err == nil || !strings.Contains(err.Error(), "Limit") {
		t.Errorf("Replay with Limit -1 = %v, want an error naming Limit", err)
	}
	if _, err := q.Replay(ctx(t, 5*time.Second), orders, dlq.ReplayOptions{Rate: -1}); err == nil || !strings.Contains(err.Error(), "Rate") {
		t.Errorf("Replay with Rate -1 = %v, want an error naming Rate", err)
	}
	if _, err := q.Replay(ctx(t, 5*time.Second), dlq.Selection{}, dlq.ReplayOptions{}); err == nil || !strings.Contains(err.Error(), "Selection.Stream") {
		t.Errorf("Replay without a stream = %v, want an error naming Selection.Stream", err)
	}
	if _, err := q.Purge(ctx(t, 5*time.Second), dlq.Selection{}, dlq.PurgeOptions{Limit: -1}); err == nil || !strings.Contains(err.Error(), "Limit") {
		t.Errorf("Purge with Limit -1 = %v, want an error naming Limit", err)
	}
	if _, err := dlq.NewDepthCollector(e.js, toolsSubject, dlq.DepthOptions{CacheFor: -time.Second}); err == nil || !strings.Contains(err.Error(), "CacheFor") {
		t.Errorf("NewDepthCollector with CacheFor -1s = %v, want an error naming CacheFor", err)
	}
}

// An original without a Nats-Msg-Id is republished under its dead letter's
// own (MsgID), which nothing but a replay of it publishes to the source
// stream. A replay interrupted before removing the dead letter, whose copy
// a work-queue stream has since handed out and removed, is still that
// replay's copy: the rerun removes the dead letter rather than keep it to
// republish once the window has passed, a second copy ("an interrupted
// replay loses and doubles nothing: run it again").
func TestReplayAfterInterruptedReplayCopyConsumed(t *testing.T) {
	e := newToolsEnv(t, func(c *jetstream.StreamConfig) { c.Retention = jetstream.WorkQueuePolicy })
	seq := e.deadLetter(7, "orders.created", dlq.ReasonRejected, nats.Header{"X-A": {"1"}}, "the failed order")
	d, err := e.queue().Show(ctx(t, 5*time.Second), seq)
	if err != nil {
		t.Fatal(err)
	}
	// The interrupted replay: republished, not removed; the copy was then
	// consumed and acked, which removes it from the work queue.
	ack, err := e.js.PublishMsg(ctx(t, 5*time.Second), d.Republish("Idempotency-Key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.orders.DeleteMsg(ctx(t, 5*time.Second), ack.Sequence); err != nil {
		t.Fatal(err)
	}

	sum, res := e.replayAll(dlq.ReplayOptions{IdempotencyHeader: "Idempotency-Key"})
	if sum.Replayed != 1 || !res.Earlier {
		t.Fatalf("Replay = %+v, outcome %v, why %q; want replayed (earlier)", sum, res.Outcome, res.Why)
	}
	if _, err := e.queue().Show(ctx(t, 5*time.Second), seq); !errors.Is(err, dlq.ErrNotFound) {
		t.Errorf("dead letter still there after its replay was recognised: %v", err)
	}
}

// A replay of a replay is not refused as a duplicate: the copy a replay
// stored carries the Nats-Msg-Id replay gave it (its original had none),
// and when that copy is dead-lettered and replayed in turn, within the
// source stream's duplicate window, it gets a new id (its own dead
// letter's), not the same one back; the app still sees the same
// Idempotency-Key.
func TestReplayOfAReplayGetsANewMsgID(t *testing.T) {
	e := newToolsEnv(t, func(c *jetstream.StreamConfig) { c.Duplicates = 10 * time.Minute })
	orig := e.publishOriginal("orders.created", "x", nats.Header{"X-A": {"1"}})
	e.letterOf(orig, dlq.ReasonRejected)
	opts := dlq.ReplayOptions{IdempotencyHeader: "Idempotency-Key"}
	if sum, res := e.replayAll(opts); sum.Replayed != 1 {
		t.Fatalf("first replay = %+v, %+v", sum, res)
	}
	copies := e.originals()
	if len(copies) != 2 {
		t.Fatalf("ORDERS holds %d messages after the first replay, want 2", len(copies))
	}
	first := copies[1]
	if !strings.HasPrefix(first.Header.Get("Nats-Msg-Id"), "courier-dlq:") {
		t.Fatalf("the first replay's copy has Nats-Msg-Id %q, want replay's own", first.Header.Get("Nats-Msg-Id"))
	}

	// The copy fails again and is dead-lettered, then replayed.
	e.letterOf(first, dlq.ReasonRejected)
	sum, res := e.replayAll(opts)
	if sum.Replayed != 1 || res.Outcome != dlq.Replayed || res.Earlier {
		t.Fatalf("replay of the replay = %+v, %+v (%s); want it republished", sum, res, res.Why)
	}
	copies = e.originals()
	if len(copies) != 3 {
		t.Fatalf("ORDERS holds %d messages after the second replay, want 3", len(copies))
	}
	second := copies[2]
	if id := second.Header.Get("Nats-Msg-Id"); id == first.Header.Get("Nats-Msg-Id") || !strings.HasPrefix(id, "courier-dlq:") {
		t.Errorf("the second replay's copy has Nats-Msg-Id %q, want a new one of replay's (the first was %q)", id, first.Header.Get("Nats-Msg-Id"))
	}
	want := dlq.DerivedKey("ORDERS", e.created, orig.Sequence)
	if got := second.Header.Get("Idempotency-Key"); got != want {
		t.Errorf("Idempotency-Key %q, want the original's derived key %q", got, want)
	}
	if string(second.Data) != "x" || second.Header.Get("X-A") != "1" {
		t.Errorf("second copy %q %v, want the original's body and headers", second.Data, second.Header)
	}

	// An interrupted replay of it, run again, is still recognised.
	e.letterOf(second, dlq.ReasonRejected)
	q := e.queue()
	letters, err := q.List(ctx(t, 5*time.Second), dlq.Selection{})
	if err != nil || len(letters) != 1 {
		t.Fatalf("dead letters: %d, %v", len(letters), err)
	}
	if _, err := e.js.PublishMsg(ctx(t, 5*time.Second), letters[0].Republish("Idempotency-Key")); err != nil {
		t.Fatal(err)
	}
	if sum, res := e.replayAll(opts); sum.Replayed != 1 || !res.Earlier {
		t.Errorf("replay after an interrupted one = %+v, %+v; want replayed (earlier)", sum, res)
	}
	if n := len(e.originals()); n != 4 {
		t.Errorf("ORDERS holds %d messages, want 4 (the interrupted replay's copy stored once)", n)
	}
}

// A replay's copy republished without an idempotency header had its
// replay id as its key; replayed again with a new id, it carries the old
// one in the idempotency header, so the app keeps seeing the key it saw.
func TestReplayOfAReplayKeepsTheCopysKey(t *testing.T) {
	e := newToolsEnv(t)
	orig := e.publishOriginal("orders.created", "x", nil)
	e.letterOf(orig, dlq.ReasonRejected)
	if sum, res := e.replayAll(dlq.ReplayOptions{}); sum.Replayed != 1 { // no idempotency header
		t.Fatalf("first replay = %+v, %+v", sum, res)
	}
	first := e.originals()[1]
	seq := e.letterOf(first, dlq.ReasonRejected)
	d, err := e.queue().Show(ctx(t, 5*time.Second), seq)
	if err != nil {
		t.Fatal(err)
	}
	m := d.Republish("Idempotency-Key")
	if got, want := m.Header.Get("Idempotency-Key"), first.Header.Get("Nats-Msg-Id"); got != want {
		t.Errorf("Idempotency-Key %q, want the copy's key, its Nats-Msg-Id %q", got, want)
	}
	if got := m.Header.Get("Nats-Msg-Id"); got != d.Header.Get("Nats-Msg-Id") {
		t.Errorf("Nats-Msg-Id %q, want the dead letter's own %q", got, d.Header.Get("Nats-Msg-Id"))
	}
}
