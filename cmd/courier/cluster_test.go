package main

// Scale-out on a real cluster (#11): an embedded 3-node JetStream cluster
// with an R3 stream, couriers sharing their keys in an R3 bucket
// (COURIER_DEDUP_STORE=shared, COURIER_STREAM_REPLICAS=3) and their dead
// letters in an R3 stream, each courier with its own directory and admin
// address and NATS_URL listing every node.

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
)

// childMarker in a process's environment makes the test binary run the
// sidecar instead of the tests (startChild), so that a test can kill a
// courier with SIGKILL. Not a COURIER_ variable: courier would warn about it.
const childMarker = "COURIERTEST_RUN_SIDECAR=1"

func TestMain(m *testing.M) {
	if os.Getenv("COURIERTEST_RUN_SIDECAR") == "1" {
		ctx, stop := notifyStop(context.Background())
		err := run(ctx, nil, os.Environ(), os.Stdout, os.Stderr)
		stop()
		os.Exit(exitCode(err, os.Stderr))
	}
	os.Exit(m.Run())
}

// cluster is a harness on a 3-node cluster: the stream ORDERS (orders.>) has
// three replicas.
type cluster struct {
	*harness
	c *natstest.Cluster
}

func newCluster(t *testing.T, adjust ...func(*jetstream.StreamConfig)) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	c := natstest.StartCluster(t, 3, natstest.ClusterOptions{})
	nc, js := natstest.ConnectURL(t, c.URL())
	sc := jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Replicas: 3}
	for _, f := range adjust {
		f(&sc)
	}
	natstest.Try(t, "creating the R3 stream", func(ctx context.Context) error {
		_, err := js.CreateStream(ctx, sc)
		return err
	})
	h := &harness{t: t, srv: c.Node(0), nc: nc, js: js, stream: sc.Name, dir: t.TempDir()}
	return &cluster{harness: h, c: c}
}

// env is the environment of courier number i: the shared store, R3 streams
// and bucket, a directory of its own, NATS_URL listing node i first (so the
// couriers spread over the nodes) and then every node; logs at the default
// level, as users run it (COURIERTEST_LOG_LEVEL sets another, to look into
// a failure).
func (k *cluster) env(appURL string, i int, extra ...string) []string {
	base := []string{
		"NATS_URL=" + k.c.NodeURL(i%k.c.Len()) + "," + k.c.URL(),
		"COURIER_DEDUP_STORE=shared",
		"COURIER_STREAM_REPLICAS=3",
		"COURIER_DEDUP_DIR=" + k.t.TempDir(),
		"COURIER_LOG_LEVEL=" + cmp.Or(os.Getenv("COURIERTEST_LOG_LEVEL"), "info"),
	}
	return k.harness.env(appURL, append(base, extra...)...)
}

// publishRetry stores a message, trying again while the cluster cannot
// answer (a leader election); the message's Nats-Msg-Id, which the caller
// sets, makes a retry of a publish that was stored in fact store it once.
func (k *cluster) publishRetry(subject, body string, hdr map[string]string) {
	k.t.Helper()
	if hdr["Nats-Msg-Id"] == "" {
		k.t.Fatal("publishRetry needs a Nats-Msg-Id")
	}
	m := nats.NewMsg(subject)
	m.Data = []byte(body)
	for h, v := range hdr {
		m.Header[h] = []string{v}
	}
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = k.js.PublishMsg(ctx, m)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	k.t.Fatalf("publish %s: %v", hdr["Nats-Msg-Id"], err)
}

// drained reports whether the durable has nothing left to deliver and
// nothing waiting for an ack (redeliveries allowed: a node went down).
func (k *cluster) drained() bool {
	info := k.consumerInfo("courier")
	return info != nil && info.NumPending == 0 && info.NumAckPending == 0
}

// noDeadLetters fails the test if any dead letter was stored.
func (k *cluster) noDeadLetters() {
	k.t.Helper()
	if dls := k.deadLetters("dlq.ORDERS.courier"); len(dls) > 0 {
		k.t.Errorf("%d dead letters, want none; first: %v", len(dls), dls[0].Header)
	}
}

