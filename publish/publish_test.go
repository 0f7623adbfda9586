package publish

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/subject"
)

// TestPublishStored: a publish is answered 200 with the stream and
// sequence once stored; the body is the data, the app's headers are the
// message's (not HTTP's own, nor the token), Idempotency-Key is its
// Nats-Msg-Id, traceparent keeps its W3C name.
func TestPublishStored(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{})

	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ans := a.post("orders.created", `{"id":1}`,
		"Content-Type", "application/json", "Idempotency-Key", "order-1", "X-Tenant", "acme",
		"X-Multi", "a", "X-Multi", "b", "Traceparent", tp, "Connection", "X-Hop", "X-Hop", "gone",
		"User-Agent", "test", "Authorization", "Bearer not-for-the-stream")
	if ans.status != http.StatusOK || ans.Stream != "ORDERS" || ans.Seq != 1 || ans.Duplicate {
		t.Fatalf("answer %+v, want 200 ORDERS seq 1 not duplicate", ans)
	}
	m := stored(t, js, "ORDERS", 1)
	if string(m.Data) != `{"id":1}` || m.Subject != "orders.created" {
		t.Errorf("stored %q on %s", m.Data, m.Subject)
	}
	want := map[string][]string{
		"Content-Type": {"application/json"}, "Idempotency-Key": {"order-1"}, "Nats-Msg-Id": {"order-1"},
		"X-Tenant": {"acme"}, "X-Multi": {"a", "b"}, "traceparent": {tp},
	}
	for k, v := range want {
		if got := m.Header[k]; strings.Join(got, ",") != strings.Join(v, ",") {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	for _, gone := range []string{"Connection", "X-Hop", "User-Agent", "Authorization", "Accept-Encoding", "Content-Length"} {
		if _, ok := m.Header[gone]; ok {
			t.Errorf("header %s stored: %q", gone, m.Header[gone])
		}
	}

	// Without an Idempotency-Key, courier gives the message an id of its
	// own (so its retries store it once).
	ans = a.post("orders.created", "two")
	m = stored(t, js, "ORDERS", ans.Seq)
	if id := m.Header.Get(nats.MsgIdHdr); !strings.HasPrefix(id, generatedIDPrefix) {
		t.Errorf("Nats-Msg-Id %q, want one starting %q", id, generatedIDPrefix)
	}
	if a.count(outcomeStored) != 2 {
		t.Errorf("stored counted %v, want 2", a.count(outcomeStored))
	}
}

// TestPublishIdempotencyKey: the same Idempotency-Key published twice is
// stored once; the second answer names the first's sequence, as a
// duplicate.
func TestPublishIdempotencyKey(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{})

	first := a.post("orders.paid", "pay 1", "Idempotency-Key", "pay-1")
	again := a.post("orders.paid", "pay 1", "Idempotency-Key", "pay-1")
	other := a.post("orders.paid", "pay 2", "Idempotency-Key", "pay-2")
	if first.status != 200 || first.Duplicate || again.status != 200 || !again.Duplicate || again.Seq != first.Seq {
		t.Errorf("first %+v, again %+v: want the same sequence, the second a duplicate", first, again)
	}
	if other.Duplicate || other.Seq == first.Seq {
		t.Errorf("another key: %+v", other)
	}
	if n := msgCount(t, js, "ORDERS"); n != 2 {
		t.Errorf("stream holds %d messages, want 2", n)
	}
	if a.count(outcomeDuplicate) != 1 || a.count(outcomeStored) != 2 {
		t.Errorf("duplicate %v, stored %v", a.count(outcomeDuplicate), a.count(outcomeStored))
	}
}

