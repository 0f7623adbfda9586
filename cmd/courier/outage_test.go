package main

// End-to-end tests of app outages (README, "App outages"): an app that is
// not there costs no attempt and dead-letters nothing; a request that reached
// the app and then failed does spend its attempt.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/poll"
)

const outageDLQ = "dlq.ORDERS.courier"

// lateApp is an app at a fixed loopback address that can be absent, appear,
// vanish and come back, recording every request like the harness's app.
// Keep-alives are off, so each request has a connection of its own: the app
// vanishing between two requests is then never a connection dropped in the
// middle of one (which would rightly spend an attempt).
type lateApp struct {
	*app
	t    *testing.T
	addr string
	h    http.Handler // what answers: app's serve unless set before up

	mu    sync.Mutex
	ln    net.Listener
	srvs  []*http.Server
	serve sync.WaitGroup
}

// newLateApp reserves a free address for an app that is not listening yet.
func newLateApp(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, n int)) *lateApp {
	t.Helper()
	// Reserved on 127.0.0.2 where the system has it (Linux routes all of
	// 127/8 to loopback): everything else the tests start listens on
	// 127.0.0.1:0, and courier's admin server once took the port just
	// released, so that the "missing" app answered 404.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		t.Fatalf("reserve an address: %v", err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	l := &lateApp{app: &app{answer: answer, byKey: make(map[string]int)}, t: t, addr: addr}
	t.Cleanup(l.close)
	return l
}

func (l *lateApp) url() string { return "http://" + l.addr + "/orders" }

// up starts answering on the app's address.
func (l *lateApp) up() {
	l.t.Helper()
	var ln net.Listener
	poll.Until(l.t, 5*time.Second, "the app's address to be free", func() bool {
		var err error
		ln, err = net.Listen("tcp", l.addr)
		return err == nil
	})
	h := l.h
	if h == nil {
		h = http.HandlerFunc(l.app.serve)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	srv.SetKeepAlivesEnabled(false)
	l.mu.Lock()
	l.ln = ln
	l.srvs = append(l.srvs, srv)
	l.mu.Unlock()
	l.serve.Go(func() { _ = srv.Serve(ln) })
}

// down stops accepting connections: from now on every connection is
// refused. Requests already accepted still get their answer, so it may be
// called from a handler.
func (l *lateApp) down() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		_ = l.ln.Close()
		l.ln = nil
	}
}

func (l *lateApp) close() {
	l.down()
	l.mu.Lock()
	srvs := l.srvs
	l.mu.Unlock()
	for _, s := range srvs {
		_ = s.Close()
	}
	l.serve.Wait()
}

// logLines returns courier's JSON log records whose message starts with
// prefix.
func logLines(c *courier, prefix string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(c.logs.String()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			continue
		}
		if msg, _ := rec["msg"].(string); strings.HasPrefix(msg, prefix) {
			out = append(out, rec)
		}
	}
	return out
}

const (
	logAppGone = "app unavailable"
	logAppBack = "app available again"
)

// checkOutageLoggedOnce asserts one line when the app went away and one,
// with the outage's duration, when it came back: not one per message.
func checkOutageLoggedOnce(t *testing.T, c *courier) {
	t.Helper()
	if gone := logLines(c, logAppGone); len(gone) != 1 {
		t.Errorf("%d log lines %q, want exactly 1", len(gone), logAppGone)
	}
	back := logLines(c, logAppBack)
	if len(back) != 1 {
		t.Errorf("%d log lines %q, want exactly 1", len(back), logAppBack)
		return
	}
	if d, _ := back[0]["down_for"].(string); d == "" {
		t.Errorf("%q line without down_for: %v", logAppBack, back[0])
	}
}

// adminAddr is the address courier's admin server bound, from its start-up
// log line.
func adminAddr(t *testing.T, c *courier) string {
	t.Helper()
	var addr string
	poll.Until(t, 10*time.Second, "courier's start-up log line", func() bool {
		if recs := logLines(c, "courier starting"); len(recs) > 0 {
			addr, _ = recs[0]["admin"].(string)
		}
		return addr != ""
	})
	return addr
}

