package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
	"github.com/courierhq/courier/proxy"
)

// flakyKeysApp fails each key in fails with 503 that many times, then
// answers 200; other keys get 200 at once. It counts the 2xx per key.
type flakyKeysApp struct {
	storming atomic.Bool // every request answered 503 while set
	mu       sync.Mutex
	fails    map[string]int // failures still to give, per key
	ok       map[string]int // 2xx per key
	seen     map[string]int // requests per key
	requests int
}

func newFlakyKeysApp(t *testing.T, e *env) *flakyKeysApp {
	t.Helper()
	a := &flakyKeysApp{fails: map[string]int{}, ok: map[string]int{}, seen: map[string]int{}}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return a
}

func (a *flakyKeysApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(proxy.HeaderIdempotencyKey)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests++
	a.seen[key]++
	if a.storming.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if a.fails[key] > 0 {
		a.fails[key]--
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	a.ok[key]++
}

func (a *flakyKeysApp) delivered(keys ...string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range keys {
		if a.ok[k] == 0 {
			return false
		}
	}
	return true
}

// Messages that fail on their own among successes, each a few times, are
// retried at their backoff and delivered: their retries, coming back
// together, are no sign of an outage and must not open the breaker (which
// would hold a healthy app back, its probes being such retries in turn).
// Reproduces a stall of over a minute with 20 messages unsettled.
func TestRetryBacklogDoesNotOpenBreaker(t *testing.T) {
	e := setup(t)
	a := newFlakyKeysApp(t, e)
	var keys []string
	for i := range 20 {
		bad, good := fmt.Sprintf("bad-%d", i), fmt.Sprintf("good-%d", i)
		a.fails[bad] = 3
		e.publishKeyed(t, "s.bad", bad)
		e.publishKeyed(t, "s.good", good)
		keys = append(keys, bad, good)
	}
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 5, MaxInflight: 4, BreakerFailures: 10, BreakerProbe: 5 * time.Second,
		BackoffInitial: 100 * time.Millisecond, BackoffMax: time.Second,
	})
	poll.Until(t, 20*time.Second, "every message delivered", func() bool { return a.delivered(keys...) && e.settled(t) })
	if got := e.deadLetters(t); got != 0 {
		t.Errorf("%d dead letters, want none", got)
	}
	if got := counter(t, e.reg, "courier_delivery_held_seconds_total", "breaker_open"); got != 0 {
		t.Errorf("the breaker was open for %vs", got)
	}
	if err := r.Ready(); err != nil {
		t.Errorf("not ready: %v", err)
	}
}

// After a restart, the messages a killed courier was retrying come back
// first: redeliveries, each failing once more before it succeeds. Their
// failures in a row say nothing of the app and must not open the breaker.
func TestRedeliveriesAfterRestartDoNotOpenBreaker(t *testing.T) {
	e := setup(t)
	a := newFlakyKeysApp(t, e)
	var keys []string
	for i := range 20 {
		k := fmt.Sprintf("k-%d", i)
		a.fails[k] = 1
		e.publishKeyed(t, "s.k", k)
		keys = append(keys, k)
	}
	// A courier that fetched them all and died: each is redelivered, its
	// first delivery spent.
	b, err := e.cons.Fetch(len(keys), jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range b.Messages() {
		if err := m.Nak(); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != len(keys) {
		t.Fatalf("fetched %d of %d", n, len(keys))
	}
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 5, MaxInflight: 4, BreakerFailures: 5, BreakerProbe: 5 * time.Second,
		BackoffInitial: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
	})
	poll.Until(t, 20*time.Second, "every message delivered", func() bool { return a.delivered(keys...) && e.settled(t) })
	if got := counter(t, e.reg, "courier_delivery_held_seconds_total", "breaker_open"); got != 0 {
		t.Errorf("the breaker was open for %vs", got)
	}
	if err := r.Ready(); err != nil {
		t.Errorf("not ready: %v", err)
	}
}