// TestPublishRefusals: every refusal has its status, a JSON error naming
// the problem, its outcome counted, and nothing stored.
func TestPublishRefusals(t *testing.T) {
	srv, js := smallPayloadOrders(t)
	createStream(t, js, jetstream.StreamConfig{Name: "SMALL", Subjects: []string{"small.>"}, MaxMsgSize: 100})
	a := startAPI(t, srv.ClientURL(), Options{Subjects: []string{"orders.>", "small.>", "nostream.>", "$JS.>"}})
	if a.post("orders.seed", "seed").status != 200 {
		t.Fatal("seed publish failed")
	}

	big := strings.Repeat("x", maxPayload+1)
	tests := []struct {
		name    string
		subject string
		body    string
		headers []string
		status  int
		outcome string
		want    string // in the error
	}{
		{"outside the subjects", "billing.charged", "x", nil, 403, outcomeForbidden, "not among the subjects"},
		{"reserved though allowed", "$JS.API.STREAM.DELETE.ORDERS", "", nil, 403, outcomeForbidden, "reserved by NATS"},
		{"empty token", "orders..created", "x", nil, 400, outcomeInvalid, "empty token"},
		{"wildcard", "orders.*", "x", nil, 400, outcomeInvalid, "not a literal subject"},
		{"no subject", "", "x", nil, 400, outcomeInvalid, "no subject"},
		{"a Nats header NATS acts on", "orders.created", "x", []string{"Nats-Rollup", "sub"}, 400, outcomeInvalid, "Nats-Rollup is not accepted"},
		{"two ids", "orders.created", "x", []string{"Idempotency-Key", "a", "Nats-Msg-Id", "b"}, 400, outcomeInvalid, "differ"},
		{"no stream", "nostream.created", "x", nil, 404, outcomeNoStream, "no stream captures"},
		{"body over max_payload", "orders.created", big, nil, 413, outcomeTooLarge, "max_payload"},
		{"headers tip it over", "orders.created", strings.Repeat("x", maxPayload-100), []string{"X-Pad", strings.Repeat("p", 200)}, 413, outcomeTooLarge, "with its headers"},
		{"over the stream's limit", "small.created", strings.Repeat("x", 200), nil, 413, outcomeTooLarge, "refused by the stream"},
		{"wrong last sequence", "orders.created", "x", []string{"Nats-Expected-Last-Sequence", "999"}, 412, outcomeExpectation, "wrong last sequence"},
		{"wrong last subject sequence", "orders.seed", "x", []string{"Nats-Expected-Last-Subject-Sequence", "7"}, 412, outcomeExpectation, "wrong last sequence"},
		{"wrong stream", "orders.created", "x", []string{"Nats-Expected-Stream", "OTHER"}, 412, outcomeExpectation, "expected stream does not match"},
		{"wrong last msg id", "orders.created", "x", []string{"Nats-Expected-Last-Msg-Id", "nope"}, 412, outcomeExpectation, "wrong last msg ID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := a.count(tt.outcome)
			ans := a.post(tt.subject, tt.body, tt.headers...)
			if ans.status != tt.status || !strings.Contains(ans.Error, tt.want) {
				t.Errorf("answer %d %q, want %d containing %q", ans.status, ans.Error, tt.status, tt.want)
			}
			if got := a.count(tt.outcome); got != before+1 {
				t.Errorf("%s counted %v, want %v", tt.outcome, got, before+1)
			}
		})
	}
	if n := msgCount(t, js, "ORDERS") + msgCount(t, js, "SMALL"); n != 1 {
		t.Errorf("%d messages stored, want only the seed", n)
	}

	// An expectation that holds is passed on and met.
	if ans := a.post("orders.created", "x", "Nats-Expected-Last-Sequence", "1", "Nats-Expected-Stream", "ORDERS"); ans.status != 200 || ans.Seq != 2 {
		t.Errorf("expectations that hold: %+v", ans)
	}

	// What HTTP itself refuses: another method, a header block JetStream
	// could never store.
	resp, err := http.Get(a.url + PathPrefix + "orders.created")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") == "" {
		t.Errorf("GET: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	if ans, err := a.tryPost("orders.created", "x", "X-Huge", strings.Repeat("h", 80<<10)); err == nil && ans.status != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("an 80 KiB header: %d", ans.status)
	}
}

// TestPublishToken: with a token asked for, a request without it or with
// another is refused 401 naming the scheme; the token itself is taken from
// the func on every request, so a rotated token holds at once.
func TestPublishToken(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	var token atomic.Value
	token.Store("s3cret")
	a := startAPI(t, srv.ClientURL(), Options{Token: func() string { return token.Load().(string) }})

	for _, auth := range []string{"", "Bearer wrong", "Basic czNjcmV0", "Bearer s3cret-and-more"} {
		var h []string
		if auth != "" {
			h = []string{"Authorization", auth}
		}
		ans := a.post("orders.created", "x", h...)
		if ans.status != http.StatusUnauthorized || !strings.HasPrefix(ans.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("Authorization %q: %d, WWW-Authenticate %q", auth, ans.status, ans.header.Get("WWW-Authenticate"))
		}
	}
	if ans := a.post("orders.created", "x", "Authorization", "Bearer s3cret"); ans.status != 200 {
		t.Errorf("the token: %+v", ans)
	}
	token.Store("rotated")
	if ans := a.post("orders.created", "x", "Authorization", "Bearer s3cret"); ans.status != http.StatusUnauthorized {
		t.Errorf("the old token after rotation: %d", ans.status)
	}
	if ans := a.post("orders.created", "x", "Authorization", "bearer rotated"); ans.status != 200 {
		t.Errorf("the new token: %+v", ans)
	}
	token.Store("") // none asked
	if ans := a.post("orders.created", "x"); ans.status != 200 {
		t.Errorf("no token asked: %+v", ans)
	}
	if a.count(outcomeUnauthorized) != 5 || msgCount(t, js, "ORDERS") != 3 {
		t.Errorf("unauthorized %v, stored %d", a.count(outcomeUnauthorized), msgCount(t, js, "ORDERS"))
	}
}

