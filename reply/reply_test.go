package reply

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/poll"
)

func TestReplyIsTheAppsAnswer(t *testing.T) {
	h := newHarness(t, 0)
	var got struct {
		method string
		header http.Header
		body   []byte
	}
	var mu sync.Mutex
	a := app(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got.method, got.header, got.body = r.Method, r.Header.Clone(), b
		mu.Unlock()
		w.Header().Set("X-Answer", "yes")
		w.Header().Set("Content-Type", "text/plain")
		// The app cannot pose as micro or courier on the reply.
		w.Header().Set("Nats-Service-Error-Code", "418")
		w.Header().Set(HeaderStatus, "999")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("made"))
	})
	svc := h.start(a.URL+"/rpc", nil)

	m := h.request(nats.Header{
		"X-Custom":        {"a", "b"},
		"content-type":    {"application/json"},
		"Idempotency-Key": {"k1"},
		"Nats-Msg-Id":     {"not-for-the-app"},
		"X-Bad":           {"a\x01b"},
		"Courier-Stream":  {"forged"},
	}, []byte(`{"id":1}`))

	if string(m.Data) != "made" {
		t.Errorf("reply body = %q, want the app's", m.Data)
	}
	checkReply(t, m, "201", "")
	if m.Header.Get("X-Answer") != "yes" || m.Header.Get("Content-Type") != "text/plain" {
		t.Errorf("reply headers = %v, want the app's", m.Header)
	}
	if _, ok := m.Header["Content-Length"]; ok {
		t.Errorf("reply carries HTTP's Content-Length: %v", m.Header)
	}

	mu.Lock()
	defer mu.Unlock()
	if got.method != http.MethodPost || string(got.body) != `{"id":1}` {
		t.Errorf("app got %s %q, want POST of the request data", got.method, got.body)
	}
	for name, want := range map[string]string{
		"X-Custom":        "a,b",
		"Content-Type":    "application/json",
		"Idempotency-Key": "k1",
		"Courier-Subject": subject,
		"Nats-Msg-Id":     "",
		"X-Bad":           "",
		"Courier-Stream":  "",
	} {
		if v := strings.Join(got.header.Values(name), ","); v != want {
			t.Errorf("app got %s = %q, want %q", name, v, want)
		}
	}
	if n := metricstest.Value(t, svc.reg, "courier_reply_dropped_headers_total"); n != 2 {
		t.Errorf("dropped headers = %v, want 2 (X-Bad, Courier-Stream)", n)
	}
	waitCount(t, svc.reg, 1, "courier_reply_requests_total", "outcome", "2xx")
	waitCount(t, svc.reg, 1, "courier_reply_request_duration_seconds", "outcome", "2xx")
	if logs := svc.logs.String(); strings.Contains(logs, "request answered") || !strings.Contains(logs, `"component":"reply"`) {
		t.Errorf("a successful request is logged at info, or logs lack component=reply:\n%s", logs)
	}
}

func TestNon2xxIsAnErrorReplyWithTheAppsBody(t *testing.T) {
	for _, tc := range []struct {
		status  int
		outcome string
	}{
		{http.StatusNotFound, "4xx"},
		{http.StatusConflict, "4xx"},
		{http.StatusInternalServerError, "5xx"},
		{http.StatusServiceUnavailable, "5xx"},
		{http.StatusFound, "3xx"}, // not followed: the app's answer
	} {
		t.Run(http.StatusText(tc.status), func(t *testing.T) {
			h := newHarness(t, 0)
			a := app(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "/elsewhere")
				w.Header().Set("X-Why", "because")
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte("details"))
			})
			svc := h.start(a.URL, nil)
			m := h.request(nil, []byte("q"))
			code := itoa(tc.status)
			checkReply(t, m, code, code)
			if got := m.Header.Get("Nats-Service-Error"); got != http.StatusText(tc.status) {
				t.Errorf("Nats-Service-Error = %q, want the status text", got)
			}
			if string(m.Data) != "details" || m.Header.Get("X-Why") != "because" {
				t.Errorf("reply = %q %v, want the app's body and headers", m.Data, m.Header)
			}
			waitCount(t, svc.reg, 1, "courier_reply_requests_total", "outcome", tc.outcome)
		})
	}
}

