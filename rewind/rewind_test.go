package rewind_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
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
	v, stop, err := rewind.Watch(ctx, kv, nil, slog.New(slog.DiscardHandler))
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

// confirmAll accepts every record's copy point.
func confirmAll(context.Context, rewind.Record) error { return nil }

// A rewind of a partitioned durable supersedes the copies its work stream
// held when it was re-sourced (at or before Copied, stored by CopiedAt, by
// an earlier generation of its source) of messages from its point on: the
// rewind copies each again. Others are not: a copy made since, one by the
// rewind's generation or a later one whatever its sequence, one of an
// earlier message, one of another stream, a copy at a sequence as low in a
// work stream made again since, and any copy for a plain durable's rewind
// (no Copied).
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
		Copied: 40, CopiedAt: at.Add(time.Minute), Generation: 2}
	for _, r := range []rewind.Record{plain, parts} {
		if err := rewind.Write(ctx, kv, r); err != nil {
			t.Fatal(err)
		}
	}
	v, stop, err := rewind.Watch(ctx, kv, confirmAll, slog.New(slog.DiscardHandler))
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
		gen    int
		stored time.Time
		want   bool
	}{
		{"in the range, copied before", "ORDERS", 12, 35, 1, before, true},
		{"copied by the first source", "ORDERS", 12, 35, 0, before, true},
		{"the work stream's last copy", "ORDERS", 20, 40, 1, parts.CopiedAt, true},
		{"after the range, copied before", "ORDERS", 25, 39, 1, before, true},
		{"before the point", "ORDERS", 9, 30, 1, before, false},
		{"copied by the rewind", "ORDERS", 12, 41, 2, parts.CopiedAt.Add(time.Second), false},
		{"the rewind's generation, before Copied", "ORDERS", 12, 35, 2, before, false},
		{"a later generation, before Copied", "ORDERS", 12, 35, 3, before, false},
		{"a work stream made again", "ORDERS", 12, 3, 0, parts.CopiedAt.Add(time.Hour), false},
		{"another stream", "OTHER", 12, 35, 1, before, false},
	} {
		if got := v.Superseded(tc.stream, tc.seq, tc.work, tc.gen, tc.stored); got != tc.want {
			t.Errorf("%s: Superseded(%s, %d, %d, %d) = %v, want %v", tc.name, tc.stream, tc.seq, tc.work, tc.gen, got, tc.want)
		}
	}
	if (*rewind.View)(nil).Superseded("ORDERS", 12, 35, 1, before) {
		t.Error("a nil view supersedes a copy")
	}
}

// A record's copy point is believed only once confirmed. One that is
// refused (a forged record, one written before records named their
// generation, or a read of the work stream that failed), or that nothing
// can confirm (no confirm), is kept without it: its range is replayed, it
// supersedes nothing, and the courier warns naming it and why; one
// confirmed supersedes as it says. Each is confirmed as it was stored.
func TestWatchConfirmsCopyPoints(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	kv, err := rewind.Open(ctx, js, "ORDERS", "courier", 1)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	forged := rewind.Record{ID: rewind.NewID(at), Stream: "ORDERS", From: 10, To: 20, At: at,
		Copied: 1 << 40, CopiedAt: at.Add(100 * 365 * 24 * time.Hour), Generation: 1 << 20}
	genuine := rewind.Record{ID: rewind.NewID(at.Add(time.Hour)), Stream: "ORDERS", From: 30, To: 40, At: at.Add(time.Hour),
		Copied: 50, CopiedAt: at.Add(time.Hour), Generation: 1}
	refused := errors.New("it names generation 1048576 of the work stream's source, which is at generation 1")
	var mu sync.Mutex
	var asked []string
	confirm := func(_ context.Context, r rewind.Record) error {
		mu.Lock()
		asked = append(asked, r.ID)
		mu.Unlock()
		if r.ID == genuine.ID && r.Copied == genuine.Copied && r.Generation == genuine.Generation && r.CopiedAt.Equal(genuine.CopiedAt) {
			return nil
		}
		return refused
	}
	if err := rewind.Write(ctx, kv, forged); err != nil {
		t.Fatal(err)
	}
	var logs testlog.Buffer
	v, stop, err := rewind.Watch(ctx, kv, confirm, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	if got := v.Replay("ORDERS", 15); got != forged.ID {
		t.Errorf("the refused record's range: Replay = %q, want %q", got, forged.ID)
	}
	if v.Superseded("ORDERS", 15, 35, 0, at) {
		t.Error("a copy point the confirm refused supersedes a copy")
	}
	if rs := v.Records(); len(rs) != 1 || rs[0].Copied != 0 || !rs[0].CopiedAt.IsZero() || rs[0].Generation != 0 {
		t.Errorf("the view holds %+v, want the refused record without its copy point", rs)
	}
	for _, want := range []string{"level=WARN", forged.ID, "its copy point is ignored", "delivered, not acked unsent", refused.Error()} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the warning for the refused record lacks %q:\n%s", want, logs.String())
		}
	}

	if err := rewind.Write(ctx, kv, genuine); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the confirmed record seen", func() bool { return len(v.Records()) == 2 })
	if !v.Superseded("ORDERS", 35, 45, 0, at) {
		t.Error("a confirmed copy point does not supersede a copy it names")
	}
	if v.Superseded("ORDERS", 15, 35, 0, at) {
		t.Error("the refused copy point supersedes a copy once another record came")
	}
	mu.Lock()
	if fmt.Sprint(asked) != fmt.Sprint([]string{forged.ID, genuine.ID}) {
		t.Errorf("confirm asked for %v, want each record once", asked)
	}
	mu.Unlock()

	// No confirm: no copy point is believed.
	unchecked, stopUnchecked, err := rewind.Watch(ctx, kv, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopUnchecked)
	if unchecked.Superseded("ORDERS", 35, 45, 0, at) || unchecked.Replay("ORDERS", 35) != genuine.ID {
		t.Error("a view without confirm believes a copy point, or does not replay its range")
	}
}
