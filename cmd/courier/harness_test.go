package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
)

// harness is one embedded JetStream server with a stream, for end-to-end
// tests that run courier in-process through run().
type harness struct {
	t      *testing.T
	srv    *server.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string
	dir    string // dedup directory
}

// newHarness starts a server and creates stream ORDERS on orders.> (cfg
// adjusts the stream).
func newHarness(t *testing.T, adjust ...func(*jetstream.StreamConfig)) *harness {
	t.Helper()
	srv := natstest.Start(t, natstest.Options{})
	nc, js := natstest.Connect(t, srv)
	sc := jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}
	for _, f := range adjust {
		f(&sc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, sc); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	return &harness{t: t, srv: srv, nc: nc, js: js, stream: sc.Name, dir: t.TempDir()}
}

// env is courier's environment for this harness: fast schedules for tests;
// extra "K=V" entries override.
func (h *harness) env(appURL string, extra ...string) []string {
	base := map[string]string{
		"NATS_URL":                h.srv.ClientURL(),
		"COURIER_STREAM":          h.stream,
		"COURIER_APP_URL":         appURL,
		"COURIER_ADMIN_ADDR":      "127.0.0.1:0",
		"COURIER_DEDUP_DIR":       h.dir,
		"COURIER_BACKOFF_INITIAL": "50ms",
		"COURIER_BACKOFF_MAX":     "200ms",
		"COURIER_ACK_WAIT":        "5s",
		"COURIER_HTTP_TIMEOUT":    "5s",
		"COURIER_SHUTDOWN_GRACE":  "5s",
		"COURIER_LOG_LEVEL":       "debug",
		"COURIER_LOG_FORMAT":      "json",
	}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		base[k] = v
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(base)) {
		out = append(out, k+"="+base[k])
	}
	return out
}

// courier is one in-process run of the sidecar.
type courier struct {
	t *testing.T
	// cancel stops it as its caller would; sigterm as SIGTERM does (the
	// cause main's notifyStop gives).
	cancel  context.CancelFunc
	sigterm func()
	done    chan error
	logs    *testlog.Buffer
	once    sync.Once
	err     error
}

// start runs the sidecar with environ until stop (or the test's end).
func start(t *testing.T, environ []string) *courier {
	t.Helper()
	ctx, cancel := context.WithCancelCause(context.Background())
	c := &courier{t: t, cancel: func() { cancel(nil) }, sigterm: func() { cancel(stopSignal{syscall.SIGTERM}) },
		done: make(chan error, 1), logs: &testlog.Buffer{}}
	go func() { c.done <- run(ctx, nil, environ, io.Discard, c.logs) }()
	t.Cleanup(func() { c.stop() })
	return c
}

// stop sends the shutdown signal and returns run's error.
func (c *courier) stop() error {
	c.once.Do(func() {
		c.cancel()
		select {
		case c.err = <-c.done:
		case <-time.After(30 * time.Second):
			c.err = fmt.Errorf("courier did not stop within 30s")
		}
		if c.t.Failed() {
			c.t.Logf("courier logs:\n%s", c.logs.String())
		}
	})
	return c.err
}

// exited returns run's error if it has returned by itself within d.
func (c *courier) exited(d time.Duration) (error, bool) {
	select {
	case err := <-c.done:
		c.once.Do(func() { c.err = err })
		return err, true
	case <-time.After(d):
		return nil, false
	}
}