func TestRequestTheAppRefusesAsTooLargeIsItsStatus(t *testing.T) {
	h := newHarness(t, 0)
	a := app(t, func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1000)); err != nil {
			http.Error(w, "too big for me", http.StatusRequestEntityTooLarge)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	h.start(a.URL, nil)
	m := h.request(nil, bytes.Repeat([]byte("x"), 5000))
	checkReply(t, m, "413", "413")
	if !strings.Contains(string(m.Data), "too big for me") {
		t.Errorf("reply body = %q, want the app's", m.Data)
	}
}

func TestTimeoutIs504(t *testing.T) {
	h := newHarness(t, 0)
	a := app(t, hang)
	svc := h.start(a.URL, func(o *Options) { o.Timeout = 100 * time.Millisecond })
	m := h.request(nil, []byte("q"))
	checkReply(t, m, "", "504")
	waitCount(t, svc.reg, 1, "courier_reply_requests_total", "outcome", "timeout")
}

func TestAppDownIs503(t *testing.T) {
	h := newHarness(t, 0)
	svc := h.start(deadURL(t), nil)
	for range 2 {
		m := h.request(nil, []byte("q"))
		checkReply(t, m, "", "503")
	}
	waitCount(t, svc.reg, 2, "courier_reply_requests_total", "outcome", "unavailable")
	if n := strings.Count(svc.logs.String(), `"msg":"app unreachable`); n != 1 {
		t.Errorf("app unreachable logged %d times, want once per outage:\n%s", n, svc.logs.String())
	}
}

func TestAnswerLargerThanMaxPayloadIsAnErrorReply(t *testing.T) {
	const maxPayload = 8 << 10
	for _, tc := range []struct {
		name  string
		write func(w http.ResponseWriter)
	}{
		{"with Content-Length", func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", itoa(2*maxPayload))
			_, _ = w.Write(bytes.Repeat([]byte("x"), 2*maxPayload))
		}},
		{"chunked", func(w http.ResponseWriter) {
			for range 4 {
				_, _ = w.Write(bytes.Repeat([]byte("x"), maxPayload/2))
				w.(http.Flusher).Flush()
			}
		}},
		{"body fits, headers do not", func(w http.ResponseWriter) {
			w.Header().Set("X-Big", strings.Repeat("h", 1000))
			_, _ = w.Write(bytes.Repeat([]byte("x"), maxPayload-100))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, maxPayload)
			a := app(t, func(w http.ResponseWriter, r *http.Request) { tc.write(w) })
			svc := h.start(a.URL, nil)
			m := h.request(nil, []byte("q"))
			checkReply(t, m, "200", "502")
			if !strings.Contains(m.Header.Get("Nats-Service-Error"), "too large") {
				t.Errorf("Nats-Service-Error = %q, want it to say the answer was too large", m.Header.Get("Nats-Service-Error"))
			}
			waitCount(t, svc.reg, 1, "courier_reply_requests_total", "outcome", "too_large")
			if n := metricstest.Value(t, svc.reg, "courier_reply_requests_total", "outcome", "2xx"); n != 0 {
				t.Errorf("2xx requests = %v, want 0", n)
			}
		})
	}
}

func TestQueueGroupSharesTheRequests(t *testing.T) {
	h := newHarness(t, 0)
	var hits [2]atomic.Int64
	for i := range hits {
		a := app(t, func(w http.ResponseWriter, r *http.Request) {
			hits[i].Add(1)
			_, _ = w.Write([]byte("ok"))
		})
		h.start(a.URL, nil)
	}
	const n = 60
	for range n {
		if m := h.request(nil, []byte("q")); string(m.Data) != "ok" {
			t.Fatalf("reply = %q", m.Data)
		}
	}
	a, b := hits[0].Load(), hits[1].Load()
	if a+b != n || a == 0 || b == 0 {
		t.Errorf("apps called %d and %d times for %d requests, want each request once, shared", a, b, n)
	}
}

