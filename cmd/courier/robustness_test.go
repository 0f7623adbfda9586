package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

// A courier that starts while its JetStream cluster has lost quorum (two of
// three nodes down, for longer than the server's lost-quorum interval) is
// facing a failure that time fixes: the server answers "JetStream system
// temporarily unavailable" (10008). It must retry while /readyz fails, and
// start once the nodes are back, not exit as if retrying could not help.
func TestStartWhileClusterHasNoQuorumRetries(t *testing.T) {
	k := newCluster(t)
	a := newApp(t, nil)
	k.c.Shutdown(1)
	k.c.Shutdown(2)
	// The server reports itself leaderless only after lostQuorumInterval
	// (10s by default): real time passing is what the test needs.
	time.Sleep(12 * time.Second)
	env := k.harness.env(a.URL, "NATS_URL="+k.c.NodeURL(0), "COURIER_LOG_LEVEL=info")
	c := start(t, env)
	if err, done := c.exited(8 * time.Second); done {
		t.Fatalf("courier exited while the cluster had no quorum: %v\nlogs:\n%s", err, c.logs.String())
	}
	// It is retrying, not stuck: the retry helper says so for each try (the
	// first once its first request has timed out).
	poll.Until(t, 30*time.Second, "courier to retry its start-up while the cluster has no quorum", func() bool {
		return strings.Contains(c.logs.String(), "JetStream not answering; retrying start-up")
	})
	k.c.Restart(1)
	k.c.Restart(2)
	waitReady(t, c)
	if err := c.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// Two durables named alike (COURIER_CONSUMER's default, "courier") on two
// streams are two consumers, whose keys are scoped apart (the dedup store's
// scope is stream/consumer). Sharing one success subject, each 2xx'd
// message must have its success record, even when both messages carry the
// same idempotency key (one business intent flowing through both streams).
func TestSuccessRecordsOfTwoStreamsSameKeyBothKept(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.js.CreateStream(ctx, jetstream.StreamConfig{Name: "PAYMENTS", Subjects: []string{"payments.>"}}); err != nil {
		t.Fatal(err)
	}
	a := newApp(t, nil)
	c1 := start(t, h.env(a.URL, "COURIER_SUCCESS_SUBJECT=ok.results"))
	c2 := start(t, h.env(a.URL, "COURIER_SUCCESS_SUBJECT=ok.results", "COURIER_STREAM=PAYMENTS", "COURIER_DEDUP_DIR="+t.TempDir()))
	h.publish("orders.new", "order 42", map[string]string{"Idempotency-Key": "intent-42"})
	h.publish("payments.new", "payment 42", map[string]string{"Idempotency-Key": "intent-42"})
	poll.Until(t, 15*time.Second, "both messages delivered and acked", func() bool {
		return a.count() >= 2 && h.settled("courier") && func() bool {
			info := h.consumerInfoOn("PAYMENTS", "courier")
			return info != nil && info.NumPending == 0 && info.NumAckPending == 0
		}()
	})
	recs := h.deadLetters("ok.results") // every message stored on the subject
	var streams []string
	for _, r := range recs {
		streams = append(streams, r.Header.Get("Courier-Stream"))
	}
	if len(recs) != 2 {
		t.Errorf("%d success records (streams %v), want 2: one message's record was dropped as a duplicate of the other's", len(recs), streams)
	}
	_ = c1.stop()
	_ = c2.stop()
}

// Credentials the server stops accepting while courier runs (a password
// changed, a user revoked or expired) make nats.go close the connection for
// good after the same authorization error twice. courier must not go on as
// a process whose /healthz passes and that never connects again: retrying
// cannot fix a closed connection, so it stops with one clear line, status 1.
func TestCredentialsRefusedWhileRunningExit1(t *testing.T) {
	var opts *server.Options
	h := newSecureHarness(t, natstest.Options{Configure: func(o *server.Options) {
		o.Username, o.Password = "u", "p1"
		opts = o
	}}, nats.UserInfo("u", "p1"))
	a := newApp(t, nil)
	c := start(t, h.env(a.URL, "NATS_USER=u", "NATS_PASSWORD=p1"))
	waitReady(t, c)
	h.publish("orders.a", "a", nil)
	poll.Until(t, 10*time.Second, "the message delivered", func() bool { return a.count() >= 1 })

	changed := *opts
	changed.Password = "p2"
	if err := h.srv.ReloadOptions(&changed); err != nil {
		t.Fatalf("reload: %v", err)
	}
	err, done := c.exited(20 * time.Second)
	if !done {
		code, body := get(t, "http://"+adminAddr(t, c)+"/healthz")
		rcode, rbody := get(t, "http://"+adminAddr(t, c)+"/readyz")
		t.Fatalf("courier still running 20s after its credentials were refused for good: /healthz %d %q, /readyz %d %q", code, body, rcode, rbody)
	}
	var line strings.Builder
	if code := exitCode(err, &line); code != 1 {
		t.Errorf("exit status %d (%v), want 1", code, err)
	}
	t.Logf("exit line: %s", line.String())
}

// The app's response headers become the success record's, but NATS acts on
// its own Nats-* headers at publish: an app answer carrying one (an
// expectation, a rollup, a TTL) must not make the record unpublishable, or
// hold the message for ever, or act on the success stream.
func TestSuccessRecordIgnoresAppsNatsHeaders(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Nats-Expected-Stream", "SOMEWHERE_ELSE")
		w.Header().Set("X-Order", "42")
		w.WriteHeader(http.StatusOK)
	})
	c := start(t, h.env(a.URL, "COURIER_SUCCESS_SUBJECT=ok.results"))
	h.publish("orders.new", "order 42", nil)
	poll.Until(t, 15*time.Second, "the message acked", func() bool { return h.settled("courier") })
	recs := h.deadLetters("ok.results")
	if len(recs) != 1 || recs[0].Header.Get("X-Order") != "42" {
		t.Fatalf("%d records, want 1 with the app's X-Order", len(recs))
	}
	_ = c.stop()
}