// A probe that fails on a message's last allowed delivery is held again,
// still owning its key's flight; the next probe may go to a held message of
// the same key, which must wait for that flight. Waiting, it must hand its
// probe on: the first probe then goes again, and once the app recovers
// everything is delivered. (Reproduced: the waiting probe kept its token, no
// probe was ever sent again, and /readyz said "breaker open" for good.)
func TestProbeWaitingOnItsKeyDoesNotStopProbing(t *testing.T) {
	e := setup(t)
	a := newFlakyKeysApp(t, e)
	a.storming.Store(true)
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: 1, AckWait: 5 * time.Second})
	e.publishKeyed(t, "s.a", "k-a")
	e.publishKeyed(t, "s.b", "k-b")
	r, _ := e.runWith(t, openStore(t), proxy.Options{
		MaxDeliver: 1, MaxInflight: 4, BreakerFailures: 2, BreakerProbe: 100 * time.Millisecond,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
	})
	waitBreakerOpen(t, r)
	// Two of one key, one of another, fetched while the breaker is open.
	for _, k := range []string{"k-c", "k-c", "k-d"} {
		m := nats.NewMsg("s.c")
		m.Header.Set(proxy.HeaderIdempotencyKey, k)
		m.Data = []byte(k)
		if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	// Enough failed probes for every held message to have had a turn.
	poll.Until(t, 10*time.Second, "the held messages probed", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.requests >= 2+6
	})
	a.storming.Store(false)
	poll.Until(t, 15*time.Second, "k-c and k-d delivered after the app recovered", func() bool { return a.delivered("k-c", "k-d") })
	poll.Until(t, 15*time.Second, "ready again", func() bool { return r.Ready() == nil })
	a.mu.Lock()
	okC := a.ok["k-c"]
	a.mu.Unlock()
	if okC != 1 {
		t.Errorf("k-c reached the app %d times with a 2xx, want 1 (the second is a duplicate)", okC)
	}
	if got := e.deadLetters(t); got != 2 {
		t.Errorf("%d dead letters, want 2 (A and B, exhausted before the breaker opened)", got)
	}
}