// TestPublishUnavailable: with NATS down, a publish is retried for its
// time and then answered 503 with Retry-After, and a publish beyond
// MaxConcurrent is answered 503 busy at once.
func TestPublishUnavailable(t *testing.T) {
	srv := natstest.NewServer(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{Timeout: 1500 * time.Millisecond, MaxConcurrent: 1, RetryAfter: 2 * time.Second})
	natstest.Stop(srv)
	poll.Until(t, 5*time.Second, "the API's connection to notice", func() bool { return !a.nc.IsConnected() })

	held := make(chan answer, 1)
	go func() {
		ans, _ := a.tryPost("orders.created", "x", "Idempotency-Key", "k1")
		held <- ans
	}()
	poll.Until(t, 5*time.Second, "the first publish in progress", func() bool { return len(a.srv.slots) == 1 })
	busy := a.post("orders.created", "y")
	if busy.status != 503 || busy.retryAfter != "2" || !strings.Contains(busy.Error, "busy") {
		t.Errorf("beyond MaxConcurrent: %+v", busy)
	}
	start := time.Now()
	ans := <-held
	if ans.status != 503 || ans.retryAfter != "2" || !strings.Contains(ans.Error, "no acknowledgement within 1.5s") ||
		!strings.Contains(ans.Error, "not connected") {
		t.Errorf("NATS down: %+v", ans)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Errorf("answered after %s", waited)
	}
	if a.count(outcomeBusy) != 1 || a.count(outcomeUnavailable) != 1 {
		t.Errorf("busy %v, unavailable %v", a.count(outcomeBusy), a.count(outcomeUnavailable))
	}
}

