package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
)

const dlqSubject = "dlq.ORDERS.courier"

func TestHappyPathHeadersAndBodyIntact(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	body := "{\"id\":1}\x00\xff binary too"
	seq := h.publish("orders.created", body, map[string]string{
		"Content-Type":    "application/json",
		"X-Tenant":        "acme",
		"Nats-Msg-Id":     "msg-1",
		"traceparent":     "00-abc-def-01",
		"Idempotency-Key": "order-1",
	})
	start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "the app to receive the message", func() bool { return a.count() == 1 })
	poll.Until(t, 10*time.Second, "the message to be acked", func() bool { return h.settled("courier") })

	r := a.requests()[0]
	if r.Body != body {
		t.Errorf("body = %q, want %q", r.Body, body)
	}
	want := map[string]string{
		"Content-Type":     "application/json",
		"X-Tenant":         "acme",
		"Traceparent":      "00-abc-def-01",
		"Idempotency-Key":  "order-1",
		"Courier-Attempt":  "1",
		"Courier-Subject":  "orders.created",
		"Courier-Stream":   "ORDERS",
		"Courier-Sequence": strconv.FormatUint(seq, 10),
	}
	for k, v := range want {
		if got := r.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if r.Header.Get("Nats-Msg-Id") != "" {
		t.Errorf("NATS protocol header Nats-Msg-Id passed to the app")
	}
	pub, err := time.Parse(time.RFC3339Nano, r.Header.Get("Courier-Published"))
	if err != nil || time.Since(pub) > time.Minute {
		t.Errorf("Courier-Published = %q (%v)", r.Header.Get("Courier-Published"), err)
	}
	if n := len(h.deadLetters(dlqSubject)); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}

func TestKeyFallsBackToMsgIDThenStreamPosition(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	h.publish("orders.a", "a", map[string]string{"Nats-Msg-Id": "id-a"})
	seqB := h.publish("orders.b", "b", nil)
	h.publish("orders.c", "c", map[string]string{"X-Key": "custom-c", "Nats-Msg-Id": "id-c"})
	start(t, h.env(a.URL, "COURIER_IDEMPOTENCY_HEADER=X-Key"))
	poll.Until(t, 10*time.Second, "three requests", func() bool { return a.count() == 3 })
	keys := map[string]string{}
	for _, r := range a.requests() {
		keys[r.Body] = r.Header.Get("Idempotency-Key")
	}
	if keys["a"] != "id-a" || keys["c"] != "custom-c" {
		t.Errorf("keys = %v", keys)
	}
	if !strings.HasPrefix(keys["b"], "ORDERS:") || !strings.HasSuffix(keys["b"], ":"+strconv.FormatUint(seqB, 10)) {
		t.Errorf("derived key = %q, want ORDERS:<created>:%d", keys["b"], seqB)
	}
}

func TestTransientThenSuccessAttempts(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n < 3 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	h.publish("orders.created", "x", nil)
	start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "three attempts", func() bool { return a.count() == 3 })
	poll.Until(t, 10*time.Second, "ack", func() bool { return h.settled("courier") })
	for i, r := range a.requests() {
		if got := r.Header.Get("Courier-Attempt"); got != strconv.Itoa(i+1) {
			t.Errorf("request %d: Courier-Attempt %s", i+1, got)
		}
	}
	if n := len(h.deadLetters(dlqSubject)); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}