// publish stores a message on the stream and returns its sequence.
func (h *harness) publish(subject, body string, hdr map[string]string) uint64 {
	h.t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(body)
	for k, v := range hdr {
		m.Header[k] = []string{v} // as sent: NATS header names are case-sensitive
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := h.js.PublishMsg(ctx, m)
	if err != nil {
		h.t.Fatalf("publish: %v", err)
	}
	return ack.Sequence
}

// deadLetters returns every message stored on the DLQ subject.
func (h *harness) deadLetters(subject string) []*jetstream.RawStreamMsg {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	name, err := h.js.StreamNameBySubject(ctx, subject)
	if err != nil {
		return nil
	}
	s, err := h.js.Stream(ctx, name)
	if err != nil {
		h.t.Fatalf("dlq stream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		h.t.Fatalf("dlq stream info: %v", err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		out = append(out, m)
	}
	return out
}

// consumerInfo returns the durable's state.
func (h *harness) consumerInfo(name string) *jetstream.ConsumerInfo {
	h.t.Helper()
	return h.consumerInfoOn(h.stream, name)
}

// consumerInfoOn returns the state of consumer name on stream, or nil.
func (h *harness) consumerInfoOn(stream, name string) *jetstream.ConsumerInfo {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := h.js.Consumer(ctx, stream, name)
	if err != nil {
		return nil
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil
	}
	return info
}

// settled reports whether the consumer has delivered everything and nothing
// waits for an ack. It looks twice: a consumer courier has just created
// reads as having nothing pending until the server has counted its
// messages, which nats-server does when the consumer takes leadership,
// after it is visible to a consumer info request (addConsumerWithAssignment
// registers it before setLeader runs streamNumPending, server/consumer.go).
// A look a moment later sees the count.
func (h *harness) settled(name string) bool {
	if !h.settledNow(name) {
		return false
	}
	time.Sleep(50 * time.Millisecond)
	return h.settledNow(name)
}

// settledNow is one look of settled.
func (h *harness) settledNow(name string) bool {
	info := h.consumerInfo(name)
	return info != nil && info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0
}

// metrics reads the /metrics of the courier whose admin server is at
// admin, as a registry is read (internal/metricstest).
func metrics(admin string) prometheus.Gatherer {
	return metricstest.Scrape("http://" + admin + "/metrics")
}

// request is what the app received.
type request struct {
	Header http.Header
	Body   string
	At     time.Time
}

// app is a real HTTP app recording every request; answer decides each
// response (nil: 200).
type app struct {
	*httptest.Server
	mu     sync.Mutex
	reqs   []request
	answer func(w http.ResponseWriter, r *http.Request, n int) // n: 1-based count of requests so far with this Idempotency-Key
	byKey  map[string]int
}

func newApp(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, n int)) *app {
	t.Helper()
	a := &app{answer: answer, byKey: make(map[string]int)}
	a.Server = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.Close)
	return a
}

func (a *app) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	a.mu.Lock()
	key := r.Header.Get("Idempotency-Key")
	a.byKey[key]++
	n := a.byKey[key]
	a.reqs = append(a.reqs, request{Header: r.Header.Clone(), Body: string(body), At: time.Now()})
	a.mu.Unlock()
	if a.answer != nil {
		a.answer(w, r, n)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (a *app) requests() []request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.reqs)
}

func (a *app) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.reqs)
}

// calls returns how many requests carried key.
func (a *app) calls(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.byKey[key]
}

// rawPublish sends a message as another NATS client might: header lines
// written by hand, which nats.go would refuse to encode. It waits until the
// stream has stored it.
func (h *harness) rawPublish(subject string, headerLines []string, body string) {
	h.t.Helper()
	before := h.streamMsgs()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.srv.ClientURL(), "nats://"))
	if err != nil {
		h.t.Fatal(err)
	}
	defer conn.Close()
	hdr := "NATS/1.0\r\n" + strings.Join(headerLines, "\r\n") + "\r\n\r\n"
	proto := fmt.Sprintf("CONNECT {\"verbose\":false,\"headers\":true,\"protocol\":1}\r\nHPUB %s %d %d\r\n%s%s\r\nPING\r\n",
		subject, len(hdr), len(hdr)+len(body), hdr, body)
	if _, err := io.WriteString(conn, proto); err != nil {
		h.t.Fatal(err)
	}
	poll.Until(h.t, 5*time.Second, "the raw message stored", func() bool { return h.streamMsgs() > before })
}

func (h *harness) streamMsgs() uint64 {
	h.t.Helper()
	return h.streamMsgsOf(h.stream)
}

// streamMsgsOf returns how many messages stream holds.
func (h *harness) streamMsgsOf(stream string) uint64 {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := h.js.Stream(ctx, stream)
	if err != nil {
		h.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	return info.State.Msgs
}
