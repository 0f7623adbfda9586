package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
)

// A consumer setting the server refuses to change is reported plainly.
func TestConsumerSettingServerRefusesExit1(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable: "courier", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
	}); err != nil {
		t.Fatal(err)
	}
	err := run(ctx, nil, h.env("http://127.0.0.1:1/", "COURIER_DELIVER_POLICY=new"), io.Discard, io.Discard)
	var out bytes.Buffer
	if code := exitCode(err, &out); code != 1 {
		t.Fatalf("exit %d, want 1: %q", code, out.String())
	}
	line := out.String()
	for _, want := range []string{`durable consumer "courier"`, "COURIER_DELIVER_POLICY=new", "created with deliver policy all", "unset COURIER_DELIVER_POLICY"} {
		if !strings.Contains(line, want) {
			t.Errorf("error does not say %q: %q", want, line)
		}
	}
	if strings.Count(line, "\n") > 1 {
		t.Errorf("more than one line: %q", line)
	}
}

// A durable created with COURIER_DELIVER_POLICY=new keeps its policy when
// courier starts again without the variable (unset: the durable's own).
func TestDeliverPolicyKeptWhenUnset(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	c := start(t, h.env(a.URL, "COURIER_DELIVER_POLICY=new"))
	waitReady(t, c)
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	c = start(t, h.env(a.URL))
	waitReady(t, c)
	if info := h.consumerInfo("courier"); info == nil || info.Config.DeliverPolicy != jetstream.DeliverNewPolicy {
		t.Fatalf("the durable's deliver policy is not kept: %+v", info)
	}
	h.publish("orders.created", "after", nil)
	poll.Until(t, 10*time.Second, "the message delivered", func() bool { return a.count() == 1 })
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
}

// Settings the server can change on a live durable are applied.
func TestConsumerUpdatedInPlace(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	c := start(t, h.env(a.URL, "COURIER_MAX_DELIVER=3", "COURIER_ACK_WAIT=7s"))
	poll.Until(t, 10*time.Second, "the consumer", func() bool { return h.consumerInfo("courier") != nil })
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	start(t, h.env(a.URL, "COURIER_MAX_DELIVER=4", "COURIER_ACK_WAIT=9s", "COURIER_MAX_ACK_PENDING=500"))
	poll.Until(t, 10*time.Second, "the consumer updated", func() bool {
		info := h.consumerInfo("courier")
		return info != nil && info.Config.MaxDeliver == 4 && info.Config.AckWait == 9*time.Second && info.Config.MaxAckPending == 500
	})
	info := h.consumerInfo("courier")
	if info.Config.AckPolicy != jetstream.AckExplicitPolicy || len(info.Config.BackOff) != 0 || info.Config.InactiveThreshold != 0 {
		t.Errorf("consumer config: %+v", info.Config)
	}
}

