package main

// Order per key with several replicas of one durable (README, "Order per
// key", Replicas), each courier a process of its own (startChild): killed
// with SIGKILL, stopped with SIGTERM in a rolling restart, scaled up and
// down, and on a 3-node cluster losing the stream leader's node. The app
// checks every request as it comes (keyedApp).

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/poll"
)

// keyedApp is the app of these tests. Message N of key k (subject
// orders.k, headers Order: k and N: n) is answered 2xx, but for a few keys'
// early messages: k<i> with i%10 == 3 has its message 0 answered 503 twice,
// and with i%10 == 7 its message 1 answered 429 with Retry-After 1s once.
// It notes as a problem a request of a key that arrives while another of
// the key is at the app, or before the message ahead of it was answered
// 2xx, or that is older than the last one answered 2xx; a request of the
// last message answered 2xx again (a courier killed after the app
// answered, before the key was recorded) is counted as a duplicate. A
// request marked Courier-Replay of a message answered 2xx before is of a
// rewind's second delivery, checked as a round of its own (replayRound,
// combo_rewind_test.go); of one not answered 2xx yet, it is its first
// delivery, checked as any.
type keyedApp struct {
	url   string
	delay time.Duration // how long each request takes
	// unordered: messages of a key may come in any order and at once
	// (order per key off); only what is lost and repeated is checked.
	// prefixes are the keys' prefixes (k0, k1, ... by default). Set
	// before the first request.
	unordered bool
	prefixes  []string
	// answers, when set, gives the answer to the try-th request of
	// message n of key, and how long it takes, in place of answerFor and
	// delay. Set before the first request.
	answers func(key string, n, try int) (status int, retryAfter string, took time.Duration)

	mu       sync.Mutex
	busy     map[string]int  // requests of the key at the app now
	done     map[string]int  // key → highest N answered 2xx
	tries    map[string]int  // "key/N" → requests so far
	answered map[string]bool // "key/N" answered 2xx (unordered)
	last     string          // the path of the latest request: who sent it
	ok       int             // messages answered 2xx, each once
	batches  int             // batch requests (COURIER_BATCH_MAX)
	largest  int64           // the largest batch request's body
	dups     int
	problems []string
	troubled []string            // the keys of the problems, in their order
	trace    map[string][]string // key → its requests, as check shows them
	// lastOK is when a message was last answered 2xx for the first time;
	// longestGap the longest time between two such answers.
	lastOK     time.Time
	longestGap time.Duration
	calls      []appCall // every request, as it came
	replay     replayRound
}

// appCall is one request to keyedApp: when it came, on which path (from
// which courier), of which key.
type appCall struct {
	at        time.Time
	path, key string
}

// firstCall returns the first request after t that ok accepts; false if
// none came.
func (a *keyedApp) firstCall(t time.Time, ok func(appCall) bool) (appCall, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.calls {
		if c.at.After(t) && ok(c) {
			return c, true
		}
	}
	return appCall{}, false
}

func newKeyedApp(t *testing.T, delay time.Duration) *keyedApp {
	t.Helper()
	a := &keyedApp{delay: delay, busy: map[string]int{}, done: map[string]int{}, tries: map[string]int{},
		answered: map[string]bool{}, trace: map[string][]string{}, prefixes: []string{"k"}, replay: newReplayRound()}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	a.url = srv.URL
	return a
}

func (a *keyedApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Courier-Batch") != "" {
		a.serveBatch(w, r)
		return
	}
	key, n, replay := r.Header.Get("Order"), r.Header.Get("N"), r.Header.Get("Courier-Replay")
	seq, _ := strconv.ParseUint(r.Header.Get("Courier-Sequence"), 10, 64)
	status, retryAfter, took, ok := a.arrive(key, n, r.URL.Path, r.Header.Get("Courier-Attempt"), replay, seq)
	if !ok {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	time.Sleep(took)
	a.leave(key, n, replay, status)
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.WriteHeader(status)
}