// replicas returns the configured replicas of stream.
func (k *cluster) replicas(stream string) int {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	s, err := k.js.Stream(ctx, stream)
	if err != nil {
		k.t.Fatalf("stream %s: %v", stream, err)
	}
	return s.CachedInfo().Config.Replicas
}

// waitReady waits until courier's /readyz answers 200 and returns its admin
// address: up to a minute, for three couriers starting at once on a busy
// 3-node cluster each create R3 buckets, whose steps can take 10 s each.
func waitReady(t *testing.T, c *courier) string {
	t.Helper()
	admin := adminAddr(t, c)
	poll.Until(t, 60*time.Second, "courier ready", func() bool {
		if err, done := c.exited(0); done {
			t.Fatalf("courier exited while starting: %v", err)
		}
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return admin
}

// duplicates is how many app calls there were beyond one per key, and the
// keys of keys that were never called.
func duplicates(a *app, keys []string) (dups int, missing []string) {
	for _, key := range keys {
		switch n := a.calls(key); {
		case n == 0:
			missing = append(missing, key)
		case n > 1:
			dups += n - 1
		}
	}
	return dups, missing
}

// awaitAcks waits for the acks of asynchronous publishes.
func awaitAcks(t *testing.T, futures []jetstream.PubAckFuture) {
	t.Helper()
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		case <-time.After(10 * time.Second):
			t.Fatal("no publish ack")
		}
	}
}

