package proxy_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/ordermark"
	"github.com/courierhq/courier/proxy"
)

// The features met together: the automatic limit and batches with the
// breaker, a stop, and order per key when the pin moves. With the
// automatic limit there are more workers than slots, so deliveries wait
// for a slot after their key's turn; whatever they waited for, what may
// stop them is checked when they go.

// limits are the ways of sending the combinations run with: the number in
// flight fixed or found (auto), each message alone or in batches.
var limits = []struct {
	name  string
	apply func(o *proxy.Options)
}{
	{"fixed", func(o *proxy.Options) {}},
	{"auto", func(o *proxy.Options) { o.InflightAuto = true }},
	{"fixed, batches", func(o *proxy.Options) { o.BatchMax, o.BatchWait = 8, 5*time.Millisecond }},
	{"auto, batches", func(o *proxy.Options) {
		o.InflightAuto, o.BatchMax, o.BatchWait = true, 8, 5*time.Millisecond
	}},
}

// arrivals is an app that records when each request arrived and answers
// with status after took.
type arrivals struct {
	mu     sync.Mutex
	at     []time.Time
	took   atomic.Int64 // how long it takes to answer, in nanoseconds
	status atomic.Int32
	open   atomic.Int32 // requests at the app now
	cut    atomic.Int32 // requests whose client went away before the answer
}

func newArrivals(t *testing.T, e *env, took time.Duration, status int) *arrivals {
	a := &arrivals{}
	a.took.Store(int64(took))
	a.status.Store(int32(status))
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return a
}

func (a *arrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.at = append(a.at, time.Now())
	a.mu.Unlock()
	a.open.Add(1)
	defer a.open.Add(-1)
	select {
	case <-time.After(time.Duration(a.took.Load())):
	case <-r.Context().Done():
		a.cut.Add(1)
		return
	}
	w.WriteHeader(int(a.status.Load()))
}

// since counts the requests that arrived after t, and all of them.
func (a *arrivals) since(t time.Time) (after, all int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, at := range a.at {
		if at.After(t) {
			after++
		}
	}
	return after, len(a.at)
}

// Once the breaker opens, no request reaches the app until its probe, in
// every way of sending: not those that waited for a slot or for their
// batch when it opened.
func TestNoRequestThroughAnOpenBreaker(t *testing.T) {
	for _, l := range limits {
		t.Run(l.name, func(t *testing.T) {
			e := setup(t)
			app := newArrivals(t, e, 300*time.Millisecond, http.StatusServiceUnavailable)
			e.publish(t, 60, []byte("x"))
			o := proxy.Options{
				MaxDeliver: 20, MaxInflight: 32, AckWait: 30 * time.Second, BreakerFailures: 4,
				BreakerProbe: time.Minute, BackoffInitial: time.Second, BackoffMax: 2 * time.Second,
			}
			l.apply(&o)
			r, _ := e.runWith(t, nil, o)
			waitBreakerOpen(t, r)
			opened := time.Now()
			// What was written before the breaker opened may still be on
			// its way to the app's handler.
			grace := opened.Add(100 * time.Millisecond)
			time.Sleep(1500 * time.Millisecond) // real time is what is tested: nothing may arrive in it
			if after, all := app.since(grace); after != 0 {
				t.Errorf("%d requests reached the app in the 1.4 s after the breaker opened (of %d); want none before its probe", after, all)
			}
		})
	}
}

// After a stop, no request starts (but a message's last allowed delivery,
// which the grace period is for), and what was at the app finishes within
// the grace period: nothing is abandoned; every message not answered is
// given back, none lost.
func TestStopStartsNoRequest(t *testing.T) {
	for _, l := range limits {
		t.Run(l.name, func(t *testing.T) {
			e := setup(t)
			app := newArrivals(t, e, 400*time.Millisecond, http.StatusOK)
			e.publish(t, 80, []byte("x"))
			o := proxy.Options{
				MaxDeliver: 5, MaxInflight: 32, AckWait: 30 * time.Second, ShutdownGrace: 3 * time.Second,
			}
			l.apply(&o)
			_, stop := e.runWith(t, nil, o)
			poll.Until(t, 10*time.Second, "requests at the app", func() bool { return app.open.Load() > 0 })
			time.Sleep(500 * time.Millisecond) // some answered, more waiting for slots
			stopped := time.Now()
			stop()
			// A request written just before the stop may reach the handler
			// a moment later.
			if after, all := app.since(stopped.Add(50 * time.Millisecond)); after != 0 {
				t.Errorf("%d requests started after the stop (of %d); want none", after, all)
			}
			if n := app.cut.Load(); n != 0 {
				t.Errorf("%d requests abandoned at the end of the grace period, want none", n)
			}
			// What was not answered was given back: a courier started again
			// delivers all of it at once, not after an ack wait.
			app.took.Store(0)
			e.reg = prometheus.NewRegistry()
			e.runWith(t, nil, proxy.Options{MaxDeliver: 5, MaxInflight: 32, AckWait: 30 * time.Second})
			poll.Until(t, 15*time.Second, "every message delivered after the restart", func() bool { return e.settled(t) })
			if got := e.deadLetters(t); got != 0 {
				t.Errorf("%d dead letters, want none", got)
			}
		})
	}
}