// get fetches an admin endpoint: status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// attempts lists the Courier-Attempt of every request the app saw for key,
// in order.
func attempts(reqs []request, key string) []string {
	var out []string
	for _, r := range reqs {
		if r.Header.Get("Idempotency-Key") == key {
			out = append(out, r.Header.Get("Courier-Attempt"))
		}
	}
	return out
}

// checkEachOnceFirstAttempt asserts the app saw exactly the bodies in want,
// each once, each with Courier-Attempt: 1.
func checkEachOnceFirstAttempt(t *testing.T, reqs []request, want []string) {
	t.Helper()
	seen := make(map[string]int)
	for _, r := range reqs {
		seen[r.Body]++
		if got := r.Header.Get("Courier-Attempt"); got != "1" {
			t.Errorf("%q arrived with Courier-Attempt %s, want 1: the outage spent an attempt", r.Body, got)
		}
	}
	for _, b := range want {
		if seen[b] != 1 {
			t.Errorf("%q reached the app %d times, want 1", b, seen[b])
		}
	}
	if len(reqs) != len(want) {
		t.Errorf("app saw %d requests, want %d", len(reqs), len(want))
	}
}

func publishN(h *harness, prefix string, n int) []string {
	h.t.Helper()
	var bodies []string
	for i := range n {
		b := fmt.Sprintf("%s-%02d", prefix, i)
		h.publish("orders.created", b, nil)
		bodies = append(bodies, b)
	}
	return bodies
}

// The app starts seconds after courier, with messages already waiting: all
// are delivered on their first attempt, though the ack wait passed several
// times meanwhile, and the outage is logged once, not once per message.
func TestOutageAppStartsAfterCourier(t *testing.T) {
	h := newHarness(t)
	l := newLateApp(t, nil)
	bodies := publishN(h, "early", 20)
	c := start(t, h.env(l.url(), "COURIER_ACK_WAIT=1s", "COURIER_MAX_DELIVER=2"))
	admin := adminAddr(t, c)

	poll.Until(t, 10*time.Second, "courier to find the app missing", func() bool { return len(logLines(c, logAppGone)) > 0 })
	if code, body := get(t, "http://"+admin+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "app unavailable") {
		t.Errorf("/readyz during the outage = %d %q, want 503 naming the app", code, body)
	}
	// The scenario: the app takes seconds to start, longer than AckWait x
	// MaxDeliver, so only courier's in-progress signals keep the messages.
	time.Sleep(2500 * time.Millisecond)
	l.up()

	poll.Until(t, 15*time.Second, "every message delivered and acked", func() bool {
		return l.count() == len(bodies) && h.settled("courier")
	})
	checkEachOnceFirstAttempt(t, l.requests(), bodies)
	if dls := h.deadLetters(outageDLQ); len(dls) != 0 {
		t.Errorf("%d dead letters, want none", len(dls))
	}
	checkOutageLoggedOnce(t, c)
	poll.Until(t, 15*time.Second, "/readyz to pass", func() bool {
		code, _ := get(t, "http://"+admin+"/readyz")
		return code == http.StatusOK
	})
}