// TestPublishBeforeConnect: the API serves before it has a connection; a
// publish waits for it within its time and is stored once it comes, and
// one whose time runs out first is answered 503 with Retry-After.
func TestPublishBeforeConnect(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	nc, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	s, err := Listen("127.0.0.1:0", Options{Subjects: []string{"orders.>"}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	a := &api{t: t, srv: s, nc: nc, url: "http://" + s.Addr()}

	if ans := a.post("orders.early", "x"); ans.status != 503 || ans.retryAfter != "1" || !strings.Contains(ans.Error, "not connected") {
		t.Errorf("before the connection: %+v", ans)
	}
	waiting := make(chan answer, 1)
	go func() { waiting <- a.post("orders.waits", "y", "Idempotency-Key", "w") }()
	poll.Until(t, 5*time.Second, "the publish waiting", func() bool { return value(s.m.inflight) == 1 })
	s.Connect(nc, js)
	if ans := <-waiting; ans.status != 200 || ans.Seq != 1 {
		t.Errorf("connected while it waited: %+v", ans)
	}
}

// TestPublishDuringRestart: publishes while the NATS server restarts
// (same port and store) are answered 200, each then stored at the
// sequence named, or 503 with Retry-After, never anything else; the 503'd
// ones retried with their Idempotency-Key are stored too, and no message
// is stored twice.
func TestPublishDuringRestart(t *testing.T) {
	dir := t.TempDir()
	srv := natstest.NewServer(t, natstest.Options{StoreDir: dir})
	var mu sync.Mutex
	t.Cleanup(func() { mu.Lock(); defer mu.Unlock(); natstest.Stop(srv) })
	port := srv.Addr().(*net.TCPAddr).Port
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{Timeout: 1500 * time.Millisecond})

	stop := make(chan struct{})
	answers := publishLoop(a, 4, stop)
	poll.Until(t, 10*time.Second, "publishes stored before the restart", func() bool { return a.count(outcomeStored) >= 20 })
	natstest.Stop(srv)
	// Down long enough that some publishes run out of time.
	poll.Until(t, 15*time.Second, "a publish answered 503 while NATS is down", func() bool { return a.count(outcomeUnavailable) >= 1 })
	mu.Lock()
	srv = natstest.NewServer(t, natstest.Options{Port: port, StoreDir: dir})
	mu.Unlock()
	after := a.count(outcomeStored)
	poll.Until(t, 20*time.Second, "publishes stored after the restart", func() bool { return a.count(outcomeStored) >= after+20 })
	close(stop)
	checkAnswers(t, a, js, answers())
	// The 503s came after courier's own attempts, not after the first.
	if n := value(a.srv.m.retries); n == 0 {
		t.Error("no publish was retried within its request while NATS was down")
	}
}

// TestPublishLeaderLoss: on a 3-node cluster, publishes while the stream's
// leader is shut down are answered 200 (stored at the sequence named) or
// 503 with Retry-After; a new leader takes them, and retried 503s are
// stored once. With a second node down (no quorum) a publish is answered
// 503 with Retry-After, and stored once when the quorum is back.
func TestPublishLeaderLoss(t *testing.T) {
	c := natstest.StartCluster(t, 3, natstest.ClusterOptions{})
	_, js := natstest.ConnectURL(t, c.URL())
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Replicas: 3})
	a := startAPI(t, c.URL(), Options{Timeout: 5 * time.Second})

	stop := make(chan struct{})
	answers := publishLoop(a, 4, stop)
	poll.Until(t, 20*time.Second, "publishes stored", func() bool { return a.count(outcomeStored) >= 20 })
	leader := c.StreamLeader("ORDERS")
	c.Shutdown(leader)
	after := a.count(outcomeStored)
	poll.Until(t, 60*time.Second, "publishes stored under a new leader", func() bool { return a.count(outcomeStored) >= after+20 })
	if now := c.StreamLeader("ORDERS"); now == leader {
		t.Fatalf("leader still node %d", now)
	}
	close(stop)
	checkAnswers(t, a, js, answers())
	t.Logf("%d publishes; %v answered 503 and retried; %v retries within requests",
		len(answers()), a.count(outcomeUnavailable), value(a.srv.m.retries))

	// A second node down: no quorum. A publish is retried for its time,
	// then answered 503 with Retry-After; with the node back it is stored,
	// once.
	second := (leader + 1) % 3
	c.Shutdown(second)
	short := startAPI(t, c.URL(), Options{Timeout: 2 * time.Second})
	if ans := short.post("orders.created", "q", "Idempotency-Key", "quorum"); ans.status != 503 || ans.retryAfter == "" {
		t.Errorf("without quorum: %+v", ans)
	}
	c.Restart(second)
	var ans answer
	poll.Until(t, 60*time.Second, "a publish stored with the quorum back", func() bool {
		ans = short.post("orders.created", "q", "Idempotency-Key", "quorum")
		return ans.status == 200
	})
	var n int
	for seq := uint64(1); seq <= msgCount(t, js, "ORDERS"); seq++ {
		if stored(t, js, "ORDERS", seq).Header.Get(nats.MsgIdHdr) == "quorum" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the publish retried across the lost quorum is stored %d times", n)
	}
}

// publishLoop runs workers publishing until stop closes, each message with
// a key of its own as its body, and returns what waits for them and
// returns the answers by key.
func publishLoop(a *api, workers int, stop <-chan struct{}) func() map[string]answer {
	var mu sync.Mutex
	got := map[string]answer{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, i)
				ans, err := a.tryPost("orders.created", key, "Idempotency-Key", key)
				if err != nil {
					ans = answer{Error: "transport: " + err.Error()}
				}
				mu.Lock()
				got[key] = ans
				mu.Unlock()
			}
		})
	}
	var once sync.Once
	return func() map[string]answer {
		once.Do(wg.Wait)
		mu.Lock()
		defer mu.Unlock()
		return got
	}
}

