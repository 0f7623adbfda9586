// Package demo runs courier end to end on one machine with nothing
// installed: an embedded JetStream server, a small sample app that fails some
// requests on purpose, and a handful of messages that show a success, a
// retry honouring Retry-After, a retry with backoff, a duplicate, a dead
// letter, a success record, a request/reply round trip, a batch and a
// delayed publish. It tells
// its story on one writer, in the same order every run; courier's own log
// goes where the caller's Sidecar writes it (`courier demo`: a file it
// names).
package demo

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Sidecar runs courier with the given environment until ctx ends.
type Sidecar func(ctx context.Context, environ []string) error

// Options configures Run.
type Options struct {
	// Out receives the demo's own narration. Required.
	Out io.Writer
	// Timeout stops the demo if it has not finished; default 30s.
	Timeout time.Duration
	// Environ is the environment courier was started with ("KEY=value"):
	// its COURIER_LOG_* variables are passed on to the demo's sidecar, the
	// rest is not. The demo reads no environment of its own (config alone
	// does).
	Environ []string
	// LogFile names where the sidecar writes its own log (the Sidecar
	// decides), for the narration to say; "" says nothing. The story is
	// told on Out alone: courier's log lines interleaved with it would
	// break it.
	LogFile string
}

// Run starts the embedded server and the sample app, publishes the demo
// messages, runs the sidecar until every message has settled (or ctx ends),
// then stops everything and removes its temporary files.
func Run(ctx context.Context, sidecar Sidecar, o Options) error {
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	say := func(format string, a ...any) { fmt.Fprintf(o.Out, "demo: "+format+"\n", a...) }

	dir, err := os.MkdirTemp("", "courier-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	ns, err := startServer(dir)
	if err != nil {
		return err
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	say("embedded JetStream server at %s", ns.ClientURL())
	if o.LogFile != "" {
		say("courier's own log: %s (follow it with tail -f beside this story)", o.LogFile)
	}

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(sctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		return fmt.Errorf("demo: create stream: %w", err)
	}

	app := newSampleApp(say)
	invoices := newInvoiceApp(say)
	base, closeApps, err := serveApps(app, invoices)
	if err != nil {
		return err
	}
	defer closeApps()
	appURL, quoteURL := base+"/orders", base+"/quote"
	say("sample app at %s (and %s for requests)", appURL, quoteURL)

	if err := publishOrders(sctx, js, say); err != nil {
		return err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	environ := sidecarEnviron(ns.ClientURL(), appURL, quoteURL, dir, o.Environ)
	go func() { done <- sidecar(runCtx, environ) }()

	result, early := awaitSettled(ctx, js, app, done, o.Timeout, say)
	if early != nil {
		return early
	}
	if result == nil && ctx.Err() == nil {
		result = showResults(ctx, nc, js, say)
	}
	stop()
	if err := <-done; err != nil && result == nil {
		result = err
	}
	if result == nil && ctx.Err() == nil {
		result = runBatches(ctx, sidecar, js, ns.ClientURL(), dir, base+"/invoices", invoices, o.Timeout)
	}
	if o.LogFile != "" {
		say("stopped; courier's own log, with a line per retry and dead letter and a summary at shutdown, is in %s", o.LogFile)
	} else {
		say("stopped")
	}
	return result
}

// startServer starts an in-process JetStream server storing in dir: nothing
// to install. The caller shuts it down.
func startServer(dir string) (*server.Server, error) {
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: dir + "/jetstream", NoLog: true, NoSigs: true,
		JetStreamMaxMemory: 64 << 20, JetStreamMaxStore: 256 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("demo: embedded NATS server: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("demo: embedded NATS server did not start")
	}
	return ns, nil
}

// serveApps serves the sample app and the invoices app on a local port; it
// returns their base URL and what stops them.
func serveApps(app http.Handler, invoices http.Handler) (string, func(), error) {
	mux := http.NewServeMux()
	mux.Handle("/", app)
	mux.Handle("/invoices", invoices)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// publishOrders publishes the demo's messages to the stream ORDERS.
func publishOrders(ctx context.Context, js jetstream.JetStream, say func(string, ...any)) error {
	msgs := []struct {
		subject, body, key string
	}{
		{"orders.created", `{"id":1,"note":"ok"}`, "order-1"},
		{"orders.created", `{"id":2,"note":"busy"}`, "order-2"},
		{"orders.created", `{"id":3,"note":"flaky"}`, "order-3"},
		{"orders.created", `{"id":4,"note":"invalid"}`, "order-4"},
		{"orders.created", `{"id":1,"note":"ok"}`, "order-1"}, // the same intent, published twice
		{"orders.shipped", `{"id":5,"note":"ok"}`, "order-5"},
	}
	for _, m := range msgs {
		msg := nats.NewMsg(m.subject)
		msg.Data = []byte(m.body)
		msg.Header.Set("Idempotency-Key", m.key)
		msg.Header.Set("Content-Type", "application/json")
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			return fmt.Errorf("demo: publish: %w", err)
		}
	}
	say("published %d messages to stream ORDERS (order-1 twice)", len(msgs))
	return nil
}

// sidecarEnviron is the demo sidecar's environment, with the user's
// COURIER_LOG_* from userEnviron.
func sidecarEnviron(natsURL, appURL, quoteURL, dir string, userEnviron []string) []string {
	environ := []string{
		"NATS_URL=" + natsURL,
		"COURIER_STREAM=ORDERS",
		"COURIER_APP_URL=" + appURL,
		"COURIER_MAX_DELIVER=3",
		"COURIER_ACK_WAIT=5s",
		// One request at a time, and retries with backoff done before
		// the 429's Retry-After (1s) is: the story is told in the same
		// order every run.
		"COURIER_MAX_INFLIGHT=1",
		"COURIER_BACKOFF_INITIAL=100ms",
		"COURIER_BACKOFF_MAX=300ms",
		"COURIER_DEDUP_DIR=" + dir + "/dedup",
		"COURIER_ADMIN_ADDR=127.0.0.1:0",
		"COURIER_SHUTDOWN_GRACE=2s",
		"COURIER_SUCCESS_SUBJECT=" + successSubject,
		"COURIER_REPLY_SUBJECTS=" + quoteSubject,
		"COURIER_REPLY_URL=" + quoteURL,
	}
	// Text logs unless the user asks otherwise: the demo is read by people.
	// The user's COURIER_LOG_* come first, since the first of duplicate
	// names wins (config.Environ).
	for _, kv := range userEnviron {
		if strings.HasPrefix(kv, "COURIER_LOG_") {
			environ = append(environ, kv)
		}
	}
	return append(environ, "COURIER_LOG_FORMAT=text")
}

// awaitSettled waits until every demo message has settled: orders 1, 2, 3
// and 5 answered 2xx, and order 4's dead letter stored. result is the
// demo's error when they did not within timeout; early is set when the
// sidecar stopped first (done).
func awaitSettled(ctx context.Context, js jetstream.JetStream, app *sampleApp, done <-chan error, timeout time.Duration, say func(string, ...any)) (result, early error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			say("interrupted")
			return nil, nil
		case err := <-done:
			return nil, fmt.Errorf("demo: courier stopped early: %w", err)
		case <-deadline.C:
			return fmt.Errorf("demo: not every message settled within %s", timeout), nil
		case <-tick.C:
			if app.succeeded() >= 4 && dlqCount(ctx, js) >= 1 && settled(ctx, js) {
				say("every message settled: %d answered 2xx by the app; order-1 published twice, sent to the app %d time(s); 1 dead letter",
					app.succeeded(), app.calls("order-1"))
				return nil, nil
			}
		}
	}
}

// showResults tells what the demo left: the dead letter, the success records
// and a request/reply round trip.
func showResults(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, say func(string, ...any)) error {
	say("order-4's dead letter is stored on subject dlq.ORDERS.courier with its reason and last status")
	if n, first := successRecords(ctx, js); n > 0 {
		say("%d success records on %s (one per order answered 2xx), e.g. %s", n, successSubject, first)
	}
	resp, err := nc.Request(quoteSubject, []byte(`{"sku":"A1","qty":3}`), 5*time.Second)
	if err != nil {
		return fmt.Errorf("demo: request on %s: %w", quoteSubject, err)
	}
	say("request on %s → reply %s (Courier-Status: %s)", quoteSubject, resp.Data, resp.Header.Get("Courier-Status"))
	return nil
}

// Where the demo's success records go, and the subject courier answers.
const (
	successSubject = "orders-done.ORDERS"
	quoteSubject   = "quotes.get"
)

// successRecords counts the success records and describes the first.
func successRecords(ctx context.Context, js jetstream.JetStream) (uint64, string) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	name, err := js.StreamNameBySubject(ctx, successSubject)
	if err != nil {
		return 0, ""
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		return 0, ""
	}
	info, err := s.Info(ctx)
	if err != nil || info.State.Msgs == 0 {
		return 0, ""
	}
	m, err := s.GetMsg(ctx, info.State.FirstSeq)
	if err != nil {
		return info.State.Msgs, ""
	}
	return info.State.Msgs, fmt.Sprintf("%s (Courier-Status: %s, Idempotency-Key: %s)",
		m.Data, m.Header.Get("Courier-Status"), m.Header.Get("Idempotency-Key"))
}