// The app vanishes mid-stream for longer than AckWait x MaxDeliver and comes
// back: nothing is dead-lettered, every message is delivered, and no attempt
// was spent by the outage.
func TestOutageLongerThanAckWaitTimesMaxDeliver(t *testing.T) {
	h := newHarness(t)
	const vanishAfter = 4
	var served atomic.Int32
	wentDown := make(chan struct{})
	var l *lateApp
	l = newLateApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if served.Add(1) == vanishAfter {
			// Gone for new connections; this request still gets its answer.
			l.down()
			close(wentDown)
		}
		w.WriteHeader(http.StatusOK)
	})
	l.up()
	bodies := publishN(h, "stream", 12)
	// One request at a time, so the app vanishes between two requests, never
	// during one.
	c := start(t, h.env(l.url(), "COURIER_ACK_WAIT=1s", "COURIER_MAX_DELIVER=2", "COURIER_MAX_INFLIGHT=1"))
	admin := adminAddr(t, c)

	select {
	case <-wentDown:
	case <-time.After(15 * time.Second):
		t.Fatal("the app never served its requests")
	}
	poll.Until(t, 10*time.Second, "courier to notice the app is gone", func() bool { return len(logLines(c, logAppGone)) == 1 })
	outageStart := time.Now()
	poll.Until(t, 15*time.Second, "courier to hold what it fetched", func() bool {
		info := h.consumerInfo("courier")
		return info != nil && info.NumAckPending > 0 && metricstest.Value(t, metrics(admin), "courier_held_messages") == float64(info.NumAckPending)
	})
	if code, body := get(t, "http://"+admin+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "app unavailable") {
		t.Errorf("/readyz during the outage = %d %q, want 503 naming the app", code, body)
	}
	if code, _ := get(t, "http://"+admin+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz during the outage = %d, want 200: an app outage must not restart courier", code)
	}
	if v := metricstest.Value(t, metrics(admin), "courier_app_available"); v != 0 {
		t.Errorf("courier_app_available = %v during the outage, want 0", v)
	}

	// The scenario: an outage longer than AckWait x MaxDeliver (2s).
	time.Sleep(3500*time.Millisecond - time.Since(outageStart))
	l.up()

	poll.Until(t, 20*time.Second, "every message delivered and acked", func() bool {
		return l.count() == len(bodies) && h.settled("courier")
	})
	checkEachOnceFirstAttempt(t, l.requests(), bodies)
	if dls := h.deadLetters(outageDLQ); len(dls) != 0 {
		t.Errorf("%d dead letters, want none: an outage is not the message's fault", len(dls))
	}
	checkOutageLoggedOnce(t, c)
	if v := metricstest.Value(t, metrics(admin), "courier_app_available"); v != 1 {
		t.Errorf("courier_app_available = %v after the outage, want 1", v)
	}
	if v := metricstest.Value(t, metrics(admin), "courier_held_messages"); v != 0 {
		t.Errorf("courier_held_messages = %v after the outage, want 0", v)
	}
	if v := metricstest.Value(t, metrics(admin), "courier_delivery_held_seconds_total", "cause", "app_unavailable"); v < 3 {
		t.Errorf(`courier_delivery_held_seconds_total{cause="app_unavailable"} = %v, want at least the 3.5s outage`, v)
	}
}

// healthApp is a health URL whose answer the test sets.
type healthApp struct {
	*httptest.Server
	status atomic.Int32
	probes atomic.Int32
}

func newHealthApp(t *testing.T, status int) *healthApp {
	t.Helper()
	ha := &healthApp{}
	ha.status.Store(int32(status))
	ha.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ha.probes.Add(1)
		w.WriteHeader(int(ha.status.Load()))
	}))
	t.Cleanup(ha.Close)
	return ha
}

