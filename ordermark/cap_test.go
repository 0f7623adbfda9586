package ordermark

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/testlog"
)

// A mark written into the bucket by someone else, due in a year, is read
// as due at the latest a retry courier writes can be (now, the longest
// delay and an ack wait), and logged once with its key and what it said; a
// mark courier could have written is read as it is; writes pass through.
// Before, nothing bounded a mark's due time: the key waited a year.
func TestCappedCutsForgedDueTime(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	durable, err := Open(ctx, js, "ORDERS", "courier", 1)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := OpenPartitions(ctx, js, "ORDERS", "courier", 1)
	if err != nil {
		t.Fatal(err)
	}
	for name, store := range map[string]*Store{"durable": durable, "partition": parts.Partition(3)} {
		t.Run(name, func(t *testing.T) {
			now := time.UnixMilli(time.Now().UnixMilli())
			var logs testlog.Buffer
			c := NewCapped(store, Cap{
				MaxDelay: 10 * time.Minute, AckWait: 30 * time.Second,
				Now:    func() time.Time { return now },
				Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
			})
			latest := now.Add(10*time.Minute + 30*time.Second)
			honest := now.Add(10 * time.Minute)
			forged := now.Add(365 * 24 * time.Hour)
			for key, m := range map[string]Mark{"retried": {Seq: 5, Due: honest}, "forged": {Seq: 6, Due: forged}, "plain": {Seq: 7}} {
				// The forger writes as Mark does: the bucket cannot tell.
				if err := c.Mark(ctx, key, m); err != nil {
					t.Fatal(err)
				}
			}
			got, err := c.Marks(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 3 || got["plain"] != (Mark{Seq: 7}) || got["retried"].Seq != 5 || !got["retried"].Due.Equal(honest) {
				t.Errorf("marks %v: want plain at 7 and retried at 5 due %s, as written", got, honest)
			}
			if got["forged"].Seq != 6 || !got["forged"].Due.Equal(latest) {
				t.Errorf("forged mark read as %v, want seq 6 due %s (now + max delay + ack wait)", got["forged"], latest)
			}
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], `"order_key":"forged"`) || !strings.Contains(lines[0], `"seq":6`) ||
				!strings.Contains(lines[0], forged.UTC().Format(time.RFC3339Nano)) {
				t.Errorf("log:\n%s\nwant one line naming the key forged, its seq and due time", logs.String())
			}

			// Read again: the same mark is not logged again; changed, it is.
			if _, err := c.Marks(ctx); err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(logs.String(), "\n"); n != 1 {
				t.Errorf("%d log lines after a second read, want the mark logged once:\n%s", n, logs.String())
			}
			if err := c.Mark(ctx, "forged", Mark{Seq: 8, Due: forged}); err != nil {
				t.Fatal(err)
			}
			if got, err := c.Marks(ctx); err != nil || !got["forged"].Due.Equal(latest) {
				t.Errorf("forged mark rewritten read as %v, %v; want due %s", got["forged"], err, latest)
			}
			if n := strings.Count(logs.String(), "\n"); n != 2 || !strings.Contains(logs.String(), `"seq":8`) {
				t.Errorf("log after the mark changed:\n%s\nwant its new value logged", logs.String())
			}
			for _, key := range []string{"retried", "forged", "plain"} {
				if err := c.Unmark(ctx, key); err != nil {
					t.Fatal(err)
				}
			}
			if got, err := store.Marks(ctx); err != nil || len(got) != 0 {
				t.Errorf("marks after unmarking through Capped: %v, %v; want none", got, err)
			}
		})
	}
}