// The README's first command: the demo runs, tells its story on stdout in
// the same order every run, courier's own log in a file it names (not
// interleaved with the story), and stops by itself; no signal came, and
// the log does not say one did.
func TestDemoRunsAndStops(t *testing.T) {
	if testing.Short() {
		t.Skip("demo takes a few seconds")
	}
	out, logs := runDemoForTest(t, nil)
	for _, want := range []string{"→ 200", "→ 429 Retry-After: 1", "→ 422", "sent to the app 1 time(s)", "every message settled",
		"4 success records on orders-done.ORDERS", "request on quotes.get → reply {",
		"app got a batch of 4 in one request (Courier-Batch: 4)", "invoice-3 (attempt 1) RETRY", "invoice-3 (attempt 2) SUCCESS",
		"all 4 invoices stored"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	// The story's order: the first attempts in stream order (one request
	// at a time), the invoices published before they are delivered.
	at := 0
	for _, next := range []string{"published 6 messages", "app got order-1 (attempt 1) → 200", "app got order-2 (attempt 1) → 429",
		"app got order-3 (attempt 1) → 503", "app got order-4 (attempt 1) → 422", "app got order-5 (attempt 1) → 200",
		"every message settled", "app published 4 invoices", "app got a batch of 4", "app got a batch of 1", "all 4 invoices stored",
		"app published a payment reminder with Courier-Delay: 2s → 202", "invoice-1-reminder (attempt 1) SUCCESS",
		"the reminder reached the app 2.", "demo: stopped"} {
		i := strings.Index(out[at:], next)
		if i < 0 {
			t.Errorf("demo output lacks %q after what came before:\n%s", next, out)
			break
		}
		at += i + len(next)
	}
	for line := range strings.Lines(out) {
		if !strings.HasPrefix(line, "demo: ") {
			t.Errorf("a line of the story is not the demo's: %q", line)
		}
	}
	// No line per delivered message at info: the summary counts them.
	for _, want := range []string{"retry_after=true", "dead-lettered", "summary at shutdown", "duplicates=1", "stopping: no more fetching", "courier stopped"} {
		if !strings.Contains(logs, want) {
			t.Errorf("demo logs lack %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "stop signal received") {
		t.Errorf("the log says a stop signal came; none did:\n%s", logs)
	}
}

// runDemoForTest runs `courier demo` with environ and returns its story
// and the log file it names.
func runDemoForTest(t *testing.T, environ []string) (story, logs string) {
	t.Helper()
	var stdout, stderr testlog.Buffer
	done := make(chan error, 1)
	go func() { done <- run(context.Background(), []string{"demo"}, environ, &stdout, &stderr) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo: %v\n%s\n%s", err, stdout.String(), stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("demo did not stop by itself")
	}
	if stderr.String() != "" {
		t.Errorf("the demo wrote to stderr:\n%s", stderr.String())
	}
	story = stdout.String()
	m := regexp.MustCompile(`courier's own log: (\S+) `).FindStringSubmatch(story)
	if m == nil {
		t.Fatalf("the demo does not say where courier's log is:\n%s", story)
	}
	t.Cleanup(func() { os.Remove(m[1]) })
	b, err := os.ReadFile(m[1])
	if err != nil {
		t.Fatal(err)
	}
	return story, string(b)
}

// A message older than COURIER_MAX_AGE is dead-lettered as expired and never
// reaches the app; a fresh one is delivered.
func TestExpiredMessageNeverReachesApp(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	h.publish("orders.old", "stale", nil)
	// Age is measured on the wall clock from the stream timestamp.
	time.Sleep(2200 * time.Millisecond)
	c := start(t, h.env(a.URL, "COURIER_MAX_AGE=2s"))
	// The fresh one is published once courier consumes: a start slowed by
	// a loaded machine must not age it past MaxAge as well.
	poll.Until(t, 15*time.Second, "courier consuming", func() bool {
		return strings.Contains(c.logs.String(), `"msg":"consuming"`)
	})
	h.publish("orders.new", "fresh", nil)
	poll.Until(t, 10*time.Second, "both settled", func() bool { return h.settled("courier") && a.count() == 1 })
	if a.requests()[0].Body != "fresh" {
		t.Errorf("app got %q", a.requests()[0].Body)
	}
	dls := h.deadLetters(dlqSubject)
	if len(dls) != 1 || string(dls[0].Data) != "stale" || dls[0].Header.Get("Courier-Reason") != "expired" {
		t.Fatalf("dead letters: %d", len(dls))
	}
	if !strings.Contains(dls[0].Header.Get("Courier-Error"), "COURIER_MAX_AGE") {
		t.Errorf("Courier-Error = %q", dls[0].Header.Get("Courier-Error"))
	}
}

// A misspelt COURIER_ variable is named in the log, not silently ignored.
func TestUnknownVariableWarned(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	c := start(t, h.env(a.URL, "COURIER_MAX_DELIVERY=3"))
	poll.Until(t, 10*time.Second, "the warning", func() bool {
		return strings.Contains(c.logs.String(), `"variable":"COURIER_MAX_DELIVERY"`)
	})
}

// NATS unreachable at start: courier keeps trying, /readyz fails and
// /healthz does not; once the server is there, it consumes.
func TestNATSUnreachableAtStartRetries(t *testing.T) {
	// The stream and a message are stored first, then the server is
	// stopped: when it comes back on the same port, everything is there.
	store := t.TempDir()
	first := natstest.NewServer(t, natstest.Options{StoreDir: store})
	port := first.Addr().(*net.TCPAddr).Port
	func() {
		_, js := natstest.Connect(t, first)
		ctx := context.Background()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, "orders.created", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}()
	natstest.Stop(first)

	a := newApp(t, nil)
	c := start(t, []string{
		fmt.Sprintf("NATS_URL=nats://127.0.0.1:%d", port), "COURIER_STREAM=ORDERS", "COURIER_APP_URL=" + a.URL,
		"COURIER_ADMIN_ADDR=127.0.0.1:0", "COURIER_DEDUP_DIR=" + t.TempDir(), "COURIER_LOG_FORMAT=json",
	})
	admin := adminAddr(t, c)
	poll.Until(t, 10*time.Second, "a retry logged", func() bool { return len(logLines(c, "NATS unreachable")) > 0 })
	if code, body := get(t, "http://"+admin+"/readyz"); code != 503 || !strings.Contains(body, "NATS") {
		t.Errorf("/readyz = %d %q, want 503 naming NATS", code, body)
	}
	if code, _ := get(t, "http://"+admin+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d: an unreachable server must not get courier restarted", code)
	}

	natstest.Start(t, natstest.Options{Port: port, StoreDir: store})
	poll.Until(t, 30*time.Second, "delivery once NATS is there", func() bool { return a.count() == 1 })
	poll.Until(t, 10*time.Second, "ready", func() bool { code, _ := get(t, "http://"+admin+"/readyz"); return code == 200 })
}

// A broker restart mid-stream: courier reconnects and goes on; every message
// is delivered.
func TestBrokerRestartMidStream(t *testing.T) {
	store := t.TempDir()
	srv := natstest.NewServer(t, natstest.Options{StoreDir: store})
	port := srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { natstest.Stop(srv) })
	nc, js := natstest.Connect(t, srv)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, err := js.Publish(ctx, "orders.created", []byte(fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(0, 10)
	a := newApp(t, nil)
	c := start(t, []string{
		"NATS_URL=" + srv.ClientURL(), "COURIER_STREAM=ORDERS", "COURIER_APP_URL=" + a.URL,
		"COURIER_ADMIN_ADDR=127.0.0.1:0", "COURIER_DEDUP_DIR=" + t.TempDir(), "COURIER_LOG_FORMAT=json",
	})
	poll.Until(t, 10*time.Second, "the first ten", func() bool { return a.count() == 10 })

	natstest.Stop(srv)
	srv = natstest.NewServer(t, natstest.Options{Port: port, StoreDir: store})
	poll.Until(t, 15*time.Second, "the test's client back", func() bool { return nc.IsConnected() })
	publish(10, 20)
	poll.Until(t, 30*time.Second, "the next ten after the restart", func() bool { return a.count() >= 20 })
	seen := map[string]bool{}
	for _, r := range a.requests() {
		seen[r.Body] = true
	}
	if len(seen) != 20 {
		t.Errorf("app saw %d distinct messages, want 20", len(seen))
	}
	if err := c.stop(); err != nil {
		t.Errorf("courier: %v", err)
	}
}

// A NATS restart of several seconds: courier says in one line when it is
// consuming again, and pulls again as soon as the connection is back
// rather than after a retry wait grown through the outage (which kept
// /readyz at "consumer not bound" for seconds after the reconnect).
func TestConsumingAgainAfterNATSRestart(t *testing.T) {
	store := t.TempDir()
	srv := natstest.NewServer(t, natstest.Options{StoreDir: store})
	port := srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { natstest.Stop(srv) })
	nc, js := natstest.Connect(t, srv)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	a := newApp(t, nil)
	c := start(t, []string{
		"NATS_URL=" + srv.ClientURL(), "COURIER_STREAM=ORDERS", "COURIER_APP_URL=" + a.URL,
		"COURIER_ADMIN_ADDR=127.0.0.1:0", "COURIER_DEDUP_DIR=" + t.TempDir(), "COURIER_LOG_FORMAT=json",
	})
	admin := adminAddr(t, c)
	poll.Until(t, 10*time.Second, "ready", func() bool { code, _ := get(t, "http://"+admin+"/readyz"); return code == 200 })

	natstest.Stop(srv)
	poll.Until(t, 10*time.Second, "courier to see the server gone", func() bool { return len(logLines(c, "disconnected from NATS")) > 0 })
	// Long enough for a retry wait doubling from 100ms to have grown to
	// seconds.
	time.Sleep(5 * time.Second)
	srv = natstest.NewServer(t, natstest.Options{Port: port, StoreDir: store})
	poll.Until(t, 15*time.Second, "courier reconnected", func() bool { return len(logLines(c, "reconnected to NATS")) > 0 })
	poll.Until(t, 15*time.Second, "the line saying courier consumes again", func() bool { return len(logLines(c, "consuming again")) > 0 })
	poll.Until(t, 15*time.Second, "the test's client back", func() bool { return nc.IsConnected() })
	if _, err := js.Publish(ctx, "orders.created", []byte("after")); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 15*time.Second, "the message published after the restart", func() bool { return a.count() == 1 })
	poll.Until(t, 10*time.Second, "ready", func() bool { code, _ := get(t, "http://"+admin+"/readyz"); return code == 200 })

	again := logLines(c, "consuming again")
	if len(again) != 1 {
		t.Errorf("%d lines %q, want 1", len(again), "consuming again")
	} else if d, err := time.ParseDuration(fmt.Sprint(again[0]["not_consuming_for"])); err != nil || d < time.Second {
		t.Errorf("consuming again after %v, want about the outage's length", again[0]["not_consuming_for"])
	}
	// While the connection was down the fetcher waited for it: no retry
	// wait grew meanwhile.
	for _, rec := range logLines(c, "cannot fetch") {
		if strings.Contains(fmt.Sprint(rec["error"]), "not connected") {
			t.Errorf("the fetcher backed off while disconnected: %v", rec)
		}
	}
}