func TestConcurrencyIsBounded(t *testing.T) {
	h := newHarness(t, 0)
	var now, peak atomic.Int64
	release := make(chan struct{})
	a := app(t, func(w http.ResponseWriter, r *http.Request) {
		c := now.Add(1)
		for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
		}
		<-release
		now.Add(-1)
	})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(letGo) // before the app closes, should the test fail early
	svc := h.start(a.URL, func(o *Options) { o.MaxConcurrent = 2 })
	const n = 5
	errs := make(chan error, n)
	for range n {
		go func() {
			m, err := h.tryRequest(nil, []byte("q"))
			if err == nil && m.Header.Get(HeaderStatus) != "200" {
				err = errors.New("status " + m.Header.Get(HeaderStatus))
			}
			errs <- err
		}()
	}
	poll.Until(t, 15*time.Second, "two requests at the app", func() bool { return now.Load() == 2 })
	if g := metricstest.Value(t, svc.reg, "courier_reply_inflight_requests"); g != 2 {
		t.Errorf("in-flight gauge = %v, want 2", g)
	}
	letGo()
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if p := peak.Load(); p != 2 {
		t.Errorf("peak concurrency at the app = %d, want 2", p)
	}
}

// TestRequestsBeyondWaitingAreBusy fills the one slot and the two places to
// wait: the next request is answered 503 busy at once (not left to time
// out), and the waiting ones reach the app in the order they came once the
// slot is free.
func TestRequestsBeyondWaitingAreBusy(t *testing.T) {
	h := newHarness(t, 0)
	var mu sync.Mutex
	var order []string
	release := make(chan struct{})
	a := app(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		order = append(order, string(b))
		mu.Unlock()
		<-release
	})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(letGo)
	svc := h.start(a.URL, func(o *Options) { o.MaxConcurrent = 1; o.MaxWaiting = 2 })

	replies := make(chan *nats.Msg, 3)
	send := func(body string) {
		go func() {
			m, err := h.tryRequest(nil, []byte(body))
			if err != nil {
				t.Errorf("request %s: %v", body, err)
			}
			replies <- m
		}()
	}
	send("0")
	waitCount(t, svc.reg, 1, "courier_reply_inflight_requests")
	send("1")
	waitCount(t, svc.reg, 1, "courier_reply_waiting_requests")
	send("2")
	waitCount(t, svc.reg, 2, "courier_reply_waiting_requests")

	m := h.request(nil, []byte("3"))
	checkReply(t, m, "", "503")
	if d := m.Header.Get("Nats-Service-Error"); !strings.Contains(d, "busy") {
		t.Errorf("Nats-Service-Error = %q, want it to say courier is busy", d)
	}
	waitCount(t, svc.reg, 1, "courier_reply_requests_total", "outcome", "busy")
	if n := strings.Count(svc.logs.String(), "answering 503 busy"); n != 1 {
		t.Errorf("busy logged %d times, want once:\n%s", n, svc.logs.String())
	}

	letGo()
	for range 3 {
		if m := <-replies; m != nil {
			checkReply(t, m, "200", "")
		}
	}
	mu.Lock()
	got := strings.Join(order, ",")
	mu.Unlock()
	if got != "0,1,2" {
		t.Errorf("requests reached the app in the order %s, want 0,1,2 (3 refused)", got)
	}
	if g := metricstest.Value(t, svc.reg, "courier_reply_waiting_requests"); g != 0 {
		t.Errorf("waiting gauge = %v after every request ended, want 0", g)
	}
	// Room again: the next request waits for nothing and is answered.
	checkReply(t, h.request(nil, []byte("4")), "200", "")
	if !strings.Contains(svc.logs.String(), "within capacity again") {
		t.Errorf("no line saying requests fit again:\n%s", svc.logs.String())
	}
}