func TestRetryAfterBothForms(t *testing.T) {
	for _, form := range []string{"seconds", "http-date"} {
		t.Run(form, func(t *testing.T) {
			h := newHarness(t)
			a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if n == 1 {
					v := "1"
					if form == "http-date" {
						// HTTP dates have whole seconds: 2s ahead is at
						// least 1s away.
						v = time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat)
					}
					w.Header().Set("Retry-After", v)
					w.WriteHeader(http.StatusTooManyRequests)
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			h.publish("orders.created", "x", nil)
			// Backoff alone would retry within 200ms.
			start(t, h.env(a.URL, "COURIER_BACKOFF_INITIAL=10ms", "COURIER_BACKOFF_MAX=20ms"))
			poll.Until(t, 10*time.Second, "the retry", func() bool { return a.count() == 2 })
			reqs := a.requests()
			if gap := reqs[1].At.Sub(reqs[0].At); gap < 900*time.Millisecond {
				t.Errorf("retry came %s after a Retry-After of about 1s", gap)
			}
		})
	}
}

func TestRetryAfterCapped(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	h.publish("orders.created", "x", nil)
	start(t, h.env(a.URL, "COURIER_RETRY_AFTER_MAX=300ms"))
	poll.Until(t, 10*time.Second, "the capped retry", func() bool { return a.count() == 2 })
}

func TestPermanentDeadLetteredWithEnvelope(t *testing.T) {
	h := newHarness(t, func(c *jetstream.StreamConfig) { c.AllowMsgTTL, c.AllowRollup = true, true })
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		io.WriteString(w, "field id is missing")
	})
	seq := h.publish("orders.created", "payload", map[string]string{
		"X-Tenant":                    "acme",
		"Nats-Msg-Id":                 "orig-1",
		"Nats-Expected-Last-Sequence": "0",
		"Nats-TTL":                    "1s",
		"Nats-Rollup":                 "sub",
	})
	start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "one dead letter", func() bool { return len(h.deadLetters(dlqSubject)) == 1 })
	poll.Until(t, 10*time.Second, "the original terminated", func() bool { return h.settled("courier") })
	if a.count() != 1 {
		t.Errorf("app saw %d requests, want 1 (no retry of a permanent failure)", a.count())
	}
	dl := h.deadLetters(dlqSubject)[0]
	if string(dl.Data) != "payload" {
		t.Errorf("dead letter body %q", dl.Data)
	}
	want := map[string]string{
		dlq.HeaderReason:               "rejected",
		dlq.HeaderStatus:               "422",
		dlq.HeaderAttempts:             "1",
		dlq.HeaderSubject:              "orders.created",
		dlq.HeaderStream:               "ORDERS",
		dlq.HeaderSequence:             strconv.FormatUint(seq, 10),
		dlq.HeaderConsumer:             "courier",
		"X-Tenant":                     "acme",
		"Courier-Original-Nats-Msg-Id": "orig-1",
		"Courier-Original-Nats-Expected-Last-Sequence": "0",
		"Courier-Original-Nats-Ttl":                    "",
	}
	for k, v := range want {
		if k == "Courier-Original-Nats-Ttl" {
			if dl.Header.Get("Courier-Original-Nats-TTL") != "1s" {
				t.Errorf("Nats-TTL not kept under Courier-Original-: %v", dl.Header)
			}
			continue
		}
		if got := dl.Header.Get(k); got != v {
			t.Errorf("dead letter %s = %q, want %q", k, got, v)
		}
	}
	if !strings.Contains(dl.Header.Get(dlq.HeaderError), "field id is missing") {
		t.Errorf("Courier-Error = %q, want the app's answer", dl.Header.Get(dlq.HeaderError))
	}
	if _, err := time.Parse(time.RFC3339Nano, dl.Header.Get(dlq.HeaderFailedAt)); err != nil {
		t.Errorf("Courier-Failed-At: %v", err)
	}
	// The dead letter must not expire: Nats-TTL was not applied to it.
	if dl.Header.Get("Nats-TTL") != "" || dl.Header.Get("Nats-Rollup") != "" {
		t.Errorf("original Nats-* header acts on the DLQ stream: %v", dl.Header)
	}
}

