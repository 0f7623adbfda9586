package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/rewind"
)

// replayApp records every request: its body, the message's Order header,
// its sequence and its Courier-Replay.
type replayApp struct {
	slow  time.Duration // how long each answer takes
	mu    sync.Mutex
	calls []replayCall
}

type replayCall struct {
	body, order, replay string
	seq                 uint64
}

func (a *replayApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	time.Sleep(a.slow)
	seq, _ := strconv.ParseUint(r.Header.Get("Courier-Sequence"), 10, 64)
	a.mu.Lock()
	a.calls = append(a.calls, replayCall{body: string(b), order: r.Header.Get("Order"), replay: r.Header.Get("Courier-Replay"), seq: seq})
	a.mu.Unlock()
}

func (a *replayApp) all() []replayCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]replayCall(nil), a.calls...)
}

func (a *replayApp) count() int { return len(a.all()) }

// rewindCLI runs courier rewind with args against env: its output and error.
func rewindCLI(env []string, args ...string) (string, error) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), append([]string{"rewind"}, args...), env, &out, &errOut)
	return out.String() + errOut.String(), err
}

// A rewind to a time, while the courier runs: every message stored from
// then on reaches the app once more, in stream order, marked with the
// rewind's id, the two copies of one key inside the range as one call;
// without --yes nothing changes (exit 2); what is published afterwards is
// delivered once, as usual.
func TestRewindToTimeDeliversTheRangeAgainOnce(t *testing.T) {
	h := newHarness(t)
	a := &replayApp{}
	app := httptest.NewServer(a)
	t.Cleanup(app.Close)
	// One at a time, so that the app sees the stream's order.
	env := h.env(app.URL, "COURIER_LOG_LEVEL=info", "COURIER_MAX_INFLIGHT=1")
	c := start(t, env)
	for i := range 5 {
		h.publish("orders.created", fmt.Sprintf("before-%d", i), map[string]string{"Idempotency-Key": fmt.Sprintf("b%d", i)})
	}
	poll.Until(t, 10*time.Second, "the first five delivered", func() bool { return a.count() == 5 })
	time.Sleep(20 * time.Millisecond) // the rewind's time falls between the two sets
	from := time.Now()
	time.Sleep(20 * time.Millisecond)
	first := h.publish("orders.created", "after-0", map[string]string{"Idempotency-Key": "a0"})
	for i := 1; i < 5; i++ {
		h.publish("orders.created", fmt.Sprintf("after-%d", i), map[string]string{"Idempotency-Key": fmt.Sprintf("a%d", i)})
	}
	h.publish("orders.created", "after-0-again", map[string]string{"Idempotency-Key": "a0"}) // a duplicate inside the range
	poll.Until(t, 10*time.Second, "the next five delivered", func() bool { return a.count() == 10 && h.settled("courier") })

	out, err := rewindCLI(env, "--to-time", from.UTC().Format(time.RFC3339Nano))
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 {
		t.Fatalf("rewind without --yes: %v, want exit 2\n%s", err, out)
	}
	if want := fmt.Sprintf("stream sequences %d to %d: 6 message(s)", first, first+5); !strings.Contains(out, want) {
		t.Errorf("rewind without --yes said %q, want it to contain %q", out, want)
	}
	info, err := h.js.Consumer(context.Background(), "ORDERS", "courier")
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().Delivered.Stream; got != first+5 {
		t.Errorf("after a rewind without --yes the durable has delivered up to %d, want %d", got, first+5)
	}

	if out, err = rewindCLI(env, "--to-time", from.UTC().Format(time.RFC3339Nano), "--yes"); err != nil {
		t.Fatalf("rewind: %v\n%s", err, out)
	}
	if !strings.Contains(out, fmt.Sprintf("to stream sequence %d", first)) {
		t.Errorf("rewind said %q", out)
	}
	poll.Until(t, 10*time.Second, "the range delivered again and settled", func() bool { return a.count() == 15 && h.settled("courier") })
	h.publish("orders.created", "later", map[string]string{"Idempotency-Key": "later"})
	poll.Until(t, 10*time.Second, "a later message delivered", func() bool { return a.count() == 16 && h.settled("courier") })

	var status bytes.Buffer
	if err := run(context.Background(), []string{"status"}, env, &status, io.Discard); err != nil {
		t.Fatalf("courier status: %v", err)
	}
	if want := fmt.Sprintf("sequences %d to %d, done", first, first+5); !strings.Contains(status.String(), want) {
		t.Errorf("courier status does not show the rewind done (%q):\n%s", want, status.String())
	}
	calls := a.all()
	replayed := calls[10:15]
	id := replayed[0].replay
	if id == "" || !strings.Contains(out, "Courier-Replay: "+id) {
		t.Fatalf("replayed message without the rewind's id: %+v (rewind said %q)", replayed[0], out)
	}
	for i, c := range replayed {
		if want := fmt.Sprintf("after-%d", i); c.body != want || c.replay != id {
			t.Errorf("replayed call %d: %q with Courier-Replay %q, want %q with %q", i, c.body, c.replay, want, id)
		}
	}
	for _, c := range append(calls[:10:10], calls[15]) {
		if c.replay != "" {
			t.Errorf("%q carried Courier-Replay %q; only the range's replay should", c.body, c.replay)
		}
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
	if got := logLines(c, "rewind: messages in its range are delivered again as a replay"); len(got) != 1 {
		t.Errorf("the courier logged the rewind %d times, want once", len(got))
	}
}

// A rewind to a sequence of a durable with order per key, two couriers
// running as processes (one pinned at a time) on the shared dedup store: every message from the sequence on
// reaches the app once more, each key's in stream order, marked as the
// replay.
func TestRewindToSeqKeepsOrderPerKey(t *testing.T) {
	h := newHarness(t)
	a := &replayApp{}
	app := httptest.NewServer(a)
	t.Cleanup(app.Close)
	envA := h.env(app.URL, "COURIER_ORDER_KEY=header:Order", "COURIER_LOG_LEVEL=info", "COURIER_DEDUP_STORE=shared")
	envB := h.env(app.URL, "COURIER_ORDER_KEY=header:Order", "COURIER_LOG_LEVEL=info", "COURIER_DEDUP_STORE=shared", "COURIER_DEDUP_DIR="+t.TempDir())
	// Each courier a process of its own, as replicas are.
	ca := startChild(t, envA)
	waitReady(t, ca.asCourier())
	startChild(t, envB)
	var seqs []uint64
	for i := range 12 {
		key := []string{"k1", "k2", "k3"}[i%3]
		seqs = append(seqs, h.publish("orders.created", fmt.Sprintf("%s-%d", key, i/3), map[string]string{"Order": key}))
	}
	poll.Until(t, 15*time.Second, "all delivered", func() bool { return a.count() == 12 && h.settled("courier") })

	from := seqs[4]
	if out, err := rewindCLI(envA, "--to-seq", fmt.Sprint(from), "--yes"); err != nil {
		t.Fatalf("rewind: %v\n%s", err, out)
	}
	poll.Until(t, 15*time.Second, "the range delivered again and settled", func() bool { return a.count() == 20 && h.settled("courier") })
	var lastSeq = map[string]uint64{}
	var got []uint64
	for _, c := range a.all()[12:] {
		if c.replay == "" {
			t.Errorf("replayed %q without Courier-Replay", c.body)
		}
		if c.seq <= lastSeq[c.order] {
			t.Errorf("key %s: sequence %d replayed after %d", c.order, c.seq, lastSeq[c.order])
		}
		lastSeq[c.order] = c.seq
		got = append(got, c.seq)
	}
	if want := seqs[4:]; fmt.Sprint(sorted(got)) != fmt.Sprint(want) {
		t.Errorf("replayed sequences %v, want each of %v once", got, want)
	}
}

func sorted(s []uint64) []uint64 {
	out := append([]uint64(nil), s...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// What rewind refuses before it touches anything: a missing or doubled
// point (usage, exit 2), a durable split into partitions whose work stream
// no courier has made yet, and a durable the server cannot reset, said
// plainly.
func TestRewindRefuses(t *testing.T) {
	for _, args := range [][]string{{}, {"--to-seq", "3", "--to-time", "2026-12-01T08:00:00Z"}, {"--to-time", "yesterday"}} {
		_, err := rewindCLI([]string{"NATS_URL=nats://127.0.0.1:1", "COURIER_STREAM=ORDERS"}, args...)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != 2 {
			t.Errorf("rewind %q: %v, want a usage error", args, err)
		}
	}
	// A durable split into partitions before any courier made its work stream.
	h := newHarness(t)
	_, err := rewindCLI(h.env("http://127.0.0.1:1", "COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=2"), "--to-seq", "1", "--yes")
	if err == nil || !strings.Contains(err.Error(), "work stream") {
		t.Errorf("rewind of a partitioned durable: %v", err)
	}
	err = resettable(jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy}, config.Config{Stream: "ORDERS", Consumer: "courier", DeliverPolicy: "new"})
	if err == nil || !strings.Contains(err.Error(), "COURIER_DELIVER_POLICY=new") || !strings.Contains(err.Error(), "COURIER_DELIVER_POLICY=all") {
		t.Errorf("a durable delivering new only: %v", err)
	}
	if err := resettable(jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}, config.Config{}); err != nil {
		t.Errorf("a durable delivering all: %v", err)
	}
	for v, want := range map[string]bool{"2.15.2": true, "2.14.0": true, "2.12.3": false, "1.9.0": false, "3.0.0": true, "2.14.0-beta.1": true} {
		if got := versionAtLeast(v, 2, 14); got != want {
			t.Errorf("versionAtLeast(%q, 2, 14) = %v", v, got)
		}
	}
}

// courier status says how far a rewind has come from the durable's ack
// floor.
func TestRewindProgress(t *testing.T) {
	r := rewind.Record{ID: "r", From: 10, To: 19, At: time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)}
	for floor, want := range map[uint64]string{
		9:  "in progress: none settled yet",
		14: "in progress: settled up to 14 (5 of 10)",
		19: "done",
		25: "done",
	} {
		if got := rewindProgress(r, floor); !strings.HasSuffix(got, want) {
			t.Errorf("ack floor %d: %q, want it to end %q", floor, got, want)
		}
	}
}

