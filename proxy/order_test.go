package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/batch"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/orderkey"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
	"github.com/courierhq/courier/ordermark"
	"github.com/courierhq/courier/proxy"
)

// orderApp records, per key, the sequence numbers (the "n" header) of
// the requests it answered 2xx, in the order it answered them, and fails
// checks that a request of a key never arrives while another of that key
// is being handled.
type orderApp struct {
	t        *testing.T
	mu       sync.Mutex
	answer   func(key string, n, attempt int) (status int, retryAfter string)
	busy     map[string]bool
	ok       map[string][]int
	overlaps int
	took     time.Duration
	inflight int // requests at the app now, and the most at once
	most     int
}

func newOrderApp(t *testing.T, e *env, answer func(key string, n, attempt int) (int, string)) *orderApp {
	a := &orderApp{t: t, answer: answer, busy: map[string]bool{}, ok: map[string][]int{}}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return a
}

func (a *orderApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Content-Type") == batch.ContentType {
		a.serveBatch(w, r)
		return
	}
	key := r.Header.Get("Order")
	n, _ := strconv.Atoi(r.Header.Get("N"))
	attempt, _ := strconv.Atoi(r.Header.Get(proxy.HeaderAttempt))
	a.mu.Lock()
	if key != "" && a.busy[key] {
		a.overlaps++
	}
	a.busy[key] = true
	a.inflight++
	a.most = max(a.most, a.inflight)
	took := a.took
	a.mu.Unlock()
	time.Sleep(took)
	status, retryAfter := 200, ""
	if a.answer != nil {
		status, retryAfter = a.answer(key, n, attempt)
	}
	a.mu.Lock()
	a.busy[key] = false
	a.inflight--
	if status < 300 {
		a.ok[key] = append(a.ok[key], n)
	}
	a.mu.Unlock()
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.WriteHeader(status)
}