func TestExhaustedAfterMaxDeliver(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusBadGateway)
	})
	h.publish("orders.created", "x", nil)
	start(t, h.env(a.URL, "COURIER_MAX_DELIVER=3"))
	poll.Until(t, 10*time.Second, "one dead letter", func() bool { return len(h.deadLetters(dlqSubject)) == 1 })
	poll.Until(t, 10*time.Second, "the original terminated", func() bool { return h.settled("courier") })
	if a.count() != 3 {
		t.Errorf("app saw %d requests, want MaxDeliver=3", a.count())
	}
	dl := h.deadLetters(dlqSubject)[0]
	if dl.Header.Get(dlq.HeaderReason) != "exhausted" || dl.Header.Get(dlq.HeaderAttempts) != "3" || dl.Header.Get(dlq.HeaderStatus) != "502" {
		t.Errorf("envelope: %v", dl.Header)
	}
}

func TestTimeoutReportedAsTimeout(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		select {
		case <-r.Context().Done():
		case <-time.After(2 * time.Second):
		}
	})
	h.publish("orders.created", "x", nil)
	start(t, h.env(a.URL, "COURIER_MAX_DELIVER=1", "COURIER_HTTP_TIMEOUT=200ms"))
	poll.Until(t, 10*time.Second, "one dead letter", func() bool { return len(h.deadLetters(dlqSubject)) == 1 })
	dl := h.deadLetters(dlqSubject)[0]
	if e := dl.Header.Get(dlq.HeaderError); !strings.Contains(e, "timed out") {
		t.Errorf("Courier-Error = %q, want a timeout", e)
	}
	if dl.Header.Get(dlq.HeaderStatus) != "" {
		t.Errorf("a timeout has no status, got %q", dl.Header.Get(dlq.HeaderStatus))
	}
}

func TestDLQUnavailableLosesNothing(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusBadRequest)
	})
	c := start(t, h.env(a.URL))
	// Wait until courier created the DLQ stream, then take it away.
	ctx := context.Background()
	var name string
	poll.Until(t, 10*time.Second, "the DLQ stream", func() bool {
		n, err := h.js.StreamNameBySubject(ctx, dlqSubject)
		name = n
		return err == nil
	})
	if err := h.js.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
	h.publish("orders.created", "precious", nil)
	poll.Until(t, 10*time.Second, "a failed dead-letter attempt", func() bool {
		return strings.Contains(c.logs.String(), "cannot store dead letter")
	})
	if !strings.Contains(c.logs.String(), "cannot store dead letter") {
		t.Fatal("no failure logged")
	}
	if info := h.consumerInfo("courier"); info == nil || info.NumAckPending != 1 {
		t.Fatalf("the message must stay pending while the DLQ is down: %+v", info)
	}
	// The DLQ comes back: the held message is dead-lettered once.
	if _, err := h.js.CreateStream(ctx, dlq.StreamConfig(dlqSubject, 1)); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "the dead letter", func() bool { return len(h.deadLetters(dlqSubject)) == 1 })
	poll.Until(t, 10*time.Second, "the original terminated", func() bool { return h.settled("courier") })
	if string(h.deadLetters(dlqSubject)[0].Data) != "precious" {
		t.Error("wrong dead letter body")
	}
	if a.count() != 1 {
		t.Errorf("app saw %d requests, want 1", a.count())
	}
}

func TestSlowAppShortAckWaitOneRequest(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		time.Sleep(3500 * time.Millisecond) // over three ack waits
		w.WriteHeader(http.StatusOK)
	})
	h.publish("orders.created", "x", nil)
	start(t, h.env(a.URL, "COURIER_ACK_WAIT=1s"))
	poll.Until(t, 15*time.Second, "the ack", func() bool { return a.count() >= 1 && h.settled("courier") })
	if a.count() != 1 {
		t.Errorf("app saw %d requests, want 1 (in-progress must stop redelivery)", a.count())
	}
}

