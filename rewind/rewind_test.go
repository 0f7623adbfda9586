package rewind_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/rewind"
)

// A courier's view holds the rewinds stored before it watched and those
// stored since; the newest rewind whose range holds a sequence names it.
func TestWatchSeesRewinds(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	kv, err := rewind.Open(ctx, js, "ORDERS", "courier", 1)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	old := rewind.Record{ID: rewind.NewID(at), Stream: "ORDERS", From: 10, To: 20, At: at}
	if err := rewind.Write(ctx, kv, old); err != nil {
		t.Fatal(err)
	}
	v, stop, err := rewind.Watch(ctx, kv, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	if got := v.Replay("ORDERS", 10); got != old.ID {
		t.Errorf("sequence 10: %q, want the rewind stored before the watch, %q", got, old.ID)
	}
	newer := rewind.Record{ID: rewind.NewID(at.Add(time.Hour)), Stream: "ORDERS", From: 15, To: 30, At: at.Add(time.Hour)}
	if err := rewind.Write(ctx, kv, newer); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the newer rewind seen", func() bool { return len(v.Records()) == 2 })
	for _, tc := range []struct {
		stream string
		seq    uint64
		want   string
	}{
		{"ORDERS", 9, ""}, {"ORDERS", 10, old.ID}, {"ORDERS", 14, old.ID}, {"ORDERS", 15, newer.ID},
		{"ORDERS", 30, newer.ID}, {"ORDERS", 31, ""}, {"OTHER", 15, ""},
	} {
		if got := v.Replay(tc.stream, tc.seq); got != tc.want {
			t.Errorf("Replay(%s, %d) = %q, want %q", tc.stream, tc.seq, got, tc.want)
		}
	}
	if err := kv.Delete(ctx, newer.ID); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the deleted rewind gone", func() bool { return v.Replay("ORDERS", 25) == "" })
	stop()
	stop() // idempotent
	if rewind.BucketName("ORDERS", "courier") != "COURIER_REWIND_ORDERS_courier" {
		t.Errorf("bucket name %q", rewind.BucketName("ORDERS", "courier"))
	}
}

// Two durables whose names make one bucket name (stream A_B with consumer
// C, stream A with consumer B_C) never share it: the second is refused,
// naming the first; each opens its own again.
func TestOpenRefusesAnotherDurablesBucket(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	if _, err := rewind.Open(ctx, js, "A_B", "C", 1); err != nil {
		t.Fatal(err)
	}
	_, err := rewind.Open(ctx, js, "A", "B_C", 1)
	if err == nil || !strings.Contains(err.Error(), `consumer "C" on stream "A_B"`) {
		t.Fatalf("the second durable's Open: %v, want a refusal naming consumer C on stream A_B", err)
	}
	if _, err := rewind.Open(ctx, js, "A_B", "C", 1); err != nil {
		t.Fatalf("the bucket's own durable: %v", err)
	}
}

// A rewind of a partitioned durable supersedes the copies its work stream
// held when it was re-sourced (at or before Copied, stored by CopiedAt) of
// messages from its point on: the rewind copies each again. Others are not:
// a copy made since, one of an earlier message, one of another stream, a
// copy at a sequence as low in a work stream made again since, and any
// copy for a plain durable's rewind (no Copied).
func TestSupersededCopies(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	kv, err := rewind.Open(ctx, js, "ORDERS", "courier", 1)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 8, 0, 0, 123456789, time.UTC)
	plain := rewind.Record{ID: rewind.NewID(at), Stream: "ORDERS", From: 1, To: 100, At: at}
	parts := rewind.Record{ID: rewind.NewID(at.Add(time.Minute)), Stream: "ORDERS", From: 10, To: 20, At: at.Add(time.Minute),
		Copied: 40, CopiedAt: at.Add(time.Minute)}
	for _, r := range []rewind.Record{plain, parts} {
		if err := rewind.Write(ctx, kv, r); err != nil {
			t.Fatal(err)
		}
	}
	v, stop, err := rewind.Watch(ctx, kv, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	before := parts.CopiedAt.Add(-time.Second)
	for _, tc := range []struct {
		name   string
		stream string
		seq    uint64
		work   uint64
		stored time.Time
		want   bool
	}{
		{"in the range, copied before", "ORDERS", 12, 35, before, true},
		{"the work stream's last copy", "ORDERS", 20, 40, parts.CopiedAt, true},
		{"after the range, copied before", "ORDERS", 25, 39, before, true},
		{"before the point", "ORDERS", 9, 30, before, false},
		{"copied by the rewind", "ORDERS", 12, 41, parts.CopiedAt.Add(time.Second), false},
		{"a work stream made again", "ORDERS", 12, 3, parts.CopiedAt.Add(time.Hour), false},
		{"another stream", "OTHER", 12, 35, before, false},
	} {
		if got := v.Superseded(tc.stream, tc.seq, tc.work, tc.stored); got != tc.want {
			t.Errorf("%s: Superseded(%s, %d, %d) = %v, want %v", tc.name, tc.stream, tc.seq, tc.work, got, tc.want)
		}
	}
	if (*rewind.View)(nil).Superseded("ORDERS", 12, 35, before) {
		t.Error("a nil view supersedes a copy")
	}
}