func TestMicroControlSubjectsSeeTheService(t *testing.T) {
	h := newHarness(t, 0)
	a := app(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotFound) })
	h.start(a.URL, nil)
	h.request(nil, []byte("q"))

	control := func(verb micro.Verb, v any) {
		t.Helper()
		subj, err := micro.ControlSubject(verb, "courier", "")
		if err != nil {
			t.Fatal(err)
		}
		m, err := h.caller.Request(subj, nil, 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", subj, err)
		}
		if err := json.Unmarshal(m.Data, v); err != nil {
			t.Fatalf("%s: %v", subj, err)
		}
	}
	var ping micro.Ping
	control(micro.PingVerb, &ping)
	if ping.Name != "courier" || ping.Version != "1.2.3" || ping.ID == "" {
		t.Errorf("PING = %+v", ping)
	}
	var info micro.Info
	control(micro.InfoVerb, &info)
	if len(info.Endpoints) != 1 || info.Endpoints[0].Subject != subject ||
		info.Endpoints[0].QueueGroup != "orders-consumer" || info.Endpoints[0].Name != "orders_get" {
		t.Errorf("INFO endpoints = %+v", info.Endpoints)
	}
	// micro counts a request when its handler returns, which can be just
	// after the reply: poll.
	poll.Until(t, 15*time.Second, "STATS counting the request", func() bool {
		var st micro.Stats
		control(micro.StatsVerb, &st)
		if len(st.Endpoints) != 1 || st.Endpoints[0].NumRequests != 1 {
			return false
		}
		var data EndpointStats
		if err := json.Unmarshal(st.Endpoints[0].Data, &data); err != nil {
			t.Fatalf("STATS data %s: %v", st.Endpoints[0].Data, err)
		}
		return data.Answered == 1 && data.Errors == 1 && strings.HasPrefix(data.LastError, "404:")
	})
}