// A health URL answering 503 pauses fetching, at start-up and later: nothing
// reaches the app, /readyz fails naming the app while /healthz passes, and
// messages flow once it answers 200.
func TestOutageHealthURL503PausesFetching(t *testing.T) {
	h := newHarness(t)
	health := newHealthApp(t, http.StatusServiceUnavailable)
	a := newApp(t, nil)
	first := publishN(h, "before", 5)
	c := start(t, h.env(a.URL, "COURIER_APP_HEALTH_URL="+health.URL+"/health"))
	admin := adminAddr(t, c)

	// Start-up: the consumer is bound, the health URL polled several times,
	// and nothing fetched.
	poll.Until(t, 10*time.Second, "the health URL to be probed and fail a few times", func() bool {
		return h.consumerInfo("courier") != nil && health.probes.Load() >= 4
	})
	code, body := get(t, "http://"+admin+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "app unavailable") {
		t.Errorf("/readyz while the health URL fails = %d %q, want 503 naming the app", code, body)
	}
	if code, _ := get(t, "http://"+admin+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while the health URL fails = %d, want 200", code)
	}
	if v := metricstest.Value(t, metrics(admin), "courier_app_available"); v != 0 {
		t.Errorf("courier_app_available = %v, want 0", v)
	}
	if n := a.count(); n != 0 {
		t.Fatalf("the app got %d requests while its health URL answered 503", n)
	}
	if info := h.consumerInfo("courier"); info.Delivered.Consumer != 0 || info.NumPending != uint64(len(first)) {
		t.Errorf("courier fetched while the health URL failed: delivered %d, pending %d",
			info.Delivered.Consumer, info.NumPending)
	}

	health.status.Store(http.StatusOK)
	poll.Until(t, 15*time.Second, "messages to flow once the health URL answers 200", func() bool {
		return a.count() == len(first) && h.settled("courier")
	})
	checkEachOnceFirstAttempt(t, a.requests(), first)
	poll.Until(t, 15*time.Second, "/readyz to pass", func() bool {
		code, _ := get(t, "http://"+admin+"/readyz")
		return code == http.StatusOK
	})

	// Later: the health URL fails again (noticed within the default 5s
	// health interval) and fetching pauses again.
	health.status.Store(http.StatusServiceUnavailable)
	poll.Until(t, 15*time.Second, "/readyz to fail once the health URL does", func() bool {
		code, _ := get(t, "http://"+admin+"/readyz")
		return code == http.StatusServiceUnavailable
	})
	probed := health.probes.Load()
	later := publishN(h, "during", 3)
	poll.Until(t, 10*time.Second, "a few more failed probes", func() bool { return health.probes.Load() >= probed+3 })
	if n := a.count(); n != len(first) {
		t.Errorf("the app got %d new requests while its health URL answered 503", n-len(first))
	}
	// The pull open when the app went away may still bring messages: they
	// are held (in progress), not sent; nothing more is pulled.
	if info := h.consumerInfo("courier"); info.NumPending+uint64(info.NumAckPending) != uint64(len(later)) ||
		float64(info.NumAckPending) != metricstest.Value(t, metrics(admin), "courier_held_messages") {
		t.Errorf("while the health URL failed: pending %d, ack pending %d, held %v; want every new message pending or held",
			info.NumPending, info.NumAckPending, metricstest.Value(t, metrics(admin), "courier_held_messages"))
	}
	health.status.Store(http.StatusOK)
	poll.Until(t, 15*time.Second, "messages to flow again", func() bool {
		return a.count() == len(first)+len(later) && h.settled("courier")
	})
	checkEachOnceFirstAttempt(t, a.requests(), append(first, later...))
	if dls := h.deadLetters(outageDLQ); len(dls) != 0 {
		t.Errorf("%d dead letters, want none", len(dls))
	}
}

// A timeout after the request was sent is not an outage: the app may have
// acted, so the attempt is spent and the retry says so.
func TestOutageTimeoutAfterSendSpendsAttempt(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	h.publish("orders.created", "slow", map[string]string{"Idempotency-Key": "slow-1"})
	c := start(t, h.env(a.URL, "COURIER_HTTP_TIMEOUT=300ms"))
	poll.Until(t, 10*time.Second, "the retry to succeed", func() bool { return a.count() == 2 && h.settled("courier") })
	if got := attempts(a.requests(), "slow-1"); !slices.Equal(got, []string{"1", "2"}) {
		t.Errorf("attempts %v, want [1 2]: a timeout after sending spends the attempt", got)
	}
	if dls := h.deadLetters(outageDLQ); len(dls) != 0 {
		t.Errorf("%d dead letters, want none", len(dls))
	}
	if n := len(logLines(c, logAppGone)); n != 0 {
		t.Errorf("a timeout was taken for an outage (%d %q lines)", n, logAppGone)
	}
}

// A connection the app drops after reading the request is not an outage
// either: the attempt is spent, and no attempt reaches the app twice.
func TestOutageDroppedConnectionSpendsAttempt(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			// The harness's app has read the whole request by now.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	h.publish("orders.created", "crashy", map[string]string{"Idempotency-Key": "crashy-1"})
	c := start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "the retry to succeed", func() bool { return a.count() == 2 && h.settled("courier") })
	if got := attempts(a.requests(), "crashy-1"); !slices.Equal(got, []string{"1", "2"}) {
		t.Errorf("attempts %v, want [1 2]: a dropped connection spends the attempt, and one attempt is one request", got)
	}
	if dls := h.deadLetters(outageDLQ); len(dls) != 0 {
		t.Errorf("%d dead letters, want none", len(dls))
	}
	if n := len(logLines(c, logAppGone)); n != 0 {
		t.Errorf("a dropped connection was taken for an outage (%d %q lines)", n, logAppGone)
	}
}