// The stream's leader node shut down while two couriers drain: every
// message reaches the app, nothing is dead-lettered, and the app calls of a
// key beyond the first are no more than the couriers had in flight.
func TestClusterStreamLeaderLost(t *testing.T) {
	k := newCluster(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		time.Sleep(5 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	})
	const inflight = 4
	c1 := start(t, k.env(a.URL, 0, fmt.Sprint("COURIER_MAX_INFLIGHT=", inflight)))
	c2 := start(t, k.env(a.URL, 1, fmt.Sprint("COURIER_MAX_INFLIGHT=", inflight)))
	waitReady(t, c1)
	waitReady(t, c2)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	dlqStream, err := k.js.StreamNameBySubject(ctx, "dlq.ORDERS.courier")
	if err != nil {
		t.Fatalf("no stream captures the dead letters: %v", err)
	}
	for _, s := range []string{"ORDERS", "KV_COURIER_DEDUP", dlqStream} {
		if r := k.replicas(s); r != 3 {
			t.Errorf("stream %s has %d replicas, want 3", s, r)
		}
	}

	var keys []string
	var futures []jetstream.PubAckFuture
	for i := range 100 {
		key := fmt.Sprint("lost-", i)
		keys = append(keys, key)
		m := nats.NewMsg("orders.created")
		m.Header.Set("Nats-Msg-Id", key)
		f, err := k.js.PublishMsgAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	awaitAcks(t, futures)
	poll.Until(t, 20*time.Second, "deliveries under way", func() bool { return a.count() >= 30 })
	leader := k.c.StreamLeader("ORDERS")
	t.Logf("shutting down node %d, the stream's leader, after %d requests", leader, a.count())
	k.c.Shutdown(leader)
	down := time.Now()
	for i := 100; i < 200; i++ {
		key := fmt.Sprint("lost-", i)
		keys = append(keys, key)
		k.publishRetry("orders.created", key, map[string]string{"Nats-Msg-Id": key})
	}
	poll.Until(t, 60*time.Second, "every message delivered and acked", func() bool {
		_, missing := duplicates(a, keys)
		return len(missing) == 0 && k.drained()
	})
	dups, _ := duplicates(a, keys)
	t.Logf("%d app calls for 200 keys: %d duplicates; drained %s after the leader went down",
		a.count(), dups, time.Since(down).Round(time.Millisecond))
	if dups > 2*inflight {
		t.Errorf("%d duplicate app calls, want at most %d (what two couriers had in flight)", dups, 2*inflight)
	}
	k.noDeadLetters()
}

// child is courier run as a process of its own (the test binary, see
// TestMain), so that it can be killed.
type child struct {
	cmd  *exec.Cmd
	logs *testlog.Buffer
	done chan error
	once sync.Once
}

func startChild(t *testing.T, environ []string) *child {
	t.Helper()
	ch := &child{logs: &testlog.Buffer{}, done: make(chan error, 1)}
	ch.cmd = exec.Command(os.Args[0])
	ch.cmd.Env = append(environ, childMarker)
	ch.cmd.Stderr = ch.logs
	if err := ch.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { ch.done <- ch.cmd.Wait() }()
	t.Cleanup(func() {
		ch.kill(t)
		if t.Failed() {
			t.Logf("child courier logs:\n%s", ch.logs.String())
		}
	})
	return ch
}

// kill sends SIGKILL and waits for the process to end; once.
func (ch *child) kill(t *testing.T) {
	t.Helper()
	ch.once.Do(func() {
		_ = ch.cmd.Process.Kill()
		select {
		case <-ch.done:
		case <-time.After(10 * time.Second):
			t.Error("killed courier did not exit")
		}
	})
}

// asCourier lets the log helpers (adminAddr, logLines) read a child's logs.
func (ch *child) asCourier() *courier { return &courier{logs: ch.logs} }

// A courier killed (SIGKILL) and replaced by one on an empty disk: the keys
// it recorded are recognised by the replacement (copies published after
// are acked as duplicates, the app not called), and the messages it held
// claims on when it died are delivered once their claims lapse.
func TestClusterReplacedOnEmptyDisk(t *testing.T) {
	// A duplicates window shorter than the test, so that a copy with the
	// same Nats-Msg-Id reaches courier instead of being dropped by the
	// stream.
	k := newCluster(t, func(sc *jetstream.StreamConfig) { sc.Duplicates = time.Second })
	var mu sync.Mutex
	completed := map[string]int{} // answered 2xx, by key
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		key := r.Header.Get("Idempotency-Key")
		if strings.HasPrefix(key, "held-") && n == 1 {
			<-r.Context().Done() // until the courier that sent it dies
			return
		}
		mu.Lock()
		completed[key]++
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
	first := startChild(t, k.env(a.URL, 0))
	waitReady(t, first.asCourier())

	// Keys by Nats-Msg-Id and by Idempotency-Key header.
	var keys []string
	copyOf := func(i int, copy string) (string, map[string]string) {
		if i%2 == 0 {
			key := fmt.Sprint("msgid-", i)
			return key, map[string]string{"Nats-Msg-Id": key}
		}
		key := fmt.Sprint("ikey-", i)
		return key, map[string]string{"Nats-Msg-Id": key + copy, "Idempotency-Key": key}
	}
	for i := range 10 {
		key, hdr := copyOf(i, "-a")
		keys = append(keys, key)
		k.publishRetry("orders.created", key, hdr)
	}
	poll.Until(t, 20*time.Second, "the first courier's deliveries acked", func() bool {
		return a.count() == 10 && k.drained()
	})
	// Two more it holds claims on when it dies.
	held := []string{"held-1", "held-2"}
	for _, key := range held {
		k.publishRetry("orders.created", key, map[string]string{"Nats-Msg-Id": key})
	}
	poll.Until(t, 10*time.Second, "the held messages at the app", func() bool { return a.count() == 12 })
	first.kill(t)

	second := start(t, k.env(a.URL, 1)) // a new, empty directory
	admin := waitReady(t, second)
	for i := range 10 {
		key, hdr := copyOf(i, "-b")
		// The stream drops a copy with the same Nats-Msg-Id within its
		// duplicates window: publish until it is stored.
		m := nats.NewMsg("orders.created")
		m.Data = []byte(key + " again")
		for h, v := range hdr {
			m.Header[h] = []string{v}
		}
		poll.Until(t, 10*time.Second, "the copy of "+key+" stored", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			ack, err := k.js.PublishMsg(ctx, m)
			return err == nil && !ack.Duplicate
		})
	}
	// Claim TTL and ack wait are 5s here: the held messages come back.
	poll.Until(t, 30*time.Second, "every copy acked and the held messages delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return completed["held-1"] == 1 && completed["held-2"] == 1 && k.drained()
	})
	for _, key := range keys {
		if n := a.calls(key); n != 1 {
			t.Errorf("app called %d times for %s, want 1: the replacement did not recognise the key", n, key)
		}
	}
	if v := metricstest.Value(t, metrics(admin), "courier_dedup_shared_checks_total", "answer", "processed"); v < 10 {
		t.Errorf("replacement found %v keys processed in the bucket, want at least 10", v)
	}
	k.noDeadLetters()
}

