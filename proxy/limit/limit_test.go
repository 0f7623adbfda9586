package limit_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courierhq/courier/proxy/limit"
	"github.com/courierhq/courier/proxy/limit/limitsim"
)

// eventually polls cond until it holds, failing the test after d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFixedBoundsExactly(t *testing.T) {
	for _, n := range []int{1, 8} {
		l := limit.NewFixed(n)
		var (
			mu      sync.Mutex
			in, top int
			wg      sync.WaitGroup
			release = make(chan struct{})
		)
		for i := range 4 * n {
			wg.Go(func() {
				s, err := l.Acquire(context.Background(), limit.Reason(i%4))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				in++
				top = max(top, in)
				mu.Unlock()
				<-release
				mu.Lock()
				in--
				mu.Unlock()
				s.Release([...]limit.Outcome{limit.Success, limit.Overload, limit.Timeout, limit.Failed}[i%4])
			})
		}
		eventually(t, 5*time.Second, "all but n wait", func() bool {
			st := l.Stats()
			return st.InFlight == n && st.Waiting == 3*n
		})
		if _, ok := l.TryAcquire(limit.Deliver); ok {
			t.Errorf("fixed %d: TryAcquire took an (n+1)th slot", n)
		}
		close(release)
		wg.Wait()
		st := l.Stats()
		if top != n || st.InFlight != 0 || st.Limit != n || st.Auto || st.Changes != ([len(st.Changes)]uint64{}) {
			t.Errorf("fixed %d: at most %d at once, then %+v; want exactly %d at once and an unchanged limit", n, top, st, n)
		}
	}
}

func TestFixedAdmitsInOrder(t *testing.T) {
	l := limit.NewFixed(1)
	first, _ := l.TryAcquire(limit.Deliver)
	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 5 {
		eventually(t, 5*time.Second, "waiter in line", func() bool { return l.Stats().Waiting == i })
		wg.Go(func() {
			s, err := l.Acquire(context.Background(), limit.Retry)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			s.Release(limit.Success)
		})
	}
	eventually(t, 5*time.Second, "five waiting", func() bool { return l.Stats().Waiting == 5 })
	first.Release(limit.Success)
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("admitted in order %v, want first come first served", order)
		}
	}
}

func TestAcquireHonoursContext(t *testing.T) {
	for _, l := range []*limit.Limiter{limit.NewFixed(2), limit.NewAuto(limit.AutoOptions{Max: 2, Initial: 2})} {
		held := []*limit.Slot{}
		for {
			s, ok := l.TryAcquire(limit.Deliver)
			if !ok {
				break
			}
			held = append(held, s)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			s, err := l.Acquire(ctx, limit.Batch)
			if s != nil {
				t.Error("a slot returned with an error")
			}
			errc <- err
		}()
		eventually(t, 5*time.Second, "the caller waits", func() bool { return l.Stats().Waiting == 1 })
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("Acquire returned %v, want context.Canceled", err)
		}
		st := l.Stats()
		if st.Waiting != 0 || st.InFlight != len(held) || st.InFlightBy[limit.Batch] != 0 {
			t.Errorf("after a cancelled Acquire: %+v, want nobody waiting and %d in flight", st, len(held))
		}
		// The place it did not take is free for the next.
		held[0].Release(limit.Dropped)
		if _, ok := l.TryAcquire(limit.Deliver); !ok {
			t.Error("a released place was not free")
		}
		if _, err := l.Acquire(ctx, limit.Deliver); !errors.Is(err, context.Canceled) {
			t.Errorf("Acquire with an ended context returned %v", err)
		}
	}
}

// Dropped outcomes (no answer: the app unreachable, the breaker, shutdown)
// and a second Release of the same slot change nothing.
func TestDroppedTeachesNothing(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	l := limit.NewAuto(limit.AutoOptions{Now: clock})
	before := l.Stats()
	for range 1000 {
		s, ok := l.TryAcquire(limit.Deliver)
		if !ok {
			t.Fatal("no slot free")
		}
		mu.Lock()
		now = now.Add(time.Second) // a very slow non-answer
		mu.Unlock()
		s.Release(limit.Dropped)
		s.Release(limit.Timeout) // ignored: released already
	}
	after := l.Stats()
	if after != before {
		t.Errorf("after 1000 dropped requests %+v, was %+v", after, before)
	}
}

// The limiter in real time against an app of goroutines: a real concurrent
// run with the machine's own noise. It asserts the app's queue, not speed.
func TestAutoAgainstAConcurrentApp(t *testing.T) {
	const w, d = 4, 5 * time.Millisecond
	app := limitsim.NewApp(w, d)
	l := limit.NewAuto(limit.AutoOptions{Max: 32})
	ctx, cancel := context.WithCancel(context.Background())
	var stopped atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		limitsim.Load(ctx, l, app, 64)
		stopped.Store(true)
	}()
	t.Cleanup(func() { cancel(); <-done })

	eventually(t, 10*time.Second, "the limit rises past its start", func() bool { return l.Limit() > 4 })
	eventually(t, 10*time.Second, "a settled second", func() bool {
		s := app.Snapshot()
		time.Sleep(time.Second) // real time is what is measured here
		sp := limitsim.Between(s, app.Snapshot())
		t.Logf("%.0f/s, %.2f inside, limit %d, minRTT %v", sp.PerSecond, sp.MeanInside, l.Limit(), l.MinRTT())
		return sp.MeanInside <= 1.5*w
	})
	if st := l.Stats(); st.Limit < 1 || st.Limit > 32 || st.MinRTT < d {
		t.Errorf("limit %d (want within [1, 32]), minRTT %v (want at least %v)", st.Limit, st.MinRTT, d)
	}
	if stopped.Load() {
		t.Error("the load stopped early")
	}
}

// BenchmarkAcquireRelease is the limiter's own cost per request, all
// goroutines sharing one limiter (the instant app of limitsim measures the same
// with an app in the loop).
func BenchmarkAcquireRelease(b *testing.B) {
	for _, k := range []struct {
		name string
		new  func() *limit.Limiter
	}{
		{"fixed 64", func() *limit.Limiter { return limit.NewFixed(64) }},
		{"auto", func() *limit.Limiter { return limit.NewAuto(limit.AutoOptions{}) }},
	} {
		b.Run(k.name, func(b *testing.B) {
			l := k.new()
			ctx := context.Background()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					s, err := l.Acquire(ctx, limit.Deliver)
					if err != nil {
						b.Error(err)
						return
					}
					s.Release(limit.Success)
				}
			})
		})
	}
}
