package proxy_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
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
	"github.com/courierhq/courier/internal/orderkey"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/verdict"
	"github.com/courierhq/courier/ordermark"
	"github.com/courierhq/courier/partition"
	"github.com/courierhq/courier/proxy"
)

// partEnv is a 3-node cluster with stream S (s.>, three replicas), its
// work stream in parts partitions by subject token 2 (s.<key>.e), and the
// partitions' consumers, pinned as courier sets them up; and one record of
// what reached the app from every replica.
type partEnv struct {
	t     *testing.T
	c     *natstest.Cluster
	js    jetstream.JetStream
	parts int
	work  string
	rec   *orderApp
	// badHeaders counts requests whose subject or stream was not the
	// origin's (the partition's token left in, the work stream's name).
	badHeaders atomic.Int32
	// dd is the dedup store replicas share; nil: dedup off.
	dd proxy.Deduper

	mu      sync.Mutex
	handled map[string]int // replica → requests answered 2xx
}

func newPartEnv(t *testing.T, parts int, answer func(key string, n, attempt int) (int, string)) *partEnv {
	t.Helper()
	c := natstest.StartCluster(t, 3, natstest.ClusterOptions{})
	_, js := natstest.ConnectURL(t, c.URL())
	var src jetstream.Stream
	natstest.Try(t, "create the stream", func(ctx context.Context) error {
		var err error
		src, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3})
		return err
	})
	natstest.Try(t, "create the dead-letter stream", func(ctx context.Context) error {
		_, _, err := dlq.EnsureStream(ctx, js, "dlq.s", 3)
		return err
	})
	cfg, err := partition.StreamConfig(partition.StreamOptions{Source: src.CachedInfo().Config, Consumer: "c", Token: 2, Partitions: parts})
	if err != nil {
		t.Fatal(err)
	}
	natstest.Try(t, "create the work stream", func(ctx context.Context) error {
		_, _, err := partition.EnsureStream(ctx, js, cfg)
		return err
	})
	for i := range parts {
		natstest.Try(t, "create a partition's consumer", func(ctx context.Context) error {
			_, err := js.CreateOrUpdateConsumer(ctx, cfg.Name, jetstream.ConsumerConfig{
				Durable: partition.ConsumerName("c", i), FilterSubject: partition.FilterSubject(i),
				AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5, AckWait: 5 * time.Second, MaxAckPending: 1000,
				PriorityPolicy: jetstream.PriorityPolicyPinned, PriorityGroups: []string{"courier"}, PinnedTTL: 2 * time.Second,
			})
			return err
		})
	}
	rec := &orderApp{t: t, busy: map[string]bool{}, ok: map[string][]int{}, answer: answer}
	return &partEnv{t: t, c: c, js: js, parts: parts, work: cfg.Name, rec: rec, handled: map[string]int{}}
}

// replica starts a courier named name on the partitions (its own
// connection, consumer handles and membership) and returns what stops it
// as SIGTERM does.
func (e *partEnv) replica(name string) (stop func()) {
	t := e.t
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Order")
		if r.Header.Get(proxy.HeaderSubject) != "s."+key+".e" || r.Header.Get(proxy.HeaderStream) != "S" {
			e.badHeaders.Add(1)
		}
		rw := &statusRecorder{ResponseWriter: w}
		e.rec.ServeHTTP(rw, r)
		if rw.status < 300 {
			e.mu.Lock()
			e.handled[name]++
			e.mu.Unlock()
		}
	}))
	t.Cleanup(srv.Close)
	_, rjs := natstest.ConnectURL(t, e.c.URL())
	ctx := context.Background()
	consumers := make([]jetstream.Consumer, e.parts)
	for i := range consumers {
		natstest.Try(t, "bind a partition's consumer", func(ctx context.Context) error {
			var err error
			consumers[i], err = rjs.Consumer(ctx, e.work, partition.ConsumerName("c", i))
			return err
		})
	}
	var ws jetstream.Stream
	var marks *ordermark.Store
	natstest.Try(t, "open the work stream and the marks", func(ctx context.Context) error {
		var err error
		if ws, err = rjs.Stream(ctx, e.work); err != nil {
			return err
		}
		marks, err = ordermark.OpenPartitions(ctx, rjs, "S", "c", 3)
		return err
	})
	var log *slog.Logger
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("replica", name)
	}
	var runner atomic.Pointer[proxy.Runner]
	var members *partition.Members
	natstest.Try(t, "join", func(ctx context.Context) error {
		var err error
		members, err = partition.Join(ctx, rjs, partition.MembersBucket("S", "c"), partition.Options{
			Instance: name, Partitions: e.parts, Interval: 300 * time.Millisecond, TTL: time.Second, Replicas: 3, Logger: log,
			Pins: func() map[int]string {
				if r := runner.Load(); r != nil {
					return r.Pins()
				}
				return nil
			},
		})
		return err
	})
	key, err := orderkey.Parse("subject:2")
	if err != nil {
		t.Fatal(err)
	}
	o := orderOptions(t)
	o.OrderKey, o.AppURL, o.Stream, o.Consumer, o.Registerer = key, srv.URL, "S", "c", prometheus.NewRegistry()
	o.PriorityGroup, o.ShutdownGrace, o.MaxInflight = "courier", 5*time.Second, 4
	o.Logger = log
	o.Partitions = &proxy.Partitions{
		Consumers: consumers, Assignment: members,
		Marks: func(i int) proxy.OrderMarks { return marks.Partition(i) },
		Handover: proxy.Handover{
			Stream: ws,
			Unpin: func(ctx context.Context, i int) error {
				return ws.UnpinConsumer(ctx, partition.ConsumerName("c", i), "courier")
			},
			HandedOn: members.HandedOn, Clean: members.TakeHandedOn,
		},
	}
	o.Membership = members
	r, err := proxy.New(nil, dlq.NewPublisher(rjs, "dlq.s"), e.dd, o)
	if err != nil {
		t.Fatal(err)
	}
	runner.Store(r)
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); members.Run(runCtx) }()
	go func() {
		defer wg.Done()
		if err := r.Run(runCtx); err != nil {
			t.Errorf("replica %s: %v", name, err)
		}
	}()
	stop = sync.OnceFunc(func() { cancel(); wg.Wait() })
	t.Cleanup(stop)
	return stop
}