func TestBackoffDoesNotStallFreshMessages(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if strings.HasPrefix(r.Header.Get("Courier-Subject"), "orders.bad") {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	// More failing messages than workers: all of them wait out a 30s
	// Retry-After, and fresh ones must still flow.
	for i := 0; i < 6; i++ {
		h.publish("orders.bad", "x", nil)
	}
	for i := 0; i < 20; i++ {
		h.publish("orders.good", "y", nil)
	}
	start(t, h.env(a.URL, "COURIER_MAX_INFLIGHT=2", "COURIER_MAX_ACK_PENDING=100"))
	var good atomic.Int32
	poll.Until(t, 10*time.Second, "every fresh message", func() bool {
		good.Store(0)
		for _, r := range a.requests() {
			if r.Header.Get("Courier-Subject") == "orders.good" {
				good.Add(1)
			}
		}
		return good.Load() == 20
	})
}

func TestSigtermDrainsInFlight(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		started <- struct{}{}
		<-release
		w.WriteHeader(http.StatusOK)
	})
	h.publish("orders.created", "one", nil)
	h.publish("orders.created", "two", nil)
	c := start(t, h.env(a.URL, "COURIER_MAX_INFLIGHT=1", "COURIER_SHUTDOWN_GRACE=10s"))
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- c.stop() }()
	// The in-flight request finishes within the grace period and is acked:
	// released once courier has taken the stop signal.
	poll.Until(t, 10*time.Second, "courier to take the stop signal", func() bool {
		return strings.Contains(c.logs.String(), "stopping: no more fetching")
	})
	close(release)
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("run returned %v, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("courier did not stop")
	}
	info := h.consumerInfo("courier")
	if info.AckFloor.Stream < 1 {
		t.Errorf("the in-flight message was not acked: %+v", info.AckFloor)
	}
	if a.count() != 1 {
		t.Errorf("app saw %d requests, want 1 (nothing new after SIGTERM)", a.count())
	}
	// The second message was given back and goes to the next courier.
	a2 := newApp(t, nil)
	start(t, h.env(a2.URL))
	poll.Until(t, 10*time.Second, "the rest delivered", func() bool { return a2.count() == 1 && h.settled("courier") })
	if a2.requests()[0].Body != "two" {
		t.Errorf("next courier got %q", a2.requests()[0].Body)
	}
}

func TestSigtermGraceOverNaks(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		<-r.Context().Done()
	})
	h.publish("orders.created", "x", nil)
	c := start(t, h.env(a.URL, "COURIER_SHUTDOWN_GRACE=300ms", "COURIER_HTTP_TIMEOUT=30s"))
	poll.Until(t, 10*time.Second, "the request", func() bool { return a.count() == 1 })
	if err := c.stop(); err != nil {
		t.Fatalf("run returned %v", err)
	}
	// NAK'd, not left to the ack wait: it is redelivered at once.
	a2 := newApp(t, nil)
	start(t, h.env(a2.URL, "COURIER_ACK_WAIT=30s"))
	poll.Until(t, 5*time.Second, "prompt redelivery", func() bool { return a2.count() == 1 })
	if got := a2.requests()[0].Header.Get("Courier-Attempt"); got != "2" {
		t.Errorf("attempt %s, want 2", got)
	}
}

func TestBadConfigurationExit2ListsEveryProblem(t *testing.T) {
	var stderr bytes.Buffer
	err := run(context.Background(), nil, []string{"COURIER_MAX_DELIVER=abc", "COURIER_ACK_WAIT=soon"}, io.Discard, &stderr)
	code := exitCode(err, &stderr)
	if code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	out := stderr.String()
	for _, name := range []string{"COURIER_STREAM", "COURIER_APP_URL", "COURIER_MAX_DELIVER", "COURIER_ACK_WAIT"} {
		if !strings.Contains(out, name) {
			t.Errorf("stderr does not name %s:\n%s", name, out)
		}
	}
}