// serveBatch takes a batch as ServeHTTP takes a message, each entry by
// the Order and N of its headers; every entry is answered 2xx.
func (a *orderApp) serveBatch(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Entries []wireEntry `json:"entries"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	for _, e := range body.Entries {
		key := http.Header(e.Headers).Get("Order")
		if key != "" && a.busy[key] {
			a.overlaps++
		}
		a.busy[key] = true
	}
	a.inflight++
	a.most = max(a.most, a.inflight)
	took := a.took
	a.mu.Unlock()
	time.Sleep(took)
	a.mu.Lock()
	for _, e := range body.Entries {
		h := http.Header(e.Headers)
		n, _ := strconv.Atoi(h.Get("N"))
		a.busy[h.Get("Order")] = false
		a.ok[h.Get("Order")] = append(a.ok[h.Get("Order")], n)
	}
	a.inflight--
	a.mu.Unlock()
}

func (a *orderApp) delivered(key string) []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]int(nil), a.ok[key]...)
}

// publishOrdered publishes n messages for each key, interleaved, each with
// its key in the Order header and its place in the N header.
func publishOrdered(t *testing.T, e *env, keys []string, n int) {
	t.Helper()
	for i := range n {
		for _, k := range keys {
			m := nats.NewMsg("s.order")
			m.Header.Set("Order", k)
			m.Header.Set("N", strconv.Itoa(i))
			m.Data = []byte(k)
			if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func orderOptions(t *testing.T) proxy.Options {
	t.Helper()
	key, err := orderkey.Parse("header:Order")
	if err != nil {
		t.Fatal(err)
	}
	return proxy.Options{
		MaxDeliver: 5, MaxInflight: 8, OrderKey: key, AckWait: 5 * time.Second,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond, BreakerFailures: 0,
	}
}

func inOrder(got []int, n int) bool {
	if len(got) != n {
		return false
	}
	for i, v := range got {
		if v != i {
			return false
		}
	}
	return true
}

// Messages of one key reach the app one at a time, in stream order, though
// their early messages fail (503 twice, 429 with Retry-After) and eight
// workers run: a retry holds back its key's later messages until it is
// settled; other keys go on.
func TestOrderPerKeyThroughRetries(t *testing.T) {
	e := setup(t)
	a := newOrderApp(t, e, func(key string, n, attempt int) (int, string) {
		switch {
		case key == "k0" && n == 0 && attempt <= 2:
			return 503, ""
		case key == "k1" && n == 1 && attempt == 1:
			return 429, "1"
		case key == "k2" && n%3 == 0 && attempt == 1:
			return 503, ""
		}
		return 200, ""
	})
	keys := []string{"k0", "k1", "k2", "k3", "k4"}
	const n = 12
	publishOrdered(t, e, keys, n)
	e.runWith(t, nil, orderOptions(t))
	poll.Until(t, 30*time.Second, "every message settled", func() bool { return e.settled(t) })
	for _, k := range keys {
		if got := a.delivered(k); !inOrder(got, n) {
			t.Errorf("%s delivered in the order %v, want 0..%d", k, got, n-1)
		}
	}
	if a.overlaps != 0 {
		t.Errorf("%d requests of a key while an earlier one of the key was at the app", a.overlaps)
	}
}

// A key whose first message always fails is dead-lettered after its budget
// while 999 other keys drain; its later messages then go on, and the dead
// letter says how many waited. None of them reaches the app before the
// head's last attempt is answered.
func TestOrderFailingKeyHoldsOnlyItself(t *testing.T) {
	e := setup(t)
	var headDone atomic.Bool // the head's last attempt answered
	var early atomic.Int32   // later messages of bad sent before that
	a := newOrderApp(t, e, func(key string, n, attempt int) (int, string) {
		switch {
		case key == "bad" && n == 0:
			if attempt == 5 { // orderOptions' MaxDeliver
				headDone.Store(true)
			}
			return 503, ""
		case key == "bad" && !headDone.Load():
			early.Add(1)
		}
		return 200, ""
	})
	keys := append(numbered("k", 999), "bad")
	const n = 4
	publishOrdered(t, e, keys, n)
	o := orderOptions(t)
	o.BackoffInitial, o.BackoffMax = 500*time.Millisecond, 800*time.Millisecond
	e.runWith(t, nil, o)
	poll.Until(t, 30*time.Second, "every other key delivered", func() bool {
		for _, k := range keys[:999] {
			if len(a.delivered(k)) != n {
				return false
			}
		}
		return true
	})
	poll.Until(t, 30*time.Second, "every message settled", func() bool { return e.settled(t) })
	if got := early.Load(); got != 0 {
		t.Errorf("%d of bad's later messages went before its first was settled", got)
	}
	if got := a.delivered("bad"); fmt.Sprint(got) != "[1 2 3]" {
		t.Errorf("bad delivered %v after its first was dead-lettered, want [1 2 3]", got)
	}
	dl := deadLetterHeaders(t, e)
	// What courier had fetched of the key waited: of 4,000 messages, the
	// later ones of bad may not all have been fetched yet.
	if len(dl) != 1 || dl[0].Get(dlq.HeaderOrderKey) != "bad" {
		t.Fatalf("dead letters %v, want one for bad", dl)
	}
	if w, err := strconv.Atoi(dl[0].Get(dlq.HeaderOrderWaiting)); err != nil || w < 0 || w > 3 {
		t.Errorf("%s %q, want how many of bad's 3 later messages were held", dlq.HeaderOrderWaiting, dl[0].Get(dlq.HeaderOrderWaiting))
	}
}

func deadLetterHeaders(t *testing.T, e *env) []nats.Header {
	t.Helper()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, dlq.StreamName("dlq.s"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []nats.Header
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		if m, err := s.GetMsg(ctx, seq); err == nil {
			out = append(out, m.Header)
		}
	}
	return out
}

// Messages without the key are not ordered: with a slow app, eight of them
// are at the app at once.
func TestOrderUnkeyedGoInParallel(t *testing.T) {
	e := setup(t)
	a := newOrderApp(t, e, nil)
	a.took = 300 * time.Millisecond
	for range 16 {
		if _, err := e.js.Publish(context.Background(), "s.plain", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	e.runWith(t, nil, orderOptions(t))
	poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })
	if len(a.delivered("")) != 16 {
		t.Errorf("%d unkeyed delivered, want 16", len(a.delivered("")))
	}
	if a.most != 8 {
		t.Errorf("at most %d unkeyed messages at the app at once, want 8 (COURIER_MAX_INFLIGHT)", a.most)
	}
}

// One key with a slow app: its messages go one at a time, in order, while
// the workers are free (the others wait on nothing).
func TestOrderOneKeyOneAtATime(t *testing.T) {
	e := setup(t)
	a := newOrderApp(t, e, nil)
	a.took = 20 * time.Millisecond
	publishOrdered(t, e, []string{"only"}, 20)
	e.runWith(t, nil, orderOptions(t))
	poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })
	if got := a.delivered("only"); !inOrder(got, 20) {
		t.Errorf("delivered %v, want 0..19", got)
	}
	if a.most != 1 || a.overlaps != 0 {
		t.Errorf("%d at once (%d overlaps), want 1", a.most, a.overlaps)
	}
}

// Two replicas on a 3-node cluster, the durable pinned to one at a time:
// through an app outage of the pinned one longer than the pin's TTL the
// other receives nothing (the pin is kept), and when the pinned one stops
// the other takes over; every key's messages reach the app in stream
// order throughout.
func TestOrderReplicasOneAtATime(t *testing.T) {
	c, js, _ := orderCluster(t, 5, 5*time.Second, 2*time.Second)
	ctx := context.Background()

	// One record of what reached the app, from either replica.
	rec := &orderApp{t: t, busy: map[string]bool{}, ok: map[string][]int{}}
	got := map[string]*atomic.Int32{"a": {}, "b": {}}
	replica := func(name string) (*restartableApp, func()) {
		app := &restartableApp{addr: "127.0.0.1:0", h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got[name].Add(1)
			rec.ServeHTTP(w, r)
		})}
		app.start(t)
		t.Cleanup(func() { app.srv.Close() })
		var marks *ordermark.Store
		natstest.Try(t, "open the marks", func(ctx context.Context) error {
			var err error
			marks, err = ordermark.Open(ctx, js, "S", "c", 3)
			return err
		})
		o := orderOptions(t)
		o.AppURL, o.Stream, o.Consumer, o.Registerer = app.srv.URL, "S", "c", prometheus.NewRegistry()
		o.OrderMarks, o.PriorityGroup = marks, "courier"
		// A connection and a consumer handle of its own: the handle holds
		// the pin id its pulls send.
		_, rjs := natstest.ConnectURL(t, c.URL())
		var rcons jetstream.Consumer
		natstest.Try(t, "bind the consumer", func(ctx context.Context) error {
			var err error
			rcons, err = rjs.Consumer(ctx, "S", "c")
			return err
		})
		r, err := proxy.New(rcons, dlq.NewPublisher(rjs, "dlq.s"), nil, o)
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(runCtx) }()
		stop := sync.OnceFunc(func() { cancel(); wg.Wait() })
		t.Cleanup(stop)
		return app, stop
	}
	keys := []string{"k0", "k1", "k2", "k3"}
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			for _, k := range keys {
				m := nats.NewMsg("s.order")
				m.Header.Set("Order", k)
				m.Header.Set("N", strconv.Itoa(i))
				natstest.Try(t, "publish", func(ctx context.Context) error { _, err := js.PublishMsg(ctx, m); return err })
			}
		}
	}
	deliveredUpTo := func(n int) func() bool {
		return func() bool {
			for _, k := range keys {
				if len(rec.delivered(k)) < n {
					return false
				}
			}
			return true
		}
	}

	appA, stopA := replica("a")
	publish(0, 1)
	poll.Until(t, 20*time.Second, "the first messages delivered", deliveredUpTo(1))
	_, stopB := replica("b")
	defer stopB()
	if got["b"].Load() != 0 {
		t.Fatalf("b received %d messages while a was pinned", got["b"].Load())
	}

	// a's app goes away for three pin TTLs: a holds what it has and keeps
	// the pin; b receives nothing.
	appA.srv.Close()
	publish(1, 4)
	time.Sleep(6 * time.Second) // longer than the pin's TTL: real time is what is tested
	if n := got["b"].Load(); n != 0 {
		t.Fatalf("b received %d messages while a held deliveries through its app's outage", n)
	}
	appA.start(t)
	poll.Until(t, 30*time.Second, "a delivering again", deliveredUpTo(4))

	// a stops; b takes the pin and goes on.
	stopA()
	publish(4, 7)
	poll.Until(t, 30*time.Second, "b delivering after a stopped", deliveredUpTo(7))
	if got["b"].Load() == 0 {
		t.Error("b delivered nothing after a stopped")
	}
	for _, k := range keys {
		if d := rec.delivered(k); !inOrder(d, 7) {
			t.Errorf("%s delivered in the order %v, want 0..6", k, d)
		}
	}
}

// On a 3-node cluster, the stream leader lost while keys are being
// delivered and retried: every key still reaches the app in stream order.
func TestOrderThroughStreamLeaderLoss(t *testing.T) {
	c, js, cons := orderCluster(t, 10, 5*time.Second, 5*time.Second)
	ctx := context.Background()
	rec := &orderApp{t: t, busy: map[string]bool{}, ok: map[string][]int{}}
	rec.answer = func(key string, n, attempt int) (int, string) {
		if n%4 == 1 && attempt == 1 {
			return 503, "" // some retries on the way
		}
		return 200, ""
	}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	var marks *ordermark.Store
	natstest.Try(t, "open the marks", func(ctx context.Context) error {
		var err error
		marks, err = ordermark.Open(ctx, js, "S", "c", 3)
		return err
	})
	o := orderOptions(t)
	o.AppURL, o.Stream, o.Consumer, o.Registerer = srv.URL, "S", "c", prometheus.NewRegistry()
	o.OrderMarks, o.PriorityGroup, o.MaxDeliver = marks, "courier", 10
	// The dedup store, as courier runs by default: an ack lost in the
	// leader change brings a settled message back, after later ones of its
	// key; the store knows it, and it is acked without a call.
	r, err := proxy.New(cons, dlq.NewPublisher(js, "dlq.s"), openStore(t), o)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = r.Run(runCtx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	keys := []string{"k0", "k1", "k2", "k3", "k4"}
	const n = 12
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			for _, k := range keys {
				m := nats.NewMsg("s.order")
				m.Header.Set("Order", k)
				m.Header.Set("N", strconv.Itoa(i))
				m.Header.Set("Nats-Msg-Id", fmt.Sprintf("%s-%d", k, i)) // a retried publish is stored once
				natstest.Try(t, "publish", func(ctx context.Context) error { _, err := js.PublishMsg(ctx, m); return err })
			}
		}
	}
	publish(0, n/2)
	poll.Until(t, 30*time.Second, "the first messages delivered", func() bool { return len(rec.delivered("k0")) >= 2 })
	c.Shutdown(c.StreamLeader("S"))
	publish(n/2, n)
	poll.Until(t, 60*time.Second, "every key delivered", func() bool {
		for _, k := range keys {
			if len(rec.delivered(k)) < n {
				return false
			}
		}
		return true
	})
	for _, k := range keys {
		if d := rec.delivered(k); !inOrder(d, n) {
			t.Errorf("%s delivered in the order %v, want 0..%d", k, d, n-1)
		}
	}
	if rec.overlaps != 0 {
		t.Errorf("%d requests of a key while an earlier one was at the app", rec.overlaps)
	}
}

// orderCluster starts a 3-node cluster with stream S (s.>) and its
// dead-letter stream on three replicas, and durable "c" pinned to one
// courier at a time (priority group "courier"), with the ack wait and pin
// TTL given.
func orderCluster(t *testing.T, maxDeliver int, ackWait, pinnedTTL time.Duration) (*natstest.Cluster, jetstream.JetStream, jetstream.Consumer) {
	t.Helper()
	c := natstest.StartCluster(t, 3, natstest.ClusterOptions{})
	_, js := natstest.ConnectURL(t, c.URL())
	natstest.Try(t, "create the stream", func(ctx context.Context) error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3})
		return err
	})
	natstest.Try(t, "create the dead-letter stream", func(ctx context.Context) error {
		_, _, err := dlq.EnsureStream(ctx, js, "dlq.s", 3)
		return err
	})
	var cons jetstream.Consumer
	natstest.Try(t, "create the pinned consumer", func(ctx context.Context) error {
		var err error
		cons, err = js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{
			Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: maxDeliver, AckWait: ackWait,
			PriorityPolicy: jetstream.PriorityPolicyPinned, PriorityGroups: []string{"courier"}, PinnedTTL: pinnedTTL,
		})
		return err
	})
	return c, js, cons
}

// newOrderAppLater is an orderApp that starts listening when the returned
// function is called: an app outage from the start.
func newOrderAppLater(t *testing.T, e *env) (*orderApp, func()) {
	listen := appLater(t, e)
	a := &orderApp{t: t, busy: map[string]bool{}, ok: map[string][]int{}}
	return a, func() { listen(a) }
}

// checkOrdered fails the test unless every key's n messages reached the app
// in stream order, none while an earlier one of its key was there.
func checkOrdered(t *testing.T, a *orderApp, keys []string, n int) {
	t.Helper()
	for _, k := range keys {
		if got := a.delivered(k); !inOrder(got, n) {
			t.Errorf("%s delivered in the order %v, want 0..%d", k, got, n-1)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.overlaps != 0 {
		t.Errorf("%d requests of a key while an earlier one of the key was at the app", a.overlaps)
	}
}

// An app that cannot be reached holds every key where it is: once it
// listens, each key's messages go in stream order, none dead-lettered
// (MaxDeliver 2: the outage spends no attempt).
func TestOrderThroughAnAppOutage(t *testing.T) {
	e := setup(t)
	a, listen := newOrderAppLater(t, e)
	keys := numbered("k", 10)
	const n = 6
	publishOrdered(t, e, keys, n)
	o := orderOptions(t)
	o.MaxDeliver, o.HealthInterval = 2, 50*time.Millisecond
	e.runWith(t, nil, o)
	poll.Until(t, 10*time.Second, "the app counted unavailable", func() bool {
		return counter(t, e.reg, "courier_app_available", "") == 0
	})
	time.Sleep(300 * time.Millisecond) // an outage longer than the backoff, many times over
	listen()
	poll.Until(t, 30*time.Second, "every message settled", func() bool { return e.settled(t) })
	checkOrdered(t, a, keys, n)
	if got := e.deadLetters(t); got != 0 {
		t.Errorf("%d dead letters from an app outage, want none", got)
	}
}

// A storm opens the breaker while keys are under way; its probes and the
// messages it held keep each key's order, and everything is delivered once
// the app recovers.
func TestOrderThroughTheBreaker(t *testing.T) {
	e := setup(t)
	var storming atomic.Bool
	storming.Store(true)
	a := newOrderApp(t, e, func(string, int, int) (int, string) {
		if storming.Load() {
			return 503, ""
		}
		return 200, ""
	})
	keys := numbered("k", 8)
	const n = 5
	publishOrdered(t, e, keys, n)
	o := orderOptions(t)
	o.MaxDeliver, o.BreakerFailures, o.BreakerProbe = 20, 4, 100*time.Millisecond
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: o.MaxDeliver, AckWait: o.AckWait})
	r, _ := e.runWith(t, nil, o)
	waitBreakerOpen(t, r)
	storming.Store(false)
	poll.Until(t, 30*time.Second, "every message settled", func() bool { return e.settled(t) })
	checkOrdered(t, a, keys, n)
	if got := e.deadLetters(t); got != 0 {
		t.Errorf("%d dead letters from a storm, want none", got)
	}
}

// A key's head that outlives COURIER_MAX_AGE while it is retried is
// dead-lettered as expired, and the key goes on with the messages that
// waited behind it, in order.
func TestOrderExpiredHeadLetsTheKeyGoOn(t *testing.T) {
	e := setup(t)
	var headTries atomic.Int32
	a := newOrderApp(t, e, func(key string, n, _ int) (int, string) {
		if n == 0 {
			headTries.Add(1)
			return 503, ""
		}
		return 200, ""
	})
	publishOrdered(t, e, []string{"old"}, 1)
	o := orderOptions(t)
	o.MaxDeliver, o.MaxAge = 100, 1500*time.Millisecond
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: o.MaxDeliver, AckWait: o.AckWait})
	e.runWith(t, nil, o)
	poll.Until(t, 10*time.Second, "the head retried", func() bool { return headTries.Load() >= 2 })
	time.Sleep(500 * time.Millisecond) // the later ones younger than the head by this
	for i := 1; i <= 3; i++ {
		m := nats.NewMsg("s.order")
		m.Header.Set("Order", "old")
		m.Header.Set("N", strconv.Itoa(i))
		if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })
	if got := a.delivered("old"); fmt.Sprint(got) != "[1 2 3]" {
		t.Errorf("delivered %v after the head expired, want [1 2 3]", got)
	}
	dl := deadLetterHeaders(t, e)
	if len(dl) != 1 || dl[0].Get(dlq.HeaderReason) != dlq.ReasonExpired || dl[0].Get(dlq.HeaderOrderKey) != "old" {
		t.Errorf("dead letters %v, want the head, expired", dl)
	}
}

// The durable paused mid-run (and resumed) keeps each key's order: what
// courier holds goes on, nothing more is fetched meanwhile.
func TestOrderThroughAPause(t *testing.T) {
	e := setup(t)
	a := newOrderApp(t, e, nil)
	a.took = 10 * time.Millisecond
	keys := numbered("k", 6)
	const n = 10
	publishOrdered(t, e, keys, n)
	o := orderOptions(t)
	o.InfoInterval = 50 * time.Millisecond
	e.runWith(t, nil, o)
	poll.Until(t, 10*time.Second, "deliveries under way", func() bool { return len(a.delivered("k0")) >= 2 })
	ctx := context.Background()
	if _, err := e.js.PauseConsumer(ctx, "S", "c", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // paused a while
	if _, err := e.js.ResumeConsumer(ctx, "S", "c"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "every message settled", func() bool { return e.settled(t) })
	checkOrdered(t, a, keys, n)
}

// publishKeyed publishes N from..to-1 of key "k" to S.
func publishKeyed(t *testing.T, js jetstream.JetStream, from, to int) {
	t.Helper()
	publishKey(t, js, "k", from, to)
}

// publishKey publishes N from..to-1 of key to S.
func publishKey(t *testing.T, js jetstream.JetStream, key string, from, to int) {
	t.Helper()
	for n := from; n < to; n++ {
		m := nats.NewMsg("s.order")
		m.Header.Set("Order", key)
		m.Header.Set("N", strconv.Itoa(n))
		natstest.Try(t, "publish", func(ctx context.Context) error { _, err := js.PublishMsg(ctx, m); return err })
	}
}

// otherCourier is another courier of durable "c" on c, pinned by its
// first pull: it takes n messages, and keepPin keeps its pin with a pull
// no message fits in.
func otherCourier(t *testing.T, c *natstest.Cluster, n int) (held []jetstream.Msg, keepPin func()) {
	t.Helper()
	_, js := natstest.ConnectURL(t, c.URL())
	var cons jetstream.Consumer
	natstest.Try(t, "bind the consumer", func(ctx context.Context) error {
		var err error
		cons, err = js.Consumer(ctx, "S", "c")
		return err
	})
	natstest.Try(t, "take the messages", func(ctx context.Context) error {
		batch, err := cons.Fetch(n-len(held), jetstream.FetchMaxWait(2*time.Second), jetstream.FetchPriorityGroup("courier"))
		if err != nil {
			return err
		}
		for m := range batch.Messages() {
			held = append(held, m)
		}
		if len(held) < n {
			return fmt.Errorf("%d of %d taken", len(held), n)
		}
		return nil
	})
	return held, func() {
		if b, err := cons.Fetch(1, jetstream.FetchMaxBytes(1), jetstream.FetchMaxWait(100*time.Millisecond),
			jetstream.FetchPriorityGroup("courier")); err == nil {
			for range b.Messages() {
				t.Error("the other courier took a message with a pull none fits in")
			}
		}
	}
}

// standby runs a courier of durable "c" (order per key, priority group
// "courier", marks in marks) beside the other courier, and returns its
// app's record and its logs.
func standby(t *testing.T, js jetstream.JetStream, cons jetstream.Consumer, marks *ordermark.Store, ackWait time.Duration) (*orderApp, *testlog.Buffer) {
	t.Helper()
	e := &env{js: js, cons: cons, reg: prometheus.NewRegistry()}
	a := newOrderApp(t, e, nil)
	o := orderOptions(t)
	o.OrderMarks, o.PriorityGroup, o.AckWait, o.MaxDeliver = marks, "courier", ackWait, 10
	logs := &testlog.Buffer{}
	o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	e.runWith(t, nil, o)
	return a, logs
}

// whilePinned keeps the other courier's pin for d, its held messages in
// progress, so that the standby's start's wait for what others hold (the
// ack wait and 2s) runs out meanwhile.
func whilePinned(d time.Duration, keepPin func(), held []jetstream.Msg) {
	for start := time.Now(); time.Since(start) < d; {
		keepPin()
		for _, m := range held {
			_ = m.InProgress()
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// deliveredOnceTakenOver fails the test if the standby delivered any of
// key "k" while the other courier was pinned, or, once the pin has moved
// (the other no longer pulls), does not deliver its n messages in stream
// order.
func deliveredOnceTakenOver(t *testing.T, a *orderApp, n int) {
	t.Helper()
	if got := len(a.delivered("k")); got != 0 {
		t.Fatalf("the standby delivered %d messages while the other was pinned", got)
	}
	poll.Until(t, 30*time.Second, "k delivered", func() bool { return len(a.delivered("k")) == n })
	checkOrdered(t, a, []string{"k"}, n)
}

// retryMarked retries m, of key "k", in delay, and marks it, as courier
// does.
func retryMarked(t *testing.T, marks *ordermark.Store, m jetstream.Msg, delay time.Duration) {
	t.Helper()
	meta, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if err := marks.Mark(context.Background(), "k", ordermark.Mark{Seq: meta.Sequence.Stream, Due: time.Now().Add(delay)}); err != nil {
		t.Fatal(err)
	}
	if err := m.NakWithDelay(delay); err != nil {
		t.Fatal(err)
	}
}

// retryAwaited fails the test if key "k", whose first message's retry is
// far off, was delivered, or the courier waited for it as after a
// takeover.
func retryAwaited(t *testing.T, a *orderApp, logs *testlog.Buffer) {
	t.Helper()
	if got := a.delivered("k"); len(got) != 0 {
		t.Errorf("k delivered %v while its first message's retry is a minute away", got)
	}
	if strings.Contains(logs.String(), "keyed messages wait") {
		t.Errorf("the courier waited as after a takeover for a retry its mark names:\n%s", logs.String())
	}
}

func orderMarks(t *testing.T, js jetstream.JetStream) *ordermark.Store {
	t.Helper()
	var marks *ordermark.Store
	natstest.Try(t, "open the marks", func(ctx context.Context) error {
		var err error
		marks, err = ordermark.Open(ctx, js, "S", "c", 3)
		return err
	})
	return marks
}

// The pin comes to a standby courier from another that stopped pulling
// while it held a key's messages: the first of them retried with a delay
// that has run out, the others kept in progress until it stopped, each
// last at another time, so that they fall due after the pin has moved,
// one at a time and not in stream order (JETSTREAM.md, "Order"). The
// courier that takes the pin sends the first when it comes, and the others
// in stream order however they come back. On a 3-node cluster.
func TestOrderTakeoverWaitsForWhatFallsDueLater(t *testing.T) {
	const ackWait = 2 * time.Second
	c, js, cons := orderCluster(t, 10, ackWait, time.Second)
	publishKeyed(t, js, 0, 5)
	marks := orderMarks(t, js)
	// The other courier retries the first in 500ms and marks it, as
	// courier does, and keeps the others in progress.
	held, keepPin := otherCourier(t, c, 5)
	retryMarked(t, marks, held[0], 500*time.Millisecond)
	a, _ := standby(t, js, cons, marks, ackWait)
	whilePinned(ackWait+3*time.Second, keepPin, held[1:])
	// Its last signals: N 2 falls due first, then 3, 1 and 4, 300ms apart.
	for _, n := range []int{2, 3, 1, 4} {
		if err := held[n].InProgress(); err != nil {
			t.Fatal(err)
		}
		keepPin()
		time.Sleep(300 * time.Millisecond)
	}
	// It stops pulling: the pin moves once its TTL runs out.
	deliveredOnceTakenOver(t, a, 5)
}

// The pin comes to a standby courier from another that stopped pulling
// while a key's first message was with its app, kept in progress (no mark:
// nothing waited behind it): the key's later messages, published
// meanwhile, come new with the pin and wait for it to fall due. On a
// 3-node cluster.
func TestOrderTakeoverWaitsForAMessageInFlightElsewhere(t *testing.T) {
	const ackWait = 2 * time.Second
	c, js, cons := orderCluster(t, 10, ackWait, time.Second)
	publishKeyed(t, js, 0, 1)
	marks := orderMarks(t, js)
	held, keepPin := otherCourier(t, c, 1)
	a, _ := standby(t, js, cons, marks, ackWait)
	whilePinned(ackWait+3*time.Second, keepPin, held)
	publishKeyed(t, js, 1, 4)
	whilePinned(time.Second, keepPin, held)
	deliveredOnceTakenOver(t, a, 4)
}

// The pin comes to a standby courier from another that stopped pulling
// after it gave back what it held (as a courier whose pin moves does), but
// for a retry due in a minute, marked: what was given back goes at once,
// without waiting as after a takeover, and the retried key's later message
// waits for it. On a 3-node cluster.
func TestOrderTakeoverDoesNotWaitForARetryDueLater(t *testing.T) {
	const ackWait = 2 * time.Second
	c, js, cons := orderCluster(t, 10, ackWait, time.Second)
	publishKeyed(t, js, 0, 1)
	publishKey(t, js, "j", 0, 2)
	marks := orderMarks(t, js)
	held, keepPin := otherCourier(t, c, 3)
	retryMarked(t, marks, held[0], time.Minute)
	a, logs := standby(t, js, cons, marks, ackWait)
	whilePinned(ackWait+3*time.Second, keepPin, held[1:])
	publishKeyed(t, js, 1, 2)
	for _, m := range held[1:] {
		if err := m.Nak(); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 30*time.Second, "j delivered", func() bool { return len(a.delivered("j")) == 2 })
	checkOrdered(t, a, []string{"j"}, 2)
	retryAwaited(t, a, logs)
}

// A courier that starts after another gave back what it held and stopped
// (as at SIGTERM) but for a retry due in a minute, marked: the consumer
// has messages out, so its start waits for them (one ack wait, 30s here),
// but the pull the pin comes with brings them all back, and they go then,
// in stream order; the retried key's later message waits for it. On a
// 3-node cluster.
func TestOrderStartDoesNotWaitOnceAllIsBack(t *testing.T) {
	const ackWait = 30 * time.Second
	c, js, cons := orderCluster(t, 10, ackWait, time.Second)
	publishKeyed(t, js, 0, 1)
	publishKey(t, js, "j", 0, 3)
	marks := orderMarks(t, js)
	held, _ := otherCourier(t, c, 4)
	retryMarked(t, marks, held[0], time.Minute)
	publishKeyed(t, js, 1, 2)
	for _, n := range []int{3, 1, 2} { // given back, not in stream order
		if err := held[n].Nak(); err != nil {
			t.Fatal(err)
		}
	}
	a, logs := standby(t, js, cons, marks, ackWait)
	// Well within the start's wait (32s).
	poll.Until(t, 15*time.Second, "j delivered", func() bool { return len(a.delivered("j")) == 3 })
	checkOrdered(t, a, []string{"j"}, 3)
	retryAwaited(t, a, logs)
}

// losingConsumer is a real consumer whose pulls lose the messages lose
// picks, once each, as a connection that breaks loses a pull's messages on
// their way (the server counts them delivered; they come back after their
// ack wait), and counts a reconnection for each: a failure that cannot be
// produced at a chosen message for real.
type losingConsumer struct {
	jetstream.Consumer
	lose       func(m jetstream.Msg) bool
	reconnects atomic.Uint64
}

func (c *losingConsumer) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := c.Consumer.Fetch(n, opts...)
	if err != nil {
		return b, err
	}
	out := make(chan jetstream.Msg)
	go func() {
		defer close(out)
		for m := range b.Messages() {
			if c.lose(m) {
				c.reconnects.Add(1)
				continue
			}
			out <- m
		}
	}()
	return &losingBatch{MessageBatch: b, out: out}, nil
}

type losingBatch struct {
	jetstream.MessageBatch
	out chan jetstream.Msg
}

func (b *losingBatch) Messages() <-chan jetstream.Msg { return b.out }

// A pull's message lost with the connection (the server counts it
// delivered, and delivers it again only after its ack wait): its key's
// later messages, which arrive after the reconnection, wait for it
// rather than go first.
func TestOrderMessageLostWithTheConnectionIsAwaited(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	const ackWait = 2 * time.Second
	cons, err := e.js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{
		Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5, AckWait: ackWait,
	})
	if err != nil {
		t.Fatal(err)
	}
	lc := &losingConsumer{Consumer: cons}
	lc.lose = func(m jetstream.Msg) bool {
		meta, err := m.Metadata()
		return err == nil && meta.NumDelivered == 1 && m.Headers().Get("Order") == "k0" && m.Headers().Get("N") == "2"
	}
	e.cons = lc
	a := newOrderApp(t, e, nil)
	keys := []string{"k0", "k1"}
	const n = 6
	publishOrdered(t, e, keys, n)
	o := orderOptions(t)
	o.AckWait, o.Reconnects = ackWait, lc.reconnects.Load
	e.runWith(t, nil, o)
	poll.Until(t, 30*time.Second, "every message settled", func() bool { return e.settled(t) })
	for _, k := range keys {
		if got := a.delivered(k); !inOrder(got, n) {
			t.Errorf("%s delivered in the order %v, want 0..%d", k, got, n-1)
		}
	}
	if lc.reconnects.Load() != 1 {
		t.Errorf("%d messages lost, want 1", lc.reconnects.Load())
	}
}