// Across replicas, on a 3-node cluster: replica B's breaker is open, and
// its probe goes to a message whose key replica A holds the claim of (A's
// request for it is still running). Waiting on that claim, the probe must
// hand its go-ahead on: B's other held message probes, and once B's app
// recovers B is delivering again while A still holds the key. The key
// reaches the app once.
func TestProbeWaitingOnAnotherReplicasClaimDoesNotStopProbing(t *testing.T) {
	c := natstest.StartCluster(t, 3, natstest.ClusterOptions{})
	ctx := context.Background()
	jss := make([]jetstream.JetStream, 2)
	for i := range jss {
		_, jss[i] = natstest.ConnectURL(t, c.NodeURL(i)+","+c.URL())
	}
	natstest.Try(t, "create the stream", func(ctx context.Context) error {
		_, err := jss[0].CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3})
		return err
	})
	natstest.Try(t, "create the dead-letter stream", func(ctx context.Context) error {
		_, _, err := dlq.EnsureStream(ctx, jss[0], "dlq.s", 3)
		return err
	})

	// One app for both replicas: it hangs on "K" until release is closed
	// (A's request), and answers 503 to every other request while storming
	// (B's breaker).
	// A's hanging request ends before the replicas are stopped (deferred
	// calls run before cleanups), however the test ends.
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()
	a := &flakyKeysApp{fails: map[string]int{}, ok: map[string]int{}, seen: map[string]int{}}
	var kCalls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(proxy.HeaderIdempotencyKey) == "K" {
			kCalls.Add(1)
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		a.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	a.storming.Store(true)

	replica := func(i int, name, subject string, o proxy.Options, storeReg prometheus.Registerer) *proxy.Runner {
		js := jss[i]
		var cons jetstream.Consumer
		natstest.Try(t, "create consumer "+name, func(ctx context.Context) error {
			var err error
			cons, err = js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{
				Durable: name, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5,
				AckWait: 10 * time.Second, FilterSubject: subject,
			})
			return err
		})
		local, err := dedup.Open(t.TempDir(), dedup.Options{TTL: time.Hour, Scope: "S/c"})
		if err != nil {
			t.Fatal(err)
		}
		var sh *dedup.Shared
		natstest.Try(t, "OpenShared", func(ctx context.Context) error {
			sh, err = dedup.OpenShared(ctx, js, local, dedup.SharedOptions{
				TTL: time.Hour, ClaimTTL: 2 * time.Second, Scope: "S/c", Replicas: 3, Registerer: storeReg})
			return err
		})
		o.AppURL, o.Stream, o.Consumer, o.Registerer = srv.URL, "S", name, prometheus.NewRegistry()
		o.MaxDeliver, o.AckWait, o.HTTPTimeout = 5, 10*time.Second, time.Minute
		r, err := proxy.New(cons, dlq.NewPublisher(js, "dlq.s"), sh, o)
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(runCtx) }()
		t.Cleanup(func() { cancel(); wg.Wait(); _ = sh.Close() })
		return r
	}
	publish := func(subject, key string) {
		t.Helper()
		m := nats.NewMsg(subject)
		m.Header.Set(proxy.HeaderIdempotencyKey, key)
		m.Data = []byte(key)
		natstest.Try(t, "publish "+key, func(ctx context.Context) error {
			_, err := jss[0].PublishMsg(ctx, m)
			return err
		})
	}

	// A takes K's claim and its request hangs.
	replica(0, "a", "s.a", proxy.Options{MaxInflight: 1}, nil)
	publish("s.a", "K")
	poll.Until(t, 15*time.Second, "A's request for K under way", func() bool { return kCalls.Load() == 1 })

	// B's breaker opens on two fresh failures; K is held, is the probe
	// and finds A's claim; then L is held.
	bStore := prometheus.NewRegistry()
	b := replica(1, "b", "s.b", proxy.Options{
		// Room beside b-1 and b-2, which, probed while the storm goes
		// on, reach their last delivery and are held there.
		MaxInflight: 4, BreakerFailures: 2, BreakerProbe: 200 * time.Millisecond,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
	}, bStore)
	publish("s.b", "b-1")
	publish("s.b", "b-2")
	waitBreakerOpen(t, b)
	publish("s.b", "K")
	poll.Until(t, 15*time.Second, "B's probe K finding A's claim", func() bool {
		mfs, err := bStore.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if mf.GetName() == "courier_dedup_shared_checks_total" && m.GetLabel()[0].GetValue() == "claimed" {
					return m.GetCounter().GetValue() >= 1
				}
			}
		}
		return false
	})
	publish("s.b", "L")
	poll.Until(t, 15*time.Second, "B probing with L while K waits", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.seen["L"] >= 1
	})
	a.storming.Store(false)
	poll.Until(t, 15*time.Second, "B delivering L while A still holds K", func() bool { return a.delivered("L") })
	poll.Until(t, 15*time.Second, "B ready again", func() bool { return b.Ready() == nil })
	if got := kCalls.Load(); got != 1 {
		t.Fatalf("K was sent %d times while A held its claim, want 1", got)
	}
	unblock()
	poll.Until(t, 15*time.Second, "K delivered", func() bool { return a.delivered("K") })
	poll.Until(t, 15*time.Second, "every message settled", func() bool {
		for _, js := range jss[:1] {
			for _, name := range []string{"a", "b"} {
				cons, err := js.Consumer(ctx, "S", name)
				if err != nil {
					return false
				}
				info, err := cons.Info(ctx)
				if err != nil || info.NumPending != 0 || info.NumAckPending != 0 {
					return false
				}
			}
		}
		return true
	})
	if got := kCalls.Load(); got != 1 {
		t.Errorf("K reached the app %d times from two replicas, want 1", got)
	}
}

// A storm of 503s (the app is up, its database is not) dead-letters nothing:
// the breaker stops sending, probes, and everything is delivered after.
func TestStormDeadLettersNothing(t *testing.T) {
	e := setup(t)
	a := newStormApp(t, e)
	a.storming.Store(true)
	const n = 40
	e.publish(t, n, []byte("x"))
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 3, MaxInflight: 4, BreakerFailures: 5, BreakerProbe: 100 * time.Millisecond,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
	})
	waitBreakerOpen(t, r)
	time.Sleep(time.Second) // the storm goes on
	a.mu.Lock()
	requestsInStorm := len(a.times)
	a.mu.Unlock()
	a.storming.Store(false)
	poll.Until(t, 10*time.Second, "every message delivered after the storm", func() bool { return a.ok.Load() >= n && e.settled(t) })
	if got := e.deadLetters(t); got != 0 {
		t.Errorf("%d dead letters from a storm", got)
	}
	if requestsInStorm > 3*n/2 {
		t.Errorf("%d requests during the storm for %d messages: the breaker did not stop sending", requestsInStorm, n)
	}
	poll.Until(t, 10*time.Second, "ready again", func() bool { return r.Ready() == nil })
	t.Logf("%d requests during a 1s+ storm for %d messages", requestsInStorm, n)
}