// With order per key, the pin moved away from a courier that lives (an
// operator's unpin): the heads it admitted and that still wait for a slot
// are given back, not sent after the courier pinned now sent their keys'
// next messages. Every key reaches the app in stream order.
func TestOrderWhenThePinMovesFromALiveCourier(t *testing.T) {
	for _, l := range limits {
		t.Run(l.name, func(t *testing.T) {
			s := natstest.Start(t, natstest.Options{})
			_, js := natstest.Connect(t, s)
			ctx := context.Background()
			streams(t, js)
			if _, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{
				Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 10, AckWait: 2 * time.Second,
				PriorityPolicy: jetstream.PriorityPolicyPinned, PriorityGroups: []string{"courier"}, PinnedTTL: 5 * time.Second,
			}); err != nil {
				t.Fatal(err)
			}
			a := &orderApp{t: t, busy: map[string]bool{}, ok: map[string][]int{}, took: time.Second}
			served := map[string]*atomic.Int32{"a": {}, "b": {}}
			replica := func(name string) {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					served[name].Add(1)
					a.ServeHTTP(w, r)
				}))
				t.Cleanup(srv.Close)
				o := orderOptions(t)
				if testing.Verbose() {
					o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("replica", name)
				}
				// More heads than the limit lets go at once wait for slots
				// longer than the courier pinned next awaits them (an ack
				// wait and 2 s).
				o.MaxInflight, o.AckWait = 32, 2*time.Second
				l.apply(&o)
				marks, err := ordermark.Open(ctx, js, "S", "c", 1)
				if err != nil {
					t.Fatal(err)
				}
				o.AppURL, o.Stream, o.Consumer, o.Registerer = srv.URL, "S", "c", prometheus.NewRegistry()
				o.OrderMarks, o.PriorityGroup = marks, "courier"
				_, rjs := natstest.Connect(t, s)
				rcons, err := rjs.Consumer(ctx, "S", "c")
				if err != nil {
					t.Fatal(err)
				}
				r, err := proxy.New(rcons, dlq.NewPublisher(rjs, "dlq.s"), nil, o)
				if err != nil {
					t.Fatal(err)
				}
				runCtx, cancel := context.WithCancel(ctx)
				var wg sync.WaitGroup
				wg.Add(1)
				go func() { defer wg.Done(); _ = r.Run(runCtx) }()
				t.Cleanup(func() { cancel(); wg.Wait() })
			}
			keys := make([]string, 24)
			for i := range keys {
				keys[i] = fmt.Sprintf("k%d", i)
			}
			n := 0
			publish := func() {
				for _, k := range keys {
					m := nats.NewMsg("s.order")
					m.Header.Set("Order", k)
					m.Header.Set("N", strconv.Itoa(n))
					if _, err := js.PublishMsg(ctx, m); err != nil {
						t.Fatal(err)
					}
				}
				n++
			}
			publish()
			publish()
			replica("a")
			replica("b")
			stream, err := js.Stream(ctx, "S")
			if err != nil {
				t.Fatal(err)
			}
			// The pin moved by an operator while both couriers live, every
			// 1.5 s, with messages published throughout: the one pinned
			// before learns that it is no longer when it pulls, its heads
			// waiting for slots meanwhile.
			for range 3 {
				time.Sleep(1500 * time.Millisecond)
				if err := stream.UnpinConsumer(ctx, "c", "courier"); err != nil {
					t.Fatal(err)
				}
				publish()
			}
			poll.Until(t, 90*time.Second, "every key delivered", func() bool {
				for _, k := range keys {
					if len(a.delivered(k)) < n {
						return false
					}
				}
				return true
			})
			checkOrdered(t, a, keys, n)
			if served["a"].Load() == 0 || served["b"].Load() == 0 {
				t.Errorf("the pin never moved: the couriers served %d and %d requests", served["a"].Load(), served["b"].Load())
			}
		})
	}
}

// While the consumer is paused, no request starts, in every way of
// sending: not those that waited for a slot or for their batch when the
// pause was seen; after the resume everything is delivered.
func TestNoRequestWhilePaused(t *testing.T) {
	for _, l := range limits {
		t.Run(l.name, func(t *testing.T) {
			e := setup(t)
			app := newArrivals(t, e, 300*time.Millisecond, http.StatusOK)
			e.publish(t, 80, []byte("x"))
			o := proxy.Options{MaxDeliver: 5, MaxInflight: 32, AckWait: 30 * time.Second, InfoInterval: 50 * time.Millisecond}
			l.apply(&o)
			r, _ := e.runWith(t, nil, o)
			poll.Until(t, 10*time.Second, "requests at the app", func() bool { return app.open.Load() > 0 })
			ctx := context.Background()
			if _, err := e.js.PauseConsumer(ctx, "S", "c", time.Now().Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
			poll.Until(t, 10*time.Second, "the pause seen", func() bool { return r.Ready() != nil })
			seen := time.Now()
			time.Sleep(1500 * time.Millisecond) // real time is what is tested: nothing may start in it
			if after, all := app.since(seen.Add(100 * time.Millisecond)); after != 0 {
				t.Errorf("%d requests started while the consumer was paused (of %d); want none", after, all)
			}
			if _, err := e.js.ResumeConsumer(ctx, "S", "c"); err != nil {
				t.Fatal(err)
			}
			poll.Until(t, 30*time.Second, "every message settled after the resume", func() bool { return e.settled(t) })
		})
	}
}