// statusRecorder notes the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// publish publishes messages from..to-1 of each key, interleaved: subject
// s.<key>.e, the key in the Order header, the place in N.
func (e *partEnv) publish(keys []string, from, to int) {
	for i := from; i < to; i++ {
		for _, k := range keys {
			m := nats.NewMsg("s." + k + ".e")
			m.Header.Set("Order", k)
			m.Header.Set("N", strconv.Itoa(i))
			m.Header.Set("Nats-Msg-Id", fmt.Sprintf("%s-%d", k, i))
			natstest.Try(e.t, "publish", func(ctx context.Context) error { _, err := e.js.PublishMsg(ctx, m); return err })
		}
	}
}

// delivered reports whether every key has at least n messages delivered
// (a redelivery counted once).
func (e *partEnv) delivered(keys []string, n int) func() bool {
	return func() bool {
		for _, k := range keys {
			if len(slices.Compact(e.rec.delivered(k))) < n {
				return false
			}
		}
		return true
	}
}

// checkOrder fails the test unless each key's 2xx calls were its messages
// 0..n-1 in stream order, none of a key while an earlier one was at the
// app, each with the origin's subject and stream. A message repeated right
// after itself is a redelivery (its ack lost with a server; no dedup store
// here), not a break of the order.
func (e *partEnv) checkOrder(keys []string, n int) {
	e.t.Helper()
	for _, k := range keys {
		if got := e.rec.delivered(k); !inOrder(slices.Compact(got), n) {
			e.t.Errorf("%s delivered in the order %v, want 0..%d", k, got, n-1)
		}
	}
	if e.rec.overlaps != 0 {
		e.t.Errorf("%d requests of a key while an earlier one of the key was at the app", e.rec.overlaps)
	}
	if n := e.badHeaders.Load(); n != 0 {
		e.t.Errorf("%d requests without the origin's subject and stream", n)
	}
}

func keysN(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	return keys
}

// Three couriers on a durable in eight partitions share the keys: each
// key's messages reach the app in stream order, one at a time, though the
// early messages of some fail twice (503), nothing is lost, every courier
// handles some, and the app sees the origin's subject and stream.
func TestPartitionsShareKeysInOrder(t *testing.T) {
	e := newPartEnv(t, 8, func(key string, n, attempt int) (int, string) {
		if k, _ := strconv.Atoi(key[1:]); k%4 == 0 && (n == 0 || n == 3) && attempt <= 2 {
			return 503, ""
		}
		return 200, ""
	})
	e.rec.took = 5 * time.Millisecond
	names := []string{"a", "b", "c"}
	for _, n := range names {
		if len(partition.Assign(names, n, 8)) == 0 {
			t.Fatalf("%s would hold no partition among %v: pick other names", n, names)
		}
		e.replica(n)
	}
	keys := keysN(40)
	const n = 8
	e.publish(keys, 0, n)
	poll.Until(t, 60*time.Second, "every key delivered", e.delivered(keys, n))
	e.checkOrder(keys, n)
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, name := range names {
		if e.handled[name] == 0 {
			t.Errorf("replica %s handled nothing (%v): the work is not spread", name, e.handled)
		}
	}
}