// Two messages that always fail among steady successes never open the
// breaker and slow nothing down: the rest are delivered as they come, and the
// two are dead-lettered once their budget is spent.
func TestFailingMessagesAmongSuccessesDoNotOpenBreaker(t *testing.T) {
	e := setup(t)
	a := newStormApp(t, e, "bad-1", "bad-2")
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 4, MaxInflight: 4, BreakerFailures: 5, BreakerProbe: time.Hour,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
	})
	// Steady successes: a good message every 2ms until both bad ones are
	// dead-lettered.
	stop := make(chan struct{})
	published := make(chan int)
	go func() {
		n := 0
		defer func() { published <- n }()
		tk := time.NewTicker(2 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				if _, err := e.js.Publish(context.Background(), "s.good", []byte("x")); err == nil {
					n++
				}
			}
		}
	}()
	for _, k := range []string{"bad-1", "bad-2"} {
		m := nats.NewMsg("s.bad")
		m.Header.Set(proxy.HeaderIdempotencyKey, k)
		if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 10*time.Second, "both bad messages dead-lettered", func() bool { return e.deadLetters(t) == 2 })
	close(stop)
	n := <-published
	poll.Until(t, 10*time.Second, "every good message delivered", func() bool { return int(a.ok.Load()) == n })
	if err := r.Ready(); err != nil {
		t.Errorf("not ready: %v", err)
	}
	if got := counter(t, e.reg, "courier_delivery_held_seconds_total", "breaker_open"); got != 0 {
		t.Errorf("the breaker was open for %vs", got)
	}
}

// A storm the app ends with a Retry-After: the breaker waits what the app
// asked before its first probe, and nothing is dead-lettered.
func TestStormEndedByRetryAfter(t *testing.T) {
	e := setup(t)
	var storming atomic.Bool
	storming.Store(true)
	var mu sync.Mutex
	var times []time.Time
	var ok atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		if storming.Load() {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		ok.Add(1)
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
	const n = 20
	e.publish(t, n, []byte("x"))
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 3, MaxInflight: 2, BreakerFailures: 3, BreakerProbe: 50 * time.Millisecond,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 5 * time.Second,
	})
	var opened time.Time
	poll.Until(t, 10*time.Second, "the breaker to open", func() bool {
		err := r.Ready()
		if err != nil && contains(err.Error(), "breaker open") {
			opened = time.Now()
			return true
		}
		return false
	})
	time.Sleep(1500 * time.Millisecond) // the first probe is due after Retry-After: 1s
	storming.Store(false)
	poll.Until(t, 10*time.Second, "every message delivered", func() bool { return ok.Load() == n && e.settled(t) })
	if got := e.deadLetters(t); got != 0 {
		t.Errorf("%d dead letters", got)
	}
	mu.Lock()
	defer mu.Unlock()
	// No request in the first 900ms after the breaker opened: the app's
	// Retry-After (1s) wins over BreakerProbe (50ms).
	for _, at := range times {
		if d := at.Sub(opened); d > 50*time.Millisecond && d < 900*time.Millisecond {
			t.Errorf("a request %s after the breaker opened, before the app's Retry-After", d.Round(time.Millisecond))
		}
	}
}