func TestStopDrainsInFlightRequests(t *testing.T) {
	h := newHarness(t, 0)
	arrived := make(chan struct{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	var first atomic.Bool
	a := app(t, func(w http.ResponseWriter, r *http.Request) {
		if !first.CompareAndSwap(false, true) {
			// A probe below that came before the unsubscribe.
			_, _ = w.Write([]byte("probe"))
			return
		}
		close(arrived)
		<-release
		_, _ = w.Write([]byte("late"))
	})
	t.Cleanup(letGo) // before the app closes, should the test fail early
	svc := h.start(a.URL, nil)
	replies := make(chan *nats.Msg, 1)
	go func() {
		m, err := h.tryRequest(nil, []byte("q"))
		if err != nil {
			t.Errorf("in-flight request: %v", err)
		}
		replies <- m
	}()
	<-arrived
	stopped := make(chan struct{})
	go func() { svc.Stop(); close(stopped) }()

	// Unsubscribed: nothing answers new requests any more.
	poll.Until(t, 15*time.Second, "no responders", func() bool {
		_, err := h.tryRequest(nil, []byte("q"))
		return errors.Is(err, nats.ErrNoResponders)
	})
	if err := svc.Ready(); err == nil {
		t.Error("Ready after Stop began = nil")
	}
	select {
	case <-stopped:
		t.Fatal("Stop returned with a request in flight")
	default:
	}
	letGo()
	if m := <-replies; m == nil || string(m.Data) != "late" {
		t.Errorf("in-flight request's reply = %v, want the app's answer", m)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not return after the last request")
	}
	svc.Stop() // idempotent
}

// TestStopAnswersWaitingRequests: a request waiting for a slot when Stop
// begins is answered 503 at once (its caller can go to another member of
// the queue group), while the one at the app is let finish.
func TestStopAnswersWaitingRequests(t *testing.T) {
	h := newHarness(t, 0)
	release := make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	a := app(t, func(w http.ResponseWriter, r *http.Request) { <-release })
	t.Cleanup(letGo)
	svc := h.start(a.URL, func(o *Options) { o.MaxConcurrent = 1 })
	replies := make(chan *nats.Msg, 2)
	send := func() {
		go func() {
			m, err := h.tryRequest(nil, []byte("q"))
			if err != nil {
				t.Errorf("request: %v", err)
			}
			replies <- m
		}()
	}
	send()
	waitCount(t, svc.reg, 1, "courier_reply_inflight_requests")
	send()
	waitCount(t, svc.reg, 1, "courier_reply_waiting_requests")
	stopped := make(chan struct{})
	go func() { svc.Stop(); close(stopped) }()
	if m := <-replies; m != nil {
		checkReply(t, m, "", "503")
	}
	waitCount(t, svc.reg, 1, "courier_reply_requests_total", "outcome", "stopping")
	letGo()
	if m := <-replies; m != nil {
		checkReply(t, m, "200", "")
	}
	<-stopped
}

func TestStopCancelsWhatOutlastsTheGrace(t *testing.T) {
	h := newHarness(t, 0)
	arrived := make(chan struct{}, 1)
	a := app(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		hang(w, r)
	})
	svc := h.start(a.URL, func(o *Options) { o.ShutdownGrace = 50 * time.Millisecond })
	replies := make(chan *nats.Msg, 1)
	go func() {
		m, err := h.tryRequest(nil, []byte("q"))
		if err != nil {
			t.Errorf("request: %v", err)
		}
		replies <- m
	}()
	<-arrived
	svc.Stop()
	m := <-replies
	if m == nil {
		t.Fatal("no reply")
	}
	checkReply(t, m, "", "503")
	if n := metricstest.Value(t, svc.reg, "courier_reply_requests_total", "outcome", "stopping"); n != 1 {
		t.Errorf("stopping requests = %v, want 1", n)
	}
}

func TestReadyAndStartAfterStop(t *testing.T) {
	h := newHarness(t, 0)
	nc, _ := connect(t, h)
	svc, err := New(nc, Options{Subjects: []string{subject}, URL: deadURL(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Ready(); err == nil {
		t.Error("Ready before Start = nil")
	}
	if err := svc.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := svc.Ready(); err != nil {
		t.Errorf("Ready after Start = %v", err)
	}
	if err := svc.Start(t.Context()); err == nil {
		t.Error("second Start = nil")
	}
	nc.Close() // micro stops a service whose connection closes
	poll.Until(t, 15*time.Second, "not ready once the connection closed", func() bool { return svc.Ready() != nil })
	svc.Stop()
}

func TestMessageWithoutReplySubjectIsIgnored(t *testing.T) {
	h := newHarness(t, 0)
	var hits atomic.Int64
	a := app(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	svc := h.start(a.URL, nil)
	if err := h.caller.Publish(subject, []byte("fire and forget")); err != nil {
		t.Fatal(err)
	}
	h.request(nil, []byte("q")) // after the publish, on the same subscription
	if n := hits.Load(); n != 1 {
		t.Errorf("app called %d times, want once (the request only)", n)
	}
	if n := metricstest.Value(t, svc.reg, "courier_reply_requests_total", "outcome", "no_reply"); n != 1 {
		t.Errorf("no_reply = %v, want 1", n)
	}
}

func TestOptionsChecked(t *testing.T) {
	h := newHarness(t, 0)
	nc, _ := connect(t, h)
	for _, o := range []Options{
		{URL: "http://x"},
		{Subjects: []string{"a"}},
		{Subjects: []string{"a.>.b"}, URL: "http://x"},
		{Subjects: []string{"a b"}, URL: "http://x"},
		{Subjects: []string{"a", "a"}, URL: "http://x"},
		{Subjects: []string{"a"}, URL: "localhost:8080"},
	} {
		if _, err := New(nc, o); err == nil {
			t.Errorf("New(%+v) = nil error", o)
		}
	}
}

func TestEndpointNamesAndVersion(t *testing.T) {
	got := endpointNames([]string{"orders.get", "orders_get", "orders.*", "a.>"})
	want := []string{"orders_get", "orders_get_2", "orders__", "a__"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("endpointNames = %v, want %v", got, want)
	}
	for v, want := range map[string]string{"": "0.0.0", "v1.2.3": "1.2.3", "1.2.3-rc.1": "1.2.3-rc.1", "dev": "0.0.0"} {
		if got, _ := microVersion(v); got != want {
			t.Errorf("microVersion(%q) = %q, want %q", v, got, want)
		}
	}
}

func TestConnectionDroppedIs502(t *testing.T) {
	h := newHarness(t, 0)
	a := app(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		c, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_ = c.Close() // the app crashed mid-request
	})
	svc := h.start(a.URL, nil)
	m := h.request(nil, []byte("q"))
	checkReply(t, m, "", "502")
	waitCount(t, svc.reg, 1, "courier_reply_requests_total", "outcome", "transport")
}

// An app on a Unix socket (COURIER_REPLY_URL=unix://...) answers requests
// as one on a port does; with the socket gone, the caller gets a 503.
func TestAppOnUnixSocket(t *testing.T) {
	h := newHarness(t, 0)
	sock := filepath.Join(t.TempDir(), "app.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(r.Method + " " + r.Host + " " + r.URL.RequestURI()))
	})}
	go func() { _ = srv.Serve(ln) }()
	h.start("unix://"+sock+":/rpc?v=1", nil)

	m := h.request(nil, []byte("{}"))
	checkReply(t, m, "200", "")
	if string(m.Data) != "POST localhost /rpc?v=1" {
		t.Errorf("reply %q, want the app on the socket to have seen POST localhost /rpc?v=1", m.Data)
	}

	_ = srv.Close()
	m = h.request(nil, []byte("{}"))
	checkReply(t, m, "", "503")
}

// TestRequestThatWaitedPastTheTimeoutIsNotSent: a request that waited for a
// slot longer than the timeout is answered 503 busy and never reaches the
// app (its caller has most likely given up, and may have retried), while
// one that waited less is sent. One slot, a 1s timeout: the first request
// holds the slot half of it, the second then times out at the app (1.5s
// after the third came), so the third has waited past the timeout.
func TestRequestThatWaitedPastTheTimeoutIsNotSent(t *testing.T) {
	h := newHarness(t, 0)
	var mu sync.Mutex
	var order []string
	release := make(chan struct{})
	a := app(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		order = append(order, string(b))
		mu.Unlock()
		if string(b) == "0" {
			<-release
			return
		}
		<-r.Context().Done() // courier gives up at the timeout
	})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(letGo)
	const timeout = time.Second
	svc := h.start(a.URL, func(o *Options) { o.MaxConcurrent = 1; o.Timeout = timeout })

	replies := make([]chan *nats.Msg, 3)
	send := func(i int) {
		replies[i] = make(chan *nats.Msg, 1)
		go func() {
			m, err := h.tryRequest(nil, []byte(itoa(i)))
			if err != nil {
				t.Errorf("request %d: %v", i, err)
			}
			replies[i] <- m
		}()
	}
	send(0)
	waitCount(t, svc.reg, 1, "courier_reply_inflight_requests")
	send(1)
	waitCount(t, svc.reg, 1, "courier_reply_waiting_requests")
	send(2)
	waitCount(t, svc.reg, 2, "courier_reply_waiting_requests")
	time.Sleep(timeout / 2) // real time is what is tested: request 0 holds the slot
	letGo()

	for i, want := range []struct{ status, code string }{{"200", ""}, {"", "504"}, {"", "503"}} {
		if m := <-replies[i]; m != nil {
			checkReply(t, m, want.status, want.code)
			if i == 2 && !strings.Contains(m.Header.Get("Nats-Service-Error"), "waited") {
				t.Errorf("Nats-Service-Error = %q, want it to say the request waited too long", m.Header.Get("Nats-Service-Error"))
			}
		}
	}
	mu.Lock()
	got := strings.Join(order, ",")
	mu.Unlock()
	if got != "0,1" {
		t.Errorf("requests reached the app: %s, want 0,1 (2 waited past the timeout)", got)
	}
	waitCount(t, svc.reg, 1, "courier_reply_requests_total", "outcome", "busy")
	if g := metricstest.Value(t, svc.reg, "courier_reply_waiting_requests"); g != 0 {
		t.Errorf("waiting gauge = %v after every request ended, want 0", g)
	}
	if n := strings.Count(svc.logs.String(), "waited longer than"); n != 1 {
		t.Errorf("the late request logged %d times, want once:\n%s", n, svc.logs.String())
	}
}