// SIGTERM during an outage exits promptly and loses nothing: held messages
// are NAK'd (one delivery spent each) and go to the next courier; one already
// on its last allowed delivery is dead-lettered as app-unavailable instead of
// vanishing.
func TestOutageSigtermExitsPromptlyLosesNothing(t *testing.T) {
	h := newHarness(t)
	l := newLateApp(t, nil) // not listening until the last courier
	// A long ack wait: a message courier failed to give back would not come
	// back within these tests' waits.
	env := h.env(l.url(), "COURIER_MAX_DELIVER=2", "COURIER_ACK_WAIT=30s", "COURIER_SHUTDOWN_GRACE=20s")

	// runOutage starts a courier, waits until it holds want messages with
	// the app unavailable, and stops it.
	runOutage := func(phase string, want int) {
		t.Helper()
		c := start(t, env)
		poll.Until(t, 10*time.Second, phase+": courier holding every message during the outage", func() bool {
			info := h.consumerInfo("courier")
			return len(logLines(c, logAppGone)) == 1 && info != nil &&
				info.NumPending == 0 && info.NumAckPending == want
		})
		began := time.Now()
		err := c.stop()
		if took := time.Since(began); took > 5*time.Second {
			t.Errorf("%s: stopping took %s, want well within the 20s grace", phase, took.Round(time.Millisecond))
		}
		if err != nil {
			t.Fatalf("%s: run returned %v, want nil", phase, err)
		}
	}

	// 1: "last" is held on its first delivery, NAK'd at shutdown.
	last := h.publish("orders.created", "last", map[string]string{"Idempotency-Key": "last"})
	runOutage("first courier", 1)
	if dls := h.deadLetters(outageDLQ); len(dls) != 0 {
		t.Fatalf("%d dead letters after the first courier, want none", len(dls))
	}

	// 2: "last" comes back at once (NAK'd, not left to the 30s ack wait) on
	// its last allowed delivery, "other" on its first.
	h.publish("orders.created", "other", map[string]string{"Idempotency-Key": "other"})
	runOutage("second courier", 2)
	dls := h.deadLetters(outageDLQ)
	if len(dls) != 1 {
		t.Fatalf("%d dead letters after the second courier, want 1", len(dls))
	}
	dl := dls[0]
	if got := dl.Header.Get(dlq.HeaderReason); got != dlq.ReasonAppUnavailable {
		t.Errorf("dead letter reason %q, want %q", got, dlq.ReasonAppUnavailable)
	}
	if got := dl.Header.Get(dlq.HeaderSequence); got != strconv.FormatUint(last, 10) {
		t.Errorf("dead letter of sequence %s, want %d", got, last)
	}
	if got := dl.Header.Get(dlq.HeaderAttempts); got != "2" {
		t.Errorf("dead letter attempts %s, want 2", got)
	}
	if string(dl.Data) != "last" {
		t.Errorf("dead letter body %q, want %q", dl.Data, "last")
	}

	// 3: the app is back; "other" arrives on its second delivery (the
	// shutdown spent one), "last" never reaches the app again.
	l.up()
	start(t, env)
	poll.Until(t, 10*time.Second, "the remaining message delivered", func() bool { return l.count() == 1 && h.settled("courier") })
	if got := attempts(l.requests(), "other"); !slices.Equal(got, []string{"2"}) {
		t.Errorf("attempts of the held message %v, want [2]", got)
	}
	if n := l.calls("last"); n != 0 {
		t.Errorf("the dead-lettered message reached the app %d times", n)
	}
	if n := len(h.deadLetters(outageDLQ)); n != 1 {
		t.Errorf("%d dead letters at the end, want 1", n)
	}
}