// A rewind while a key's message waits out a retry and its later messages
// wait behind it: the key's messages from the rewind's point reach the app
// (answered 2xx) in stream order, each once more.
func TestRewindDuringARetryKeepsOrderPerKey(t *testing.T) {
	h := newHarness(t)
	var failed sync.Once
	var retrying = make(chan struct{})
	a, url := newOrderRecorder(t, func(key string, n, attempt int) (int, string) {
		if key == "k" && n == 2 && attempt == 1 {
			failed.Do(func() { close(retrying) })
			return http.StatusServiceUnavailable, "2"
		}
		return 200, ""
	})
	env := h.env(url, "COURIER_ORDER_KEY=header:Order", "COURIER_LOG_LEVEL=info")
	c := start(t, env)
	var seqs []uint64
	for n := range 5 {
		seqs = append(seqs, h.publish("orders.created", "x", map[string]string{"Order": "k", "N": strconv.Itoa(n)}))
	}
	select {
	case <-retrying:
	case <-time.After(10 * time.Second):
		t.Fatal("k's third message was not tried")
	}
	if out, err := rewindCLI(env, "--to-seq", fmt.Sprint(seqs[1]), "--yes"); err != nil {
		t.Fatalf("rewind: %v\n%s", err, out)
	}
	poll.Until(t, 30*time.Second, "every message settled", func() bool {
		return h.settled("courier") && len(a.delivered("k")) >= 6
	})
	// 0 and 1 before the rewind; then 1 again and 2, 3, 4, each once.
	if got := a.delivered("k"); fmt.Sprint(got) != "[0 1 1 2 3 4]" {
		t.Errorf("k delivered in the order %v, want [0 1 1 2 3 4]", got)
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
}

// A durable made with COURIER_DELIVER_POLICY=new, which the server cannot
// reset: rewind says so and what to do, and changes nothing (exit 1).
func TestRewindOfADurableThatDeliversNewOnly(t *testing.T) {
	h := newHarness(t)
	a := &replayApp{}
	app := httptest.NewServer(a)
	t.Cleanup(app.Close)
	env := h.env(app.URL, "COURIER_LOG_LEVEL=info", "COURIER_DELIVER_POLICY=new")
	c := start(t, env)
	waitReady(t, c)
	h.publish("orders.created", "x", nil)
	poll.Until(t, 10*time.Second, "delivered", func() bool { return a.count() == 1 && h.settled("courier") })
	out, err := rewindCLI(env, "--to-seq", "1", "--yes")
	var ee *exitError
	if err == nil || errors.As(err, &ee) || !strings.Contains(err.Error(), "COURIER_DELIVER_POLICY=all") {
		t.Errorf("rewind of a durable delivering new only: %v (want exit 1 saying what to do)\n%s", err, out)
	}
	if exitCode(err, io.Discard) != 1 {
		t.Errorf("exit %d, want 1", exitCode(err, io.Discard))
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
	if a.count() != 1 {
		t.Errorf("the app saw %d calls, want 1", a.count())
	}
}

// A courier killed in the middle of a rewind's replay of a key whose mark
// (its first unsettled message, written before the rewind) is still in the
// bucket: the courier that takes over still sends the key in stream order.
func TestRewindThroughAKillKeepsOrderPerKey(t *testing.T) {
	h := newHarness(t)
	var failed sync.Once
	retrying := make(chan struct{})
	a, url := newOrderRecorder(t, func(key string, n, attempt int) (int, string) {
		if key == "k" && n == 2 && attempt == 1 {
			failed.Do(func() { close(retrying) })
			return http.StatusServiceUnavailable, "2"
		}
		return 200, ""
	})
	// The replay of k's second message hangs until its courier dies.
	var hung sync.Once
	hanging := make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Courier-Replay") != "" && r.Header.Get("N") == "1" {
			first := false
			hung.Do(func() { first = true; close(hanging) })
			if first {
				select {
				case <-r.Context().Done():
				case <-time.After(5 * time.Second): // its courier is gone by then
				}
				return
			}
		}
		proxyTo(w, r, url)
	}))
	t.Cleanup(app.Close)
	env := h.env(app.URL, "COURIER_ORDER_KEY=header:Order", "COURIER_ACK_WAIT=2s", "COURIER_LOG_LEVEL=info")
	ch := startChild(t, env)
	var seqs []uint64
	for n := range 5 {
		seqs = append(seqs, h.publish("orders.created", "x", map[string]string{"Order": "k", "N": strconv.Itoa(n)}))
	}
	select {
	case <-retrying:
	case <-time.After(15 * time.Second):
		t.Fatal("k's third message was not tried")
	}
	if out, err := rewindCLI(env, "--to-seq", fmt.Sprint(seqs[1]), "--yes"); err != nil {
		t.Fatalf("rewind: %v\n%s", err, out)
	}
	select {
	case <-hanging:
	case <-time.After(15 * time.Second):
		t.Fatal("the replay of k's second message did not come")
	}
	ch.kill(t)
	c := start(t, env)
	poll.Until(t, 30*time.Second, "every message settled", func() bool {
		return h.settled("courier") && len(a.delivered("k")) >= 6
	})
	if got := a.delivered("k"); fmt.Sprint(got) != "[0 1 1 2 3 4]" {
		t.Errorf("k delivered in the order %v, want [0 1 1 2 3 4]", got)
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
}

// proxyTo forwards r to the app at url and copies its answer to w.
func proxyTo(w http.ResponseWriter, r *http.Request, url string) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, url, r.Body)
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
}