// serveBatch answers a batch (COURIER_BATCH_MAX) in Dapr's shape: each
// entry checked and answered as a request of its own would be, SUCCESS for
// a 2xx and RETRY otherwise, with the Retry-After any entry asked for.
func (a *keyedApp) serveBatch(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Entries []struct {
			EntryID  string              `json:"entryId"`
			Attempt  int                 `json:"attempt"`
			Sequence uint64              `json:"sequence"`
			Replay   string              `json:"replay"`
			Headers  map[string][]string `json:"headers"`
		} `json:"entries"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		a.mu.Lock()
		a.problem("", "a batch that is not JSON: %v", err)
		a.mu.Unlock()
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	first := func(vs []string) string {
		if len(vs) == 0 {
			return ""
		}
		return vs[0]
	}
	a.mu.Lock()
	a.batches++
	a.largest = max(a.largest, r.ContentLength)
	a.mu.Unlock()
	statuses := make([]int, len(body.Entries))
	var retryAfter string
	var took time.Duration
	for i, e := range body.Entries {
		st, ra, d, ok := a.arrive(first(e.Headers["Order"]), first(e.Headers["N"]), r.URL.Path, strconv.Itoa(e.Attempt), e.Replay, e.Sequence)
		if !ok {
			st = http.StatusBadRequest
		}
		statuses[i] = st
		retryAfter = cmp.Or(retryAfter, ra)
		took = max(took, d)
	}
	time.Sleep(took)
	out := make([]map[string]string, len(body.Entries))
	for i, e := range body.Entries {
		if statuses[i] != http.StatusBadRequest {
			a.leave(first(e.Headers["Order"]), first(e.Headers["N"]), e.Replay, statuses[i])
		}
		out[i] = map[string]string{"entryId": e.EntryID, "status": "SUCCESS"}
		if statuses[i] >= 300 {
			out[i]["status"] = "RETRY"
		}
	}
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"statuses": out})
}

// arrive checks a request (or batch entry) of message number of key, at
// stream sequence seq, as it reaches the app, notes it at the app, and
// returns the answer it gets and how long it takes; ok is false for a
// request without its key or place. replay is its Courier-Replay.
func (a *keyedApp) arrive(key, number, path, attempt, replay string, seq uint64) (status int, retryAfter string, took time.Duration, ok bool) {
	n, err := strconv.Atoi(number)
	a.mu.Lock()
	defer a.mu.Unlock()
	if key == "" || err != nil {
		a.problem(key, "a request without its key or place: Order %q, N %q", key, number)
		return 0, "", 0, false
	}
	a.noteSeq(key, n, seq)
	if replay != "" {
		a.noteReplay(key, n, replay)
	}
	last, seen := a.done[key]
	if !seen {
		last = -1
	}
	switch {
	case replay != "" && a.answeredBefore(key, n):
		a.arriveReplay(key, n)
	case a.unordered:
		if a.answered[fmt.Sprint(key, "/", n)] {
			a.dups++
		}
	case a.busy[key] > 0:
		a.problem(key, "%s/%d sent while another message of %s was at the app", key, n, key)
	case n > last+1:
		a.problem(key, "%s/%d sent before %s/%d was answered 2xx", key, n, key, last+1)
	case n < last:
		a.problem(key, "%s/%d sent again after %s/%d was answered 2xx", key, n, key, last)
	case n == last:
		a.dups++
	}
	a.busy[key]++
	a.last = path
	a.calls = append(a.calls, appCall{at: time.Now(), path: path, key: key})
	marked := ""
	if replay != "" {
		marked = ", replay " + replay
	}
	a.trace[key] = append(a.trace[key], fmt.Sprintf("%s %d from %s, attempt %s%s",
		time.Now().Format("15:04:05.000"), n, path, attempt, marked))
	id := fmt.Sprint(key, "/", n)
	a.tries[id]++
	if a.answers != nil {
		status, retryAfter, took = a.answers(key, n, a.tries[id])
		return status, retryAfter, took, true
	}
	status, retryAfter = answerFor(key, n, a.tries[id])
	return status, retryAfter, a.delay, true
}

// leave notes the answer to a request of message number of key that
// arrive accepted; replay is its Courier-Replay.
func (a *keyedApp) leave(key, number, replay string, status int) {
	n, _ := strconv.Atoi(number)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.busy[key]--
	if replay != "" && status < 300 && a.answeredBefore(key, n) {
		a.leaveReplay(key, n)
		return
	}
	if status < 300 {
		a.replay.answeredOnce(key, n)
	}
	if status < 300 && a.unordered {
		if id := fmt.Sprint(key, "/", n); !a.answered[id] {
			a.answered[id] = true
			a.done[key] = max(a.done[key], n)
			a.firstOK()
		}
		return
	}
	if status < 300 {
		if last, seen := a.done[key]; !seen && n == 0 || seen && n == last+1 {
			a.done[key] = n
			a.firstOK()
		}
	}
}

// firstOK counts a message answered 2xx for the first time. Called with
// mu held.
func (a *keyedApp) firstOK() {
	a.ok++
	a.progress()
}

// progress notes a message answered 2xx for the first time in its round:
// its first delivery, or a rewind's replay. Called with mu held.
func (a *keyedApp) progress() {
	now := time.Now()
	if !a.lastOK.IsZero() {
		a.longestGap = max(a.longestGap, now.Sub(a.lastOK))
	}
	a.lastOK = now
}

// answerFor is the app's answer to the try-th request of message n of key.
func answerFor(key string, n, try int) (status int, retryAfter string) {
	i, _ := strconv.Atoi(strings.TrimPrefix(key, "k"))
	switch {
	case i%10 == 3 && n == 0 && try <= 2:
		return http.StatusServiceUnavailable, ""
	case i%10 == 7 && n == 1 && try == 1:
		return http.StatusTooManyRequests, "1"
	}
	return http.StatusOK, ""
}

// problem notes what the app saw go wrong with a request of key. Called
// with mu held.
func (a *keyedApp) problem(key, format string, args ...any) {
	a.problems = append(a.problems, fmt.Sprintf(format, args...))
	a.troubled = append(a.troubled, key)
}

// delivered is how many messages were answered 2xx.
func (a *keyedApp) delivered() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ok
}

// sender is the path of the latest request (the courier that sent it).
func (a *keyedApp) sender() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

// check fails t unless every key k0..k<keys-1> had messages 0..rounds-1
// answered 2xx in order, with no problem seen, and every rewind's range
// was replayed (checkReplays); it logs the duplicates, and the requests of
// the first keys that went wrong.
func (a *keyedApp) check(t *testing.T, keys, rounds int) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, p := range a.problems {
		if i == 10 {
			t.Errorf("... and %d more", len(a.problems)-i)
			break
		}
		t.Error(p)
	}
	var lost []string
	for _, prefix := range a.prefixes {
		for i := range keys {
			key := fmt.Sprint(prefix, i)
			last, seen := a.done[key]
			full := seen && last == rounds-1
			if a.unordered {
				for n := range rounds {
					full = full && a.answered[fmt.Sprint(key, "/", n)]
				}
			}
			if !full {
				lost = append(lost, key)
				if len(lost) <= 5 {
					t.Errorf("%s: messages up to %d answered 2xx, want 0..%d", key, last, rounds-1)
				}
			}
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d keys not delivered in full", len(lost), keys*len(a.prefixes))
	}
	t.Logf("%d messages answered 2xx, %d duplicate requests", a.ok, a.dups)
	a.checkReplays(t)
	shown := map[string]bool{}
	for _, k := range append(a.troubled, lost...) {
		if !shown[k] && len(shown) < 3 {
			shown[k] = true
			t.Logf("requests of %s:\n\t%s", k, strings.Join(a.trace[k], "\n\t"))
		}
	}
}

// finished reports whether every key k0..k<keys-1> had its messages
// 0..rounds-1 answered 2xx, and every rewind's range was replayed.
func (a *keyedApp) finished(keys, rounds int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ok == keys*rounds*len(a.prefixes) && a.replayed()
}

// waitAllDelivered waits until every key's messages 0..rounds-1 were
// answered 2xx and acked reports the durable acked; if they are not within
// timeout, it says what was missing and fails t.
func (a *keyedApp) waitAllDelivered(t *testing.T, timeout time.Duration, keys, rounds int, acked func() bool, info func() *jetstream.ConsumerInfo) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !a.finished(keys, rounds) || !acked() {
		if time.Now().After(deadline) {
			a.check(t, keys, rounds)
			if ci := info(); ci != nil {
				t.Logf("consumer: %d pending, %d awaiting an ack, %d redelivered", ci.NumPending, ci.NumAckPending, ci.NumRedelivered)
			}
			t.Fatalf("not every message delivered and acked within %s", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// keyedMsg is message n of key k<i>, as keyedApp reads it; its
// Nats-Msg-Id makes a publish retried over a leader election stored once.
func keyedMsg(i, n int) *nats.Msg {
	key := fmt.Sprint("k", i)
	m := nats.NewMsg("orders." + key)
	m.Header.Set("Order", key)
	m.Header.Set("N", strconv.Itoa(n))
	m.Header.Set("Nats-Msg-Id", fmt.Sprint(key, "-", n))
	m.Data = []byte(key)
	return m
}

// publishRounds publishes messages from..to-1 of keys k0..k<keys-1>, round
// by round (every key's message n, then every key's n+1), and waits for
// the stream's acknowledgements.
func publishRounds(t *testing.T, js jetstream.JetStream, keys, from, to int) {
	t.Helper()
	var futures []jetstream.PubAckFuture
	for n := from; n < to; n++ {
		for i := range keys {
			f, err := js.PublishMsgAsync(keyedMsg(i, n))
			if err != nil {
				t.Fatal(err)
			}
			futures = append(futures, f)
		}
	}
	awaitAcks(t, futures)
}

// publishRetrying is publishRounds one message at a time, each tried again
// while the cluster cannot answer (a leader election).
func publishRetrying(t *testing.T, k *cluster, keys, from, to int) {
	t.Helper()
	for n := from; n < to; n++ {
		for i := range keys {
			m := keyedMsg(i, n)
			k.publishRetry(m.Subject, string(m.Data), map[string]string{
				"Order": m.Header.Get("Order"), "N": m.Header.Get("N"), "Nats-Msg-Id": m.Header.Get("Nats-Msg-Id"),
			})
		}
	}
}

// moveConsumerLeader makes node the leader of consumer on ORDERS (a leader
// stepdown naming it preferred).
func moveConsumerLeader(t *testing.T, k *cluster, consumer string, node int) {
	t.Helper()
	req := fmt.Sprintf(`{"placement":{"preferred":%q}}`, k.c.Node(node).Name())
	poll.Until(t, 20*time.Second, fmt.Sprint("node ", node, " leading the durable"), func() bool {
		if k.c.ConsumerLeader("ORDERS", consumer) == node {
			return true
		}
		resp, err := k.nc.Request("$JS.API.CONSUMER.LEADER.STEPDOWN.ORDERS."+consumer, []byte(req), 5*time.Second)
		if err != nil || !strings.Contains(string(resp.Data), `"success":true`) {
			return false
		}
		poll.Until(t, 20*time.Second, "a leader of the durable", func() bool { return k.c.ConsumerLeader("ORDERS", consumer) >= 0 })
		return k.c.ConsumerLeader("ORDERS", consumer) == node
	})
}

// publisher publishes a round of keys messages every interval, from round
// 0, in the background until stop (or most rounds); stop returns how many
// rounds were published.
func publisher(t *testing.T, js jetstream.JetStream, keys, most int, interval time.Duration) (stop func() int) {
	t.Helper()
	quit, done := make(chan struct{}), make(chan struct{})
	rounds := 0
	var err error
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for rounds < most {
			for i := range keys {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err = js.PublishMsg(ctx, keyedMsg(i, rounds))
				cancel()
				if err != nil {
					return
				}
			}
			rounds++
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	stop = func() int {
		once.Do(func() { close(quit); <-done })
		if err != nil {
			t.Fatalf("publishing round %d: %v", rounds, err)
		}
		return rounds
	}
	t.Cleanup(func() { stop() })
	return stop
}

// replicaSet is couriers on one durable, each a process of its own posting
// to a path of its own (/c<i>), so that the app tells who sent what.
type replicaSet struct {
	t   *testing.T
	url string
	env func(url string, i int) []string
	cs  []*child
}

func newReplicaSet(t *testing.T, appURL string, n int, env func(url string, i int) []string) *replicaSet {
	return &replicaSet{t: t, url: appURL, env: env, cs: make([]*child, n)}
}

// start starts replica i (again, if it was stopped) and waits until it is
// ready.
func (s *replicaSet) start(i int) {
	s.t.Helper()
	ch := startChild(s.t, s.env(fmt.Sprint(s.url, "/c", i), i))
	s.cs[i] = ch
	waitReady(s.t, ch.asCourier())
}

// active is the replica that sent the app's latest request: the one the
// durable is pinned to, once requests have come since the last change.
func (s *replicaSet) active(a *keyedApp) int {
	s.t.Helper()
	p := a.sender()
	i, err := strconv.Atoi(strings.TrimPrefix(p, "/c"))
	if err != nil || i < 0 || i >= len(s.cs) {
		s.t.Fatalf("the latest request came on %q, no replica's path", p)
	}
	return i
}

// term stops replica i with SIGTERM and fails the test unless it exits
// with status 0.
func (s *replicaSet) term(i int) {
	s.t.Helper()
	if err := s.cs[i].term(); err != nil {
		s.t.Fatalf("replica %d stopped with %v\n%s", i, err, s.cs[i].logs.String())
	}
}

// term sends SIGTERM and waits for the process to exit by itself: its exit
// status (nil: 0). Once, as kill.
func (ch *child) term() error {
	err := errors.New("already stopped")
	ch.once.Do(func() {
		_ = ch.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err = <-ch.done:
		case <-time.After(30 * time.Second):
			_ = ch.cmd.Process.Kill()
			<-ch.done
			err = errors.New("did not exit within 30s of SIGTERM")
		}
	})
	return err
}

// waitingIn waits until the courier of ch holds messages behind an earlier
// one of their key (courier_order_messages_waiting): it is mid-key.
func waitingIn(t *testing.T, ch *child) {
	t.Helper()
	admin := adminAddr(t, ch.asCourier())
	poll.Until(t, 10*time.Second, "messages waiting behind their keys", func() bool {
		v, ok := metricstest.Lookup(t, metrics(admin), "courier_order_messages_waiting")
		return ok && v > 0
	})
}

// allAcked reports whether the durable has nothing left to deliver and
// nothing waiting for an ack (redeliveries allowed: couriers were killed).
func allAcked(h *harness) bool {
	info := h.consumerInfo("courier")
	return info != nil && info.NumPending == 0 && info.NumAckPending == 0
}

// orderEnv is the environment of replica i on h: order by the subject's
// second token, a short ack wait (the pin's TTL is then 5s, the wait after
// a takeover 4s), the shared store (a replica that takes over knows what
// the one before recorded), enough deliveries for every kill.
func orderEnv(h *harness, url string, i int, extra ...string) []string {
	base := []string{
		"COURIER_ORDER_KEY=subject:2",
		"COURIER_ACK_WAIT=2s",
		"COURIER_MAX_DELIVER=20",
		"COURIER_DEDUP_STORE=shared",
		"COURIER_DEDUP_DIR=" + h.t.TempDir(),
		"COURIER_LOG_LEVEL=" + cmp.Or(os.Getenv("COURIERTEST_LOG_LEVEL"), "info"),
	}
	return h.env(url, append(base, extra...)...)
}

// Three replicas on one durable; the one the durable is pinned to is
// killed (SIGKILL) while it holds keys with messages waiting, twice, and
// restarted each time: a standby takes over, and every key still reaches
// the app in stream order, one message at a time, nothing lost or
// dead-lettered. Fewer keys than a courier has out at once (its queue of
// 64 and 8 in flight), so that every pull brings a message of a key
// already busy and keys have messages waiting whenever the pinned courier
// delivers: with more keys than that, messages wait only behind the
// app's early retries and while a takeover's wait is let down, and a kill
// counted in messages delivered can come after both.
func TestOrderReplicasThroughKills(t *testing.T) {
	h := newHarness(t)
	a := newKeyedApp(t, 10*time.Millisecond)
	const keys, rounds = 40, 30
	publishRounds(t, h.js, keys, 0, rounds)
	s := newReplicaSet(t, a.url, 3, func(url string, i int) []string { return orderEnv(h, url, i) })
	for i := range 3 {
		s.start(i)
	}
	killedAt := 0
	for kill, after := range []int{200, 600} {
		// Past the count, and past the last kill by a few rounds: the
		// courier that called last is then the one pinned now, not the
		// one just killed (a busy machine can reach 600 before the first
		// kill).
		after = min(max(after, killedAt+2*keys), keys*(rounds-1))
		poll.Until(t, 60*time.Second, fmt.Sprint(after, " messages delivered"), func() bool { return a.delivered() >= after })
		i := s.active(a)
		t.Logf("replica %d sends, %d messages delivered", i, a.delivered())
		waitingIn(t, s.cs[i])
		killedAt = a.delivered()
		t.Logf("kill %d: replica %d, after %d messages delivered", kill+1, i, killedAt)
		s.cs[i].kill(t)
		s.start(i)
	}
	a.settledInOrder(t, h, keys, rounds, false)
}

// The same with batches (COURIER_BATCH_MAX): a key has at most one entry
// in flight, so a batch carries one message of each of its keys, and the
// kills land while batches are at the app.
func TestOrderReplicasWithBatchesThroughKills(t *testing.T) {
	h := newHarness(t)
	a := newKeyedApp(t, 10*time.Millisecond)
	const keys, rounds = 200, 6
	publishRounds(t, h.js, keys, 0, rounds)
	s := newReplicaSet(t, a.url, 3, func(url string, i int) []string {
		return orderEnv(h, url, i, "COURIER_BATCH_MAX=8", "COURIER_BATCH_WAIT=5ms")
	})
	defer func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.batches == 0 {
			t.Error("no batch reached the app")
		}
		t.Logf("%d batch requests, the largest %d bytes", a.batches, a.largest)
	}()
	for i := range 3 {
		s.start(i)
	}
	killedAt := 0
	for kill, after := range []int{200, 600} {
		// Past the count, and past the last kill by a few rounds: the
		// courier that called last is then the one pinned now, not the
		// one just killed (a busy machine can reach 600 before the first
		// kill).
		after = min(max(after, killedAt+2*keys), keys*(rounds-1))
		poll.Until(t, 60*time.Second, fmt.Sprint(after, " messages delivered"), func() bool { return a.delivered() >= after })
		i := s.active(a)
		killedAt = a.delivered()
		t.Logf("kill %d: replica %d, after %d messages delivered", kill+1, i, killedAt)
		s.cs[i].kill(t)
		s.start(i)
	}
	a.settledInOrder(t, h, keys, rounds, false)
}

// A rolling restart of three replicas while messages are published: each
// in turn stopped with SIGTERM, started again and waited for until ready.
// Every key reaches the app in stream order, one message at a time,
// nothing lost, nothing sent twice.
func TestOrderReplicasRollingRestart(t *testing.T) {
	h := newHarness(t)
	a := newKeyedApp(t, 2*time.Millisecond)
	const keys = 200
	s := newReplicaSet(t, a.url, 3, func(url string, i int) []string { return orderEnv(h, url, i) })
	for i := range 3 {
		s.start(i)
	}
	stop := publisher(t, h.js, keys, 30, 500*time.Millisecond)
	for i := range 3 {
		at := a.delivered()
		poll.Until(t, 30*time.Second, "messages flowing", func() bool { return a.delivered() >= at+keys })
		t.Logf("replica %d stopped, after %d messages delivered", i, a.delivered())
		s.term(i)
		s.start(i)
	}
	rounds := stop()
	a.settledInOrder(t, h, keys, rounds, true)
}

// Scaling 1 → 3 → 1 while messages are published: one replica, two more
// added, then two stopped with SIGTERM, the one the durable is pinned to
// among them, so that the one left takes over. Every key reaches the app in
// stream order, one message at a time, nothing lost, nothing sent twice.
func TestOrderReplicasScaling(t *testing.T) {
	h := newHarness(t)
	a := newKeyedApp(t, 2*time.Millisecond)
	const keys = 200
	s := newReplicaSet(t, a.url, 3, func(url string, i int) []string { return orderEnv(h, url, i) })
	s.start(0)
	stop := publisher(t, h.js, keys, 30, 500*time.Millisecond)
	poll.Until(t, 30*time.Second, "messages flowing", func() bool { return a.delivered() >= keys })
	s.start(1)
	s.start(2)
	at := a.delivered()
	poll.Until(t, 30*time.Second, "messages flowing with three replicas", func() bool { return a.delivered() >= at+keys })
	active := s.active(a)
	other := (active + 1) % 3
	t.Logf("stopping replicas %d (active) and %d, after %d messages delivered", active, other, a.delivered())
	s.term(active)
	s.term(other)
	at = a.delivered()
	poll.Until(t, 30*time.Second, "the replica left delivering", func() bool { return a.delivered() >= at+keys })
	rounds := stop()
	a.settledInOrder(t, h, keys, rounds, true)
}

// The pin moved away from a courier that is alive and holds keys with
// messages waiting (here by the unpin API; a consumer's new leader, or a
// pinned courier that went quiet for the pin's TTL, do the same): it gives
// them back, and the courier now pinned sends them, and those published
// after, in stream order, one message of a key at a time.
func TestOrderPinMovesFromALiveCourier(t *testing.T) {
	h := newHarness(t)
	a := newKeyedApp(t, 200*time.Millisecond) // each key's line is longer than the wait after a takeover
	const keys, rounds, before = 4, 40, 30
	publishRounds(t, h.js, keys, 0, before)
	s := newReplicaSet(t, a.url, 2, func(url string, i int) []string { return orderEnv(h, url, i) })
	s.start(0)
	poll.Until(t, 20*time.Second, "replica 0 delivering", func() bool { return a.delivered() >= keys })
	s.start(1)
	waitingIn(t, s.cs[0])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := h.js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	// The pin is given anew with the next message, to a pull without a pin
	// id: replica 1's, as a rule; unpinned again should replica 0 get it
	// back.
	n := before
	pinned := func() bool { return len(logLines(s.cs[1].asCourier(), "pinned to this courier")) > 0 }
	pinnedBack := func() int { return len(logLines(s.cs[0].asCourier(), "pinned to this courier")) }
	for !pinned() {
		if n == rounds {
			t.Fatal("replica 1 never got the pin")
		}
		was := pinnedBack()
		if err := stream.UnpinConsumer(ctx, "courier", "courier"); err != nil {
			t.Fatalf("unpin: %v", err)
		}
		publishRounds(t, h.js, keys, n, n+1)
		n++
		poll.Until(t, 10*time.Second, "a pin given", func() bool { return pinned() || pinnedBack() > was })
	}
	t.Logf("replica 1 pinned after %d rounds unpinned", n-before)
	publishRounds(t, h.js, keys, n, rounds)
	a.settledInOrder(t, h, keys, rounds, false)
	if len(logLines(s.cs[0].asCourier(), "the durable's pin moved")) == 0 {
		t.Error("replica 0 did not log that the pin moved away")
	}
}

// Three replicas on a 3-node cluster (R3 stream, bucket and marks), the
// stream leader's node shut down while keys are being delivered and
// retried. That node is made the durable's leader first, if it is not:
// the durable's new leader then gives the pin anew, often to a standby
// while the courier that had it is alive and holds messages (it gives
// them back). Every key still reaches the app in stream order, one
// message at a time, nothing lost or dead-lettered.
func TestOrderReplicasClusterNodeLost(t *testing.T) {
	k := newCluster(t)
	a := newKeyedApp(t, 5*time.Millisecond)
	const keys, rounds = 200, 6
	publishRetrying(t, k, keys, 0, rounds/2)
	s := newReplicaSet(t, a.url, 3, func(url string, i int) []string {
		return k.env(url, i, "COURIER_ORDER_KEY=header:Order", "COURIER_ACK_WAIT=2s", "COURIER_MAX_DELIVER=20")
	})
	for i := range 3 {
		s.start(i)
	}
	poll.Until(t, 60*time.Second, "messages delivered", func() bool { return a.delivered() >= keys })
	leader := k.c.StreamLeader("ORDERS")
	if k.c.ConsumerLeader("ORDERS", "courier") != leader {
		moveConsumerLeader(t, k, "courier", leader)
	}
	t.Logf("shutting down node %d, the stream's and the durable's leader, after %d messages delivered by replica %d",
		leader, a.delivered(), s.active(a))
	k.c.Shutdown(leader)
	publishRetrying(t, k, keys, rounds/2, rounds)
	a.waitAllDelivered(t, 90*time.Second, keys, rounds, k.drained, func() *jetstream.ConsumerInfo { return k.consumerInfo("courier") })
	a.check(t, keys, rounds)
	k.noDeadLetters()
	// Whether the pin moved depends on where the consumer's leader was.
	for i, ch := range s.cs {
		t.Logf("replica %d: pinned %d times, the pin moved away %d times", i,
			len(logLines(ch.asCourier(), "pinned to this courier")), len(logLines(ch.asCourier(), "the durable's pin moved")))
	}
}

// settledInOrder waits until every round of every key has reached the app
// and the durable on h has nothing unacked, then checks the order, that no
// dead letter was stored, and, with clean, that nothing was sent twice
// (every stop a SIGTERM).
func (a *keyedApp) settledInOrder(t *testing.T, h *harness, keys, rounds int, clean bool) {
	t.Helper()
	a.waitAllDelivered(t, 60*time.Second, keys, rounds, func() bool { return allAcked(h) }, func() *jetstream.ConsumerInfo { return h.consumerInfo("courier") })
	a.check(t, keys, rounds)
	if clean && a.dups > 0 {
		t.Errorf("%d duplicate requests through clean stops, want none", a.dups)
	}
	if dls := h.deadLetters("dlq.ORDERS.courier"); len(dls) > 0 {
		t.Errorf("%d dead letters, want none", len(dls))
	}
}