// settled reports whether the consumer has nothing pending or unacked.
func settled(ctx context.Context, js jetstream.JetStream) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, "ORDERS", "courier")
	if err != nil {
		return false
	}
	info, err := c.Info(ctx)
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}

func dlqCount(ctx context.Context, js jetstream.JetStream) uint64 {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	name, err := js.StreamNameBySubject(ctx, "dlq.ORDERS.courier")
	if err != nil {
		return 0
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// sampleApp answers by the message's note: ok → 200; busy → 429 with
// Retry-After: 1 the first time; flaky → 503 twice, then 200; invalid → 422.
type sampleApp struct {
	say  func(string, ...any)
	mu   sync.Mutex
	seen map[string]int
	oks  int
}

func newSampleApp(say func(string, ...any)) *sampleApp {
	return &sampleApp{say: say, seen: make(map[string]int)}
}

func (a *sampleApp) succeeded() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.oks
}

func (a *sampleApp) calls(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.seen[key]
}

func (a *sampleApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if r.URL.Path == "/quote" {
		a.say("app got a request %s → 200", body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"sku":"A1","qty":3,"price":"29.85"}`))
		return
	}
	key := r.Header.Get("Idempotency-Key")
	a.mu.Lock()
	a.seen[key]++
	n := a.seen[key]
	a.mu.Unlock()
	attempt := r.Header.Get("Courier-Attempt")
	answer := func(status int, note string) {
		a.say("%s", strings.TrimSpace(fmt.Sprintf("app got %s (attempt %s) → %d %s", key, attempt, status, note)))
		w.WriteHeader(status)
		if status == 200 {
			_, _ = fmt.Fprintf(w, `{"accepted":%q}`, key)
			a.mu.Lock()
			a.oks++
			a.mu.Unlock()
		}
	}
	switch s := string(body); {
	case strings.Contains(s, `"busy"`) && n == 1:
		w.Header().Set("Retry-After", "1")
		answer(http.StatusTooManyRequests, "Retry-After: 1")
	case strings.Contains(s, `"flaky"`) && n <= 2:
		answer(http.StatusServiceUnavailable, "(courier backs off)")
	case strings.Contains(s, `"invalid"`):
		answer(http.StatusUnprocessableEntity, "(permanent: dead-lettered)")
	default:
		answer(http.StatusOK, "")
	}
}