// One courier, then three, then one again, while messages are published:
// the partitions move between them and every key still reaches the app in
// stream order, nothing lost.
func TestPartitionsScaleOneThreeOne(t *testing.T) {
	e := newPartEnv(t, 6, func(key string, n, attempt int) (int, string) {
		if n%5 == 2 && attempt == 1 {
			return 503, "" // retries on the way through the moves
		}
		return 200, ""
	})
	e.rec.took = 10 * time.Millisecond
	keys := keysN(24)
	e.replica("a")
	e.publish(keys, 0, 3)
	poll.Until(t, 30*time.Second, "a delivering alone", e.delivered(keys, 2))
	stopB, stopC := e.replica("b"), e.replica("c")
	e.publish(keys, 3, 8)
	poll.Until(t, 60*time.Second, "three delivering", e.delivered(keys, 6))
	stopB()
	e.publish(keys, 8, 10)
	stopC()
	e.publish(keys, 10, 12)
	poll.Until(t, 60*time.Second, "every key delivered", e.delivered(keys, 12))
	e.checkOrder(keys, 12)
	e.mu.Lock()
	defer e.mu.Unlock()
	if handled := e.handled["b"] + e.handled["c"]; handled == 0 {
		t.Errorf("b and c handled nothing (%v): the partitions never moved", e.handled)
	}
}

// Two couriers restarted one after the other (SIGTERM, then a new one in
// its place) while messages are published, then the work stream's leader
// lost on the 3-node cluster: every key reaches the app in stream order,
// nothing lost.
func TestPartitionsRollingRestartAndNodeLoss(t *testing.T) {
	e := newPartEnv(t, 6, func(key string, n, attempt int) (int, string) {
		if n%4 == 1 && attempt == 1 {
			return 503, "" // retries on the way
		}
		return 200, ""
	})
	e.rec.took = 5 * time.Millisecond
	keys := keysN(12)
	stopA, stopB := e.replica("a"), e.replica("b")
	e.publish(keys, 0, 3)
	poll.Until(t, 30*time.Second, "a and b delivering", e.delivered(keys, 2))
	stopA()
	e.replica("a2")
	e.publish(keys, 3, 6)
	stopB()
	e.replica("b2")
	e.publish(keys, 6, 9)
	poll.Until(t, 60*time.Second, "a2 and b2 delivering", e.delivered(keys, 8))
	e.c.Shutdown(e.c.StreamLeader(e.work))
	e.publish(keys, 9, 12)
	poll.Until(t, 90*time.Second, "every key delivered", e.delivered(keys, 12))
	e.checkOrder(keys, 12)
}

// A courier stopped (as SIGTERM does) while its deliveries wait on a slow
// dedup store, as on a loaded machine, leaves nothing the next courier
// must wait out: the checks the stop came in the middle of are answered
// and their claims given up with the messages, and the partitions are
// handed on with their marks written. The next courier delivers every key
// in order well within the claims' TTL.
func TestPartitionsStopUnderLoad(t *testing.T) {
	e := newPartEnv(t, 4, nil)
	store := &slowClaims{took: 300 * time.Millisecond, ttl: 30 * time.Second, claims: map[string]time.Time{}, done: map[string]bool{}}
	e.dd = store
	keys := keysN(16)
	stopA := e.replica("a")
	e.publish(keys, 0, 1)
	poll.Until(t, 30*time.Second, "a delivering", e.delivered(keys, 1))
	e.publish(keys, 1, 5)
	poll.Until(t, 10*time.Second, "a's deliveries waiting on the store", func() bool { return store.checking.Load() > 0 })
	stopA()
	stopped := time.Now()
	e.replica("b")
	poll.Until(t, 15*time.Second, "b delivering every key", e.delivered(keys, 5))
	t.Logf("every key delivered %s after a stopped", time.Since(stopped).Round(time.Millisecond))
	e.checkOrder(keys, 5)
}

// slowClaims is a dedup store shared by replicas whose every check takes a
// while, as across a slow network: the claim is taken as the check
// begins, and stays if the caller stops waiting for the answer, until it
// is released or recorded, or its TTL runs out.
type slowClaims struct {
	took, ttl time.Duration
	checking  atomic.Int32 // checks under way
	mu        sync.Mutex
	claims    map[string]time.Time // key → when its claim lapses
	done      map[string]bool
}

func (s *slowClaims) Check(ctx context.Context, key string) (verdict.Verdict, error) {
	s.checking.Add(1)
	defer s.checking.Add(-1)
	s.mu.Lock()
	v := verdict.New
	switch {
	case s.done[key]:
		v = verdict.Processed
	case time.Now().Before(s.claims[key]):
		v = verdict.Claimed
	default:
		s.claims[key] = time.Now().Add(s.ttl)
	}
	s.mu.Unlock()
	select {
	case <-time.After(s.took):
		return v, nil
	case <-ctx.Done():
		return verdict.New, ctx.Err()
	}
}

func (s *slowClaims) Record(_ context.Context, keys ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		s.done[k] = true
		delete(s.claims, k)
	}
	return nil
}

func (s *slowClaims) Release(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.claims, key)
	return nil
}