func TestMissingStreamExit1(t *testing.T) {
	h := newHarness(t)
	var stderr testlog.Buffer
	err := run(context.Background(), nil, h.env("http://127.0.0.1:1/", "COURIER_STREAM=NOPE"), io.Discard, &stderr)
	var out bytes.Buffer
	if code := exitCode(err, &out); code != 1 {
		t.Fatalf("exit %d, want 1 (%v)", code, err)
	}
	line := out.String()
	if !strings.Contains(line, `stream "NOPE" not found`) || strings.Count(line, "\n") != 1 {
		t.Errorf("want one clear line naming the stream, got %q", line)
	}
}

func TestHeadersHTTPCannotCarryAreDropped(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	h.rawPublish("orders.created", []string{"X(Odd)@: v", "X-Ctl: a\x01b", "X-Fine: ok"}, "x")
	c := start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "the ack", func() bool { return a.count() == 1 && h.settled("courier") })
	r := a.requests()[0]
	if r.Header.Get("X-Fine") != "ok" {
		t.Error("valid header lost")
	}
	if r.Header.Get("X-Ctl") != "" {
		t.Error("control character passed through")
	}
	logs := c.logs.String()
	if !strings.Contains(logs, "X(Odd)@") || !strings.Contains(logs, "X-Ctl") {
		t.Errorf("dropped headers not logged:\n%s", logs)
	}
}

func TestRedirectIsTheAnswer(t *testing.T) {
	h := newHarness(t)
	var gets atomic.Int32
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Method != http.MethodPost {
			gets.Add(1)
		}
		http.Redirect(w, r, "/elsewhere", http.StatusSeeOther)
	})
	h.publish("orders.created", "x", nil)
	start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "the dead letter", func() bool { return len(h.deadLetters(dlqSubject)) == 1 })
	if gets.Load() != 0 || a.count() != 1 {
		t.Errorf("redirect followed: %d requests, %d non-POST", a.count(), gets.Load())
	}
	if got := h.deadLetters(dlqSubject)[0].Header.Get(dlq.HeaderStatus); got != "303" {
		t.Errorf("status %q, want 303", got)
	}
}

func TestDroppedConnectionNoSilentSecondCopy(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	h.publish("orders.created", "x", map[string]string{"Idempotency-Key": "k1"})
	start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "the retry succeeds", func() bool { return a.count() == 2 && h.settled("courier") })
	reqs := a.requests()
	if reqs[0].Header.Get("Courier-Attempt") != "1" || reqs[1].Header.Get("Courier-Attempt") != "2" {
		t.Errorf("attempts %s, %s: the second copy must be a counted retry, not a silent resend",
			reqs[0].Header.Get("Courier-Attempt"), reqs[1].Header.Get("Courier-Attempt"))
	}
}

func TestDLQSubjectInsideConsumedStreamRefused(t *testing.T) {
	h := newHarness(t, func(c *jetstream.StreamConfig) { c.Subjects = []string{"orders.>", "dlq.>"} })
	err := run(context.Background(), nil, h.env("http://127.0.0.1:1/"), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "own dead letters") {
		t.Fatalf("want a refusal, got %v", err)
	}
	var ee *exitError
	if errors.As(err, &ee) {
		t.Fatalf("want exit 1, got exit %d", ee.code)
	}
}

func TestJetStreamDisabledExit1(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.JetStream = false }})
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), nil, []string{
			"NATS_URL=" + srv.ClientURL(), "COURIER_STREAM=ORDERS", "COURIER_APP_URL=http://127.0.0.1:1/",
			"COURIER_ADMIN_ADDR=127.0.0.1:0", "COURIER_DEDUP_DIR=" + t.TempDir(),
		}, io.Discard, io.Discard)
	}()
	select {
	case err := <-done:
		var out bytes.Buffer
		if code := exitCode(err, &out); code != 1 || !strings.Contains(out.String(), "JetStream is not enabled") {
			t.Fatalf("exit %d: %q", code, out.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("courier kept retrying a server without JetStream")
	}
}