// A reply subject the consumed stream captures (COURIER_SUBJECTS unset, the
// default) is the hazard config refuses for a filter subject: the stream
// stores each request and its acknowledgement answers the caller before the
// app does, and the delivery loop posts the request to the app a second
// time. Start-up must refuse it with one clear line, as it refuses a
// dead-letter subject the stream captures.
func TestReplySubjectCapturedByConsumedStreamRefused(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) { _, _ = w.Write([]byte("the app's answer")) })
	c := start(t, h.env(a.URL, "COURIER_REPLY_SUBJECTS=orders.get"))
	if err, done := c.exited(10 * time.Second); done {
		var line strings.Builder
		if code := exitCode(err, &line); code != 1 || !strings.Contains(line.String(), "orders.get") {
			t.Errorf("exit %d: %s", code, line.String())
		}
		return
	}
	waitReady(t, c)
	resp, err := h.nc.Request("orders.get", []byte("q"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the app called twice", func() bool { return a.count() >= 2 })
	t.Errorf("courier started; the caller's reply was %q, and the app was called %d times for one request", resp.Data, a.count())
}

// COURIER_SHUTDOWN_GRACE=0 means in-flight requests get no grace: the
// reply service too must cancel a request still at the app at once and
// answer it 503, not wait the 25s default grace of its own.
func TestReplyNoGraceStopsPromptly(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		select {
		case <-release:
		case <-r.Context().Done():
		case <-time.After(15 * time.Second):
		}
	})
	c := start(t, h.env("", "COURIER_STREAM=", "COURIER_REPLY_SUBJECTS=svc.slow", "COURIER_REPLY_URL="+a.URL,
		"COURIER_SHUTDOWN_GRACE=0", "COURIER_HTTP_TIMEOUT=30s"))
	waitReady(t, c)
	type result struct {
		m   *nats.Msg
		err error
	}
	got := make(chan result, 1)
	go func() {
		m, err := h.nc.Request("svc.slow", []byte("q"), 20*time.Second)
		got <- result{m, err}
	}()
	poll.Until(t, 15*time.Second, "the request at the app", func() bool { return a.count() >= 1 })
	began := time.Now()
	_ = c.stop()
	// Bounded below the app's own 15s, and far below the 25s default grace
	// this guards against, with room for a loaded machine.
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("stop took %s with COURIER_SHUTDOWN_GRACE=0", took.Round(time.Millisecond))
	}
	r := <-got
	if r.err != nil || r.m.Header.Get("Nats-Service-Error-Code") != "503" {
		t.Errorf("reply %v, error %v; want a 503 error reply", r.m, r.err)
	}
}