// checkAnswers checks what publishLoop got: every 200 is stored at the
// sequence it named with its own body; everything else is a 503 with
// Retry-After, which, retried with the same key, is stored; and the stream
// holds each key exactly once.
func checkAnswers(t *testing.T, a *api, js jetstream.JetStream, answers map[string]answer) {
	t.Helper()
	var retried int
	for key, ans := range answers {
		switch {
		case ans.status == 200:
			m := stored(t, js, "ORDERS", ans.Seq)
			if string(m.Data) != key || m.Header.Get(nats.MsgIdHdr) != key {
				t.Errorf("%s answered 200 seq %d, which holds %q (id %q)", key, ans.Seq, m.Data, m.Header.Get(nats.MsgIdHdr))
			}
		case ans.status == 503 && ans.retryAfter != "":
			retried++
			var again answer
			poll.Until(t, 30*time.Second, "a retried publish stored", func() bool {
				again = a.post("orders.created", key, "Idempotency-Key", key)
				return again.status == 200
			})
			if m := stored(t, js, "ORDERS", again.Seq); string(m.Data) != key {
				t.Errorf("%s retried: seq %d holds %q", key, again.Seq, m.Data)
			}
		default:
			t.Errorf("%s: answered %d (Retry-After %q): %s", key, ans.status, ans.retryAfter, ans.Error)
		}
	}
	seen := storedOnce(t, js, "ORDERS")
	if len(seen) != len(answers) {
		t.Errorf("%d keys stored, %d published", len(seen), len(answers))
	}
	t.Logf("%d publishes, %d answered 503 and retried", len(answers), retried)
}

// TestPlainLiteral: the fast check of a subject accepts only subjects that
// subject.CheckLiteral accepts too, and leaves to it what it cannot decide
// (UTF-8 tokens), so that the answer to any subject is CheckLiteral's.
func TestPlainLiteral(t *testing.T) {
	tests := []struct {
		subject string
		plain   bool
	}{
		{"orders.created", true},
		{"a", true},
		{"orders-eu_1.x~y!z", true},
		{"orders/created.a:b", true},
		{"", false},
		{".orders", false},
		{"orders.", false},
		{"orders..created", false},
		{"orders.*", false},
		{"orders.>", false},
		{"orders.a*b", false},
		{"orders.a>b", false},
		{"orders created", false},
		{"orders.\tx", false},
		{"orders.\x7f", false},
		{"orders.größe", false}, // valid, decided by CheckLiteral
		{"orders.\xff", false},
	}
	for _, tt := range tests {
		got := plainLiteral(tt.subject)
		if got != tt.plain {
			t.Errorf("plainLiteral(%q) = %v, want %v", tt.subject, got, tt.plain)
		}
		if got && subject.CheckLiteral(tt.subject) != nil {
			t.Errorf("plainLiteral(%q) accepts what CheckLiteral refuses: %v", tt.subject, subject.CheckLiteral(tt.subject))
		}
	}
}

// TestAppendAck: the success answer is written byte for byte as
// encoding/json's Encoder writes it, whatever the stream's name.
func TestAppendAck(t *testing.T) {
	for _, stream := range []string{"ORDERS", "orders-eu_1", `we"ird`, `back\slash`, "<&>", "größe", "tab\there", "\xff"} {
		for _, dup := range []bool{false, true} {
			ack := &jetstream.PubAck{Stream: stream, Sequence: 18446744073709551615}
			var want bytes.Buffer
			if err := json.NewEncoder(&want).Encode(struct {
				Stream    string `json:"stream"`
				Seq       uint64 `json:"seq"`
				Duplicate bool   `json:"duplicate"`
			}{ack.Stream, ack.Sequence, dup}); err != nil {
				t.Fatal(err)
			}
			if got := appendAck(nil, ack, dup); string(got) != want.String() {
				t.Errorf("stream %q: %s, want %s", stream, got, want.String())
			}
		}
	}
}

// TestPublishRoutes: a subject sent escaped, or holding a '/', is
// published to as it reads unescaped, as net/http's ServeMux would route
// it; a path the mux would clean is refused, neither redirected nor
// published.
func TestPublishRoutes(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{})
	tests := []struct {
		path    string // after PathPrefix, as sent
		status  int
		subject string // stored on, when 200
	}{
		{"orders.created", 200, "orders.created"},
		{"orders%2Ecreated", 200, "orders.created"},
		{"orders.a%2Fb", 200, "orders.a/b"},
		{"orders.a/b", 200, "orders.a/b"},
		{"orders.%C3%A9", 200, "orders.é"},
		{"..", http.StatusBadRequest, ""},
		{"orders.x/../y", http.StatusBadRequest, ""},
	}
	for _, tt := range tests {
		resp, err := noRedirect.Post(a.url+PathPrefix+tt.path, "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		var ans answer
		_ = json.NewDecoder(resp.Body).Decode(&ans)
		resp.Body.Close()
		if resp.StatusCode != tt.status {
			t.Errorf("%s: %d %q, want %d", tt.path, resp.StatusCode, ans.Error, tt.status)
			continue
		}
		if tt.status == 200 {
			if got := stored(t, js, "ORDERS", ans.Seq).Subject; got != tt.subject {
				t.Errorf("%s: stored on %q, want %q", tt.path, got, tt.subject)
			}
		}
	}
	if n := msgCount(t, js, "ORDERS"); n != 5 {
		t.Errorf("%d messages stored, want 5", n)
	}
}