// Messages that fail on their own, back on their last allowed delivery,
// can be all the breaker holds: every worker holds one, failing each probe.
// A healthy app must not wait on them: such a message waits apart from the
// workers, and fresh messages are fetched and probe with. (Reproduced: with
// every worker holding one, nothing fresh was fetched, and the breaker
// stayed open while good messages waited in the stream.)
func TestPoisonRetriesDoNotHoldBreakerOpen(t *testing.T) {
	e := setup(t)
	a := newFlakyKeysApp(t, e)
	a.fails["p1"], a.fails["p2"] = 1000, 1000 // always fail
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: 2, AckWait: 5 * time.Second})
	e.publishKeyed(t, "s.p", "p1")
	e.publishKeyed(t, "s.p", "p2")
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 2, MaxInflight: 2, BreakerFailures: 2, BreakerProbe: 100 * time.Millisecond,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
	})
	waitBreakerOpen(t, r)
	// p1 and p2 come back on their last delivery and fail the probes.
	poll.Until(t, 10*time.Second, "p1 and p2 probed on their last delivery", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.seen["p1"] >= 3 && a.seen["p2"] >= 3
	})
	for i := range 3 {
		e.publishKeyed(t, "s.g", fmt.Sprintf("good-%d", i))
	}
	poll.Until(t, 15*time.Second, "the good messages delivered", func() bool { return a.delivered("good-0", "good-1", "good-2") })
	poll.Until(t, 15*time.Second, "every message settled", func() bool { return e.settled(t) })
	if got := e.deadLetters(t); got != 2 {
		t.Errorf("%d dead letters, want p1 and p2 (exhausted once the breaker closed)", got)
	}
}

// A long storm: every failed probe on a fresh message doubles the wait
// before the next, but never past BreakerProbeMax, however long the storm
// lasts and however far BackoffMax is; /readyz and the log say when the
// next probe goes. (Reproduced: the wait doubled up to BackoffMax, ten
// minutes, and delivery resumed long after the app recovered while /readyz
// still named the first wait.)
func TestBreakerProbeWaitStaysUnderItsCap(t *testing.T) {
	e := setup(t)
	a := newStormApp(t, e)
	a.storming.Store(true)
	e.updateConsumer(t, jetstream.ConsumerConfig{MaxDeliver: 20, AckWait: 5 * time.Second})
	keys := numbered("k", 30) // fresh messages to probe with: each failed one doubles the wait
	for _, k := range keys {
		e.publishKeyed(t, "s.k", k)
	}
	const probeMax = 400 * time.Millisecond
	var logs testlog.Buffer
	r, _ := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 20, MaxInflight: 1, BreakerFailures: 2,
		BreakerProbe: 50 * time.Millisecond, BreakerProbeMax: probeMax,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: time.Hour,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	waitBreakerOpen(t, r)
	requests := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.times)
	}
	opened := requests()
	nextProbe := regexp.MustCompile(`next probe in ([0-9.]+[a-zµ]+) \(at `)
	var waits []time.Duration
	// Ten failed probes: without a cap the wait would have doubled to
	// 50ms×2^10, nearly a minute.
	poll.Until(t, 30*time.Second, "ten probes in the storm", func() bool {
		if err := r.Ready(); err != nil {
			if m := nextProbe.FindStringSubmatch(err.Error()); m != nil {
				d, perr := time.ParseDuration(m[1])
				if perr != nil {
					t.Fatalf("/readyz %q: %v", err, perr)
				}
				waits = append(waits, d)
			}
		}
		return requests()-opened >= 10
	})
	a.storming.Store(false)
	poll.Until(t, 30*time.Second, "every message delivered after the storm", func() bool { return a.ok.Load() >= int32(len(keys)) && e.settled(t) })

	if len(waits) == 0 {
		t.Fatal("/readyz never said when the next probe goes")
	}
	for _, d := range waits {
		if d > probeMax {
			t.Errorf("/readyz: next probe in %s, over BreakerProbeMax %s", d, probeMax)
		}
	}
	var atCap bool
	for line := range strings.Lines(logs.String()) {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != "breaker still open: the probe failed" {
			continue
		}
		d, err := time.ParseDuration(fmt.Sprint(rec["next_probe_in"]))
		if err != nil || d > probeMax {
			t.Errorf("log line %s: next probe over BreakerProbeMax %s", strings.TrimSpace(line), probeMax)
		}
		if _, err := time.Parse(time.RFC3339, fmt.Sprint(rec["next_probe_at"])); err != nil {
			t.Errorf("log line %s: next_probe_at is not a time", strings.TrimSpace(line))
		}
		atCap = atCap || strings.Contains(fmt.Sprint(rec["probing_every"]), "the most")
	}
	if !atCap {
		t.Errorf("no log line said the probes go at the cap; logs:\n%s", logs.String())
	}
	if got := e.deadLetters(t); got != 0 {
		t.Errorf("%d dead letters from a storm", got)
	}
}
