package proxy_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// rewinds is a rewind of stream S's sequences from..to, once set.
type rewinds struct{ from, to atomic.Uint64 }

func (r *rewinds) Replay(stream string, seq uint64) string {
	if stream == "S" && seq >= r.from.Load() && seq <= r.to.Load() {
		return "r1"
	}
	return ""
}

func (r *rewinds) Superseded(string, uint64, uint64, int, time.Time) bool { return false }

// Messages a rewind delivers again reach the app although their keys were
// recorded, once each per rewind (two copies of a key in the range are one
// call; delivered a third time, they are duplicates), marked with the
// rewind (Courier-Replay alone, "replay" in a batch's entry); those outside
// its range are duplicates as before.
func TestReplayOncePerRewind(t *testing.T) {
	for _, tc := range []struct {
		name  string
		batch int
	}{{"alone", 1}, {"batch", 4}} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t)
			var mu sync.Mutex
			var replays []string
			var batches atomic.Int32
			app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				if r.Header.Get("Courier-Batch") == "" {
					replays = append(replays, r.Header.Get(proxy.HeaderIdempotencyKey)+"/"+r.Header.Get(proxy.HeaderReplay))
					return
				}
				batches.Add(1)
				var body struct {
					Entries []struct{ IdempotencyKey, Replay string }
				}
				if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
					t.Error(err)
				}
				for _, en := range body.Entries {
					replays = append(replays, en.IdempotencyKey+"/"+en.Replay)
				}
			}))
			t.Cleanup(app.Close)
			e.url = app.URL
			seen := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(replays) }
			rw := &rewinds{}
			rw.from.Store(1 << 62) // none yet
			_, stop := e.runWith(t, openStore(t), proxy.Options{MaxDeliver: 5, AckWait: 5 * time.Second, MaxInflight: 1,
				BatchMax: tc.batch, BatchWait: 20 * time.Millisecond, BatchBytes: 1 << 20,
				BackoffInitial: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond, Rewinds: rw})
			defer stop()
			for _, k := range []string{"a", "b", "c", "b"} { // sequences 1 to 4
				e.publishKeyed(t, "s.x", k)
			}
			poll.Until(t, 10*time.Second, "first deliveries settled", func() bool { return len(seen()) == 3 && e.settled(t) })

			rw.from.Store(2)
			rw.to.Store(4)
			reset := func() {
				t.Helper()
				if _, err := e.js.ResetConsumerToSequence(context.Background(), "S", "c", 1); err != nil {
					t.Fatal(err)
				}
			}
			reset()
			poll.Until(t, 10*time.Second, "the range delivered again", func() bool { return len(seen()) == 5 && e.settled(t) })
			// The same rewind's range once more: duplicates now. The sleep
			// gives a wrong call the time to happen.
			reset()
			time.Sleep(300 * time.Millisecond)
			poll.Until(t, 10*time.Second, "settled", func() bool { return e.settled(t) })
			want := []string{"a/", "b/", "c/", "b/r1", "c/r1"}
			if got := seen(); !slices.Equal(got, want) {
				t.Errorf("the app saw %v, want %v", got, want)
			}
			if got := counter(t, e.reg, "courier_replayed_total", ""); got != 2 {
				t.Errorf("courier_replayed_total = %v, want 2", got)
			}
			if got := batches.Load(); (got > 0) != (tc.batch > 1) {
				t.Errorf("%d batch requests with COURIER_BATCH_MAX %d", got, tc.batch)
			}
		})
	}
}

// A message in flight when the rewind comes, and the rewind's copy of it
// that the reset delivers meanwhile: the app sees it once.
func TestReplayOfAMessageInFlightIsItsDuplicate(t *testing.T) {
	e := setup(t)
	var calls atomic.Int32
	release := make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			<-release
		}
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
	rw := &rewinds{}
	rw.from.Store(1 << 62)
	_, stop := e.runWith(t, openStore(t), proxy.Options{MaxDeliver: 5, AckWait: 5 * time.Second, MaxInflight: 4,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond, Rewinds: rw})
	defer stop()
	e.publishKeyed(t, "s.x", "a")
	poll.Until(t, 10*time.Second, "the first delivery in flight", func() bool { return calls.Load() == 1 })
	rw.from.Store(1)
	rw.to.Store(1)
	if _, err := e.js.ResetConsumerToSequence(context.Background(), "S", "c", 1); err != nil {
		t.Fatal(err)
	}
	// The reset's copy is fetched and waits for the delivery in flight.
	poll.Until(t, 10*time.Second, "the copy fetched", func() bool {
		info, err := e.cons.Info(context.Background())
		return err == nil && info.NumPending == 0 && info.Delivered.Consumer == 1
	})
	close(release)
	poll.Until(t, 10*time.Second, "settled", func() bool { return e.settled(t) })
	if got := calls.Load(); got != 1 {
		t.Errorf("the app saw the message %d times, want once", got)
	}
	if got := counter(t, e.reg, "courier_replayed_total", ""); got != 0 {
		t.Errorf("courier_replayed_total = %v, want 0", got)
	}
}