// TestPublishRawHeaders: a single publish whose header NATS could not
// carry (a name that is not an HTTP token, a value with a CR) never
// reaches the publish: net/http refuses the request 400 first, so none is
// stored.
func TestPublishRawHeaders(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{})

	for _, line := range []string{"X Tenant: 7", "X\tTenant: 7", ": 7", "X(Tenant): 7", "X-Note: a\rb"} {
		c, err := net.Dial("tcp", a.srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST %sorders.raw HTTP/1.1\r\nHost: localhost\r\n%s\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx", PathPrefix, line)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%q: %d, want 400", line, resp.StatusCode)
		}
	}
	if n := msgCount(t, js, "ORDERS"); n != 0 {
		t.Errorf("%d messages stored", n)
	}
}

// TestPublishBodyLengths: a single publish whose length is not declared
// (sent chunked) is read whole and stored, and refused 413 once it grows
// past max_payload; one larger than what is set aside before it arrives
// (firstRead) is read whole too, declared or not.
func TestPublishBodyLengths(t *testing.T) {
	const limit = 4 << 20
	srv := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = limit }})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{})
	undeclared := func(body string) io.Reader { return io.MultiReader(strings.NewReader(body)) }
	send := func(body io.Reader) answer {
		t.Helper()
		resp, err := http.Post(a.url+PathPrefix+"orders.large", "application/octet-stream", body)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ans answer
		ans.status = resp.StatusCode
		if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
			t.Errorf("answer %d: not JSON: %v", resp.StatusCode, err)
		}
		return ans
	}

	large := strings.Repeat("x", firstRead+12345)
	for _, body := range []io.Reader{strings.NewReader("small"), undeclared("small"), strings.NewReader(large), undeclared(large)} {
		if ans := send(body); ans.status != http.StatusOK {
			t.Fatalf("answer %+v", ans)
		}
	}
	stream, err := js.Stream(context.Background(), "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetLastMsgForSubject(context.Background(), "orders.large")
	if err != nil || string(m.Data) != large {
		t.Fatalf("the large body chunked: %v, %d bytes stored, want %d", err, len(m.Data), len(large))
	}
	before := a.count(outcomeTooLarge)
	if ans := send(undeclared(strings.Repeat("y", limit+1))); ans.status != http.StatusRequestEntityTooLarge || !strings.Contains(ans.Error, "max_payload (4194304 bytes)") {
		t.Errorf("chunked past max_payload: %+v", ans)
	}
	if got := a.count(outcomeTooLarge); got != before+1 {
		t.Errorf("too large counted %v, want %v", got, before+1)
	}
	if n := msgCount(t, js, "ORDERS"); n != 4 {
		t.Errorf("%d messages stored, want 4", n)
	}
}

// TestIdleAndSilentConnectionsBounded: the API holds at most MaxConns
// connections (the one longest without a request makes room for a new
// one), closes a keep-alive connection left idle past IdleTimeout, and
// still serves a client that sends its request.
func TestIdleAndSilentConnectionsBounded(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{MaxConns: 4, IdleTimeout: 200 * time.Millisecond, ReadHeaderTimeout: time.Hour})
	addr := strings.TrimPrefix(a.url, "http://")

	publishOn := func(c net.Conn) {
		t.Helper()
		req := "POST " + PathPrefix + "orders.created HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\n\r\nx"
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("publish: %s", resp.Status)
		}
	}
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	closed := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	}

	var silent []net.Conn
	for range 10 {
		silent = append(silent, dial())
	}
	c := dial()
	publishOn(c)
	for i, s := range silent[:7] {
		if !closed(s) {
			t.Errorf("silent connection %d of 10 held past the bound of 4", i+1)
		}
	}
	if !closed(c) {
		t.Error("a keep-alive connection idle past IdleTimeout was not closed")
	}
}