// A rollout: each courier replaced in turn (the new one started, on an
// empty directory, before the old one stops) while messages flow. Nothing
// is lost, nothing dead-lettered; a clean stop lets in-flight requests
// finish, so no key reaches the app twice.
func TestClusterRollout(t *testing.T) {
	k := newCluster(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		time.Sleep(10 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	})
	env := func(i int) []string { return k.env(a.URL, i, "COURIER_MAX_INFLIGHT=4") }
	olds := []*courier{start(t, env(0)), start(t, env(1))}
	for _, c := range olds {
		waitReady(t, c)
	}

	const total = 300
	keys := make([]string, total)
	published := make(chan struct{})
	var pubErr error
	go func() {
		defer close(published)
		for i := range total {
			keys[i] = fmt.Sprint("roll-", i)
			m := nats.NewMsg("orders.created")
			m.Header.Set("Nats-Msg-Id", keys[i])
			if _, err := k.js.PublishMsg(context.Background(), m); err != nil {
				pubErr = err
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	for i, old := range olds {
		poll.Until(t, 20*time.Second, "messages flowing", func() bool { return a.count() >= (i+1)*60 })
		next := start(t, env(i+2))
		waitReady(t, next)
		if err := old.stop(); err != nil {
			t.Fatalf("courier %d stopped with %v", i, err)
		}
	}
	<-published
	if pubErr != nil {
		t.Fatal(pubErr)
	}
	poll.Until(t, 30*time.Second, "every message delivered and acked", func() bool {
		_, missing := duplicates(a, keys)
		return len(missing) == 0 && k.drained()
	})
	if dups, _ := duplicates(a, keys); dups > 0 {
		t.Errorf("%d duplicate app calls during a rollout of clean stops, want 0", dups)
	}
	k.noDeadLetters()
}

// A node restarted while one courier's slow requests hold claims: the
// claims survive it, and the copies of their keys that reach the other
// courier wait (held, no attempt spent) instead of calling the app. Nothing
// is lost or dead-lettered.
func TestClusterNodeRestartWhileClaimsHeld(t *testing.T) {
	k := newCluster(t)
	release := make(chan struct{})
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if strings.HasPrefix(r.Header.Get("Idempotency-Key"), "slow-") {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(http.StatusOK)
	})
	// Claims outlive the slow requests (claim TTL = max(ack wait, HTTP
	// timeout)).
	env := func(i int) []string { return k.env(a.URL, i, "COURIER_HTTP_TIMEOUT=60s") }
	c1, c2 := start(t, env(0)), start(t, env(1))
	admins := []string{waitReady(t, c1), waitReady(t, c2)}
	claimedChecks := func() (n float64) {
		for _, adm := range admins {
			// Not served until a check first finds a claim.
			v, _ := metricstest.Lookup(t, metrics(adm), "courier_dedup_shared_checks_total", "answer", "claimed")
			n += v
		}
		return n
	}

	keys := []string{"slow-0", "slow-1", "slow-2"}
	for _, key := range keys {
		k.publishRetry("orders.created", key, map[string]string{"Nats-Msg-Id": key + "-0", "Idempotency-Key": key})
	}
	poll.Until(t, 20*time.Second, "the slow requests at the app", func() bool { return a.count() == len(keys) })
	// Copies until one lands on the courier not holding the claim and is
	// held there (copies landing beside the claim wait in-process).
	copies := 0
	for claimedChecks() == 0 {
		if copies == 30 {
			t.Fatal("30 copies published, none reached the courier without the claim")
		}
		copies++
		key := keys[copies%len(keys)]
		k.publishRetry("orders.created", key, map[string]string{"Nats-Msg-Id": fmt.Sprint(key, "-", copies), "Idempotency-Key": key})
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d copies published before one was held on the other courier", copies)

	leader := k.c.StreamLeader("KV_COURIER_DEDUP")
	t.Logf("restarting node %d, the bucket's leader", leader)
	k.c.Shutdown(leader)
	k.c.Restart(leader)
	k.c.StreamLeader("KV_COURIER_DEDUP")
	if n := a.count(); n != len(keys) {
		t.Errorf("app saw %d requests while the claims were held, want %d", n, len(keys))
	}
	close(release)
	poll.Until(t, 30*time.Second, "every copy acked", k.drained)
	for _, key := range keys {
		if n := a.calls(key); n != 1 {
			t.Errorf("app called %d times for %s, want 1", n, key)
		}
	}
	for _, r := range a.requests() {
		if got := r.Header.Get("Courier-Attempt"); got != "1" {
			t.Errorf("%s reached the app on attempt %s, want 1", r.Header.Get("Idempotency-Key"), got)
		}
	}
	k.noDeadLetters()
}

// Pulls on a cluster end with statuses a single server does not send (409
// Batch Completed, leadership changes): normal ends, not failures. Two
// couriers with 4 in flight each drain 600 messages of a 20 ms app, both
// taking part, ready throughout, with no fetch retried.
func TestClusterPulls(t *testing.T) {
	k := newCluster(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		time.Sleep(20 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	})
	cs := []*courier{start(t, k.env(a.URL, 0, "COURIER_MAX_INFLIGHT=4")), start(t, k.env(a.URL, 1, "COURIER_MAX_INFLIGHT=4"))}
	admins := []string{waitReady(t, cs[0]), waitReady(t, cs[1])}

	const total = 600
	keys := make([]string, total)
	var futures []jetstream.PubAckFuture
	for i := range keys {
		keys[i] = fmt.Sprint("pull-", i)
		m := nats.NewMsg("orders.created")
		m.Header.Set("Nats-Msg-Id", keys[i])
		f, err := k.js.PublishMsgAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	awaitAcks(t, futures)

	began := time.Now()
	deadline := began.Add(30 * time.Second)
	for !k.drained() || a.count() < total {
		if time.Now().After(deadline) {
			t.Fatalf("not drained within 30s: the app saw %d of %d", a.count(), total)
		}
		for i, adm := range admins {
			if code, body := get(t, "http://"+adm+"/readyz"); code != http.StatusOK {
				t.Fatalf("courier %d: /readyz %d %q while draining", i, code, body)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	// No assertion on speed (the bench measures it): 600 × 20 ms over 8
	// in flight is 1.5 s of app time.
	t.Logf("drained in %s", time.Since(began).Round(time.Millisecond))
	if dups, missing := duplicates(a, keys); dups > 0 || len(missing) > 0 {
		t.Errorf("%d duplicate app calls, %d keys never sent; want none", dups, len(missing))
	}
	// A message dropped from the tail of a pull comes back only after the
	// ack wait, an attempt spent.
	late := 0
	for _, r := range a.requests() {
		if r.Header.Get("Courier-Attempt") != "1" {
			late++
		}
	}
	if late > 0 {
		t.Errorf("%d of %d messages reached the app after their first attempt: pulls lost messages", late, total)
	}
	// One entry per key in the bucket: each claim was replaced by its
	// record (docs/operations.md sizes the bucket from these figures).
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if st, err := k.js.Stream(ctx, "KV_COURIER_DEDUP"); err != nil {
		t.Errorf("bucket stream: %v", err)
	} else if info, err := st.Info(ctx); err != nil {
		t.Errorf("bucket stream info: %v", err)
	} else {
		t.Logf("bucket: %d entries, %d bytes: %.0f bytes per key of %d bytes",
			info.State.Msgs, info.State.Bytes, float64(info.State.Bytes)/float64(info.State.Msgs), len(keys[0]))
		if info.State.Msgs != total {
			t.Errorf("bucket holds %d entries for %d keys, want one each", info.State.Msgs, total)
		}
	}
	for i, c := range cs {
		n := metricstest.Value(t, metrics(admins[i]), "courier_messages_total", "outcome", "delivered")
		t.Logf("courier %d delivered %v", i, n)
		if n == 0 {
			t.Errorf("courier %d delivered nothing: the pulls did not spread", i)
		}
		if lines := logLines(c, "cannot fetch"); len(lines) > 0 {
			t.Errorf("courier %d retried a fetch %d times: %v", i, len(lines), lines[0])
		}
	}
	k.noDeadLetters()
}

// The same key published twice (two messages, one Idempotency-Key) while
// two couriers consume: the app, slow enough for both copies to be in
// flight at once, is called once per key, whichever courier gets which copy.
func TestClusterConcurrentDuplicates(t *testing.T) {
	k := newCluster(t)
	var mu sync.Mutex
	caller := map[string]string{} // key → path of the courier that called
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		mu.Lock()
		caller[r.Header.Get("Idempotency-Key")] = r.URL.Path
		mu.Unlock()
		time.Sleep(300 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	})
	// Each courier posts to a path of its own, to tell who called.
	cs := []*courier{
		// Debug: the duplicates acked are read from the logs below.
		start(t, k.env(a.URL+"/c0", 0, "COURIER_MAX_INFLIGHT=4", "COURIER_LOG_LEVEL=debug")),
		start(t, k.env(a.URL+"/c1", 1, "COURIER_MAX_INFLIGHT=4", "COURIER_LOG_LEVEL=debug")),
	}
	waitReady(t, cs[0])
	waitReady(t, cs[1])
	const pairs = 6
	var keys []string
	for i := range pairs {
		key := fmt.Sprint("pair-", i)
		keys = append(keys, key)
		for _, copy := range []string{"a", "b"} {
			k.publishRetry("orders.created", key+copy, map[string]string{"Nats-Msg-Id": key + copy, "Idempotency-Key": key})
		}
	}
	poll.Until(t, 30*time.Second, "every copy acked", func() bool { return a.count() >= pairs && k.drained() })
	for _, key := range keys {
		if n := a.calls(key); n != 1 {
			t.Errorf("app called %d times for %s, want 1", n, key)
		}
	}
	// How many pairs were split over the two couriers: the duplicate acked
	// by the one that did not call the app.
	split := 0
	for i, c := range cs {
		for _, rec := range logLines(c, "duplicate acked") {
			key, _ := rec["key"].(string)
			mu.Lock()
			if caller[key] != fmt.Sprint("/c", i) {
				split++
			}
			mu.Unlock()
		}
	}
	t.Logf("%d of %d pairs split over the two couriers", split, pairs)
	if split == 0 {
		t.Error("no pair had its copies on both couriers: the claim in the bucket was not exercised")
	}
	k.noDeadLetters()
}

// Three couriers of a new durable started at the same moment (a new
// Deployment of three pods) all start: the dead-letter stream, the advisory
// stream and the bucket one of them creates are found by the others, even
// while the new streams have no leader to answer for them yet.
func TestClusterCouriersStartTogether(t *testing.T) {
	k := newCluster(t)
	a := newApp(t, nil)
	for round := range 2 {
		consumer := fmt.Sprint("together", round) // new streams each round
		cs := make([]*courier, 3)
		for i := range cs {
			cs[i] = start(t, k.env(a.URL, i, "COURIER_CONSUMER="+consumer))
		}
		for _, c := range cs {
			waitReady(t, c)
		}
		for i, c := range cs {
			if err := c.stop(); err != nil {
				t.Fatalf("round %d: courier %d stopped with %v", round, i, err)
			}
		}
	}
}
