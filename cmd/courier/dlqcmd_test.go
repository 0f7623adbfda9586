package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/poll"
)

// cliResult is what one `courier dlq ...` run printed and its exit status.
type cliResult struct {
	stdout, stderr string
	code           int
}

// dlqCLI runs `courier dlq args...` in-process against h's server, in the
// sidecar's environment without COURIER_APP_URL (extra "K=V" entries
// override).
func (h *harness) dlqCLI(extra []string, args ...string) cliResult {
	h.t.Helper()
	var environ []string
	for _, kv := range h.env("", extra...) {
		if !strings.HasPrefix(kv, "COURIER_APP_URL=") {
			environ = append(environ, kv)
		}
	}
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, append([]string{"dlq"}, args...), environ, &stdout, &stderr)
	code := exitCode(err, &stderr)
	return cliResult{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// dlq runs dlqCLI with no extra environment.
func (h *harness) dlq(args ...string) cliResult {
	h.t.Helper()
	return h.dlqCLI(nil, args...)
}

// want fails the test unless the run exited with code and printed stdout
// containing each of outs.
func (r cliResult) want(t *testing.T, code int, outs ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
	for _, o := range outs {
		if !strings.Contains(r.stdout, o) {
			t.Errorf("stdout lacks %q:\n%s", o, r.stdout)
		}
	}
}

// rows returns the table rows of `dlq ls` (the header left out).
func (r cliResult) rows() []string {
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "SEQ") {
		return nil
	}
	return lines[1:]
}

// deadLetterSeqs returns the sequences of the dead letters on the subject.
func (h *harness) deadLetterSeqs() []uint64 {
	var out []uint64
	for _, m := range h.deadLetters(dlqSubject) {
		out = append(out, m.Sequence)
	}
	return out
}

// deadLettered runs courier with an app answering status to every request
// until n dead letters are stored and the consumer settled, then stops it.
func (h *harness) deadLettered(n, status int, extra ...string) *app {
	h.t.Helper()
	a := newApp(h.t, func(w http.ResponseWriter, r *http.Request, _ int) { w.WriteHeader(status) })
	c := start(h.t, h.env(a.URL, extra...))
	poll.Until(h.t, 15*time.Second, strconv.Itoa(n)+" dead letters", func() bool { return len(h.deadLetters(dlqSubject)) == n })
	poll.Until(h.t, 15*time.Second, "the originals terminated", func() bool { return h.settled("courier") })
	if err := c.stop(); err != nil {
		h.t.Fatalf("courier: %v", err)
	}
	return a
}

// appHeaders are the headers the app got that came from the message: the
// Courier-* ones, set per delivery, and Go's own left out.
func appHeaders(r request) http.Header {
	out := http.Header{}
	for k, v := range r.Header {
		switch {
		case strings.HasPrefix(k, "Courier-"), k == "Content-Length", k == "Accept-Encoding", k == "User-Agent":
		default:
			out[k] = v
		}
	}
	return out
}

func TestDLQReplayRestoresWhatTheAppGets(t *testing.T) {
	// A short duplicate window, so that the original's Nats-Msg-Id stops
	// blocking its republish soon.
	h := newHarness(t, func(c *jetstream.StreamConfig) { c.Duplicates = time.Second })
	body := "{\"id\":1}\x00\xff binary"
	h.publish("orders.created", body, map[string]string{
		"Content-Type": "application/json",
		"X-Tenant":     "acme",
		"traceparent":  "00-abc-def-01",
		"Nats-Msg-Id":  "order-1",
	})
	h.publish("orders.eu.paid", "no id", map[string]string{"X-Tenant": "globex"})
	rejecting := h.deadLettered(2, http.StatusUnprocessableEntity)
	first := rejecting.requests()
	published := time.Now()

	// Past the original's duplicate window and the server's timer that
	// forgets it: nothing to poll, the server forgets an id only when that
	// timer fires, which a loaded machine can run late.
	time.Sleep(time.Until(published.Add(2 * time.Second)))
	res := h.dlq("replay")
	res.want(t, 0, "replayed 2, kept 0 (duplicate window), failed 0")
	if n := len(h.deadLetters(dlqSubject)); n != 0 {
		t.Errorf("%d dead letters left after replay, want 0", n)
	}
	if !strings.Contains(res.stderr, "replayed ") || !strings.Contains(res.stderr, "to orders.created") {
		t.Errorf("no progress line per dead letter on stderr:\n%s", res.stderr)
	}

	accepting := newApp(t, nil)
	start(t, h.env(accepting.URL))
	poll.Until(t, 15*time.Second, "the replayed messages at the app", func() bool { return accepting.count() == 2 })
	poll.Until(t, 15*time.Second, "the replayed messages acked", func() bool { return h.settled("courier") })
	second := accepting.requests()

	for _, want := range first {
		i := slices.IndexFunc(second, func(r request) bool { return r.Body == want.Body })
		if i < 0 {
			t.Errorf("the app never got %q again", want.Body)
			continue
		}
		got := second[i]
		// "no id" had its key derived from its stream position, which
		// the republish changes: replay carries the derived key in
		// Idempotency-Key, so the app sees the same key (issue #16).
		wantH, gotH := appHeaders(want), appHeaders(got)
		if wantH.Get("Idempotency-Key") == "" {
			t.Errorf("%q: the app got no Idempotency-Key", want.Body)
		}
		if !equalHeaders(wantH, gotH) {
			t.Errorf("%q: the app got headers\n%v\nthe first time and\n%v\nafter replay", want.Body, wantH, gotH)
		}
		if got.Header.Get("Courier-Subject") != want.Header.Get("Courier-Subject") || got.Header.Get("Courier-Attempt") != "1" {
			t.Errorf("%q: replayed to %s (attempt %s), want %s, attempt 1", want.Body,
				got.Header.Get("Courier-Subject"), got.Header.Get("Courier-Attempt"), want.Header.Get("Courier-Subject"))
		}
	}
	if h.streamMsgs() != 4 {
		t.Errorf("ORDERS holds %d messages, want the 2 originals and 2 republished", h.streamMsgs())
	}
}

func equalHeaders(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func TestDLQListShowBesideLiveSidecar(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		if r.Header.Get("Courier-Subject") == "orders.created" {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	h.publish("orders.created", "created body", map[string]string{"X-Tenant": "acme", "Nats-Msg-Id": "c-1"})
	h.publish("orders.eu.paid", "eu", nil)
	h.publish("orders.us.paid", "us", nil)
	c := start(t, h.env(a.URL, "COURIER_MAX_DELIVER=2"))
	poll.Until(t, 15*time.Second, "3 dead letters", func() bool { return len(h.deadLetters(dlqSubject)) == 3 })
	// Another consumer's dead letter on the same subject is not ours.
	if _, err := dlq.NewPublisher(h.js, dlqSubject).Publish(context.Background(), dlq.Letter{
		Subject: "orders.created", Stream: "ORDERS", Sequence: 99, Consumer: "other", Reason: dlq.ReasonRejected,
	}); err != nil {
		t.Fatal(err)
	}
	// With the live sidecar's admin address and dedup directory: the dlq
	// commands open neither.
	live := []string{"COURIER_ADMIN_ADDR=" + adminAddr(t, c)}

	res := h.dlqCLI(live, "ls")
	res.want(t, 0, "SEQ", "TIME", "REASON", "STATUS", "SUBJECT", "ATTEMPTS", "ERROR")
	if rows := res.rows(); len(rows) != 3 {
		t.Fatalf("ls shows %d rows, want 3:\n%s", len(rows), res.stdout)
	}
	rows := res.rows()
	i := slices.IndexFunc(rows, func(r string) bool { return strings.Contains(r, "orders.created") })
	// SEQ ORIG_STREAM ORIG_SEQ TIME REASON STATUS SUBJECT ATTEMPTS ERROR
	if f := strings.Fields(rows[max(i, 0)]); i < 0 || len(f) < 8 || f[1] != "ORDERS" || f[2] != "1" || f[4] != "rejected" || f[5] != "422" || f[7] != "1" {
		t.Errorf("ls rows = %q, want one of ORDERS 1 rejected 422 orders.created 1", rows)
	}
	createdSeq := strings.Fields(rows[max(i, 0)])[0]

	for _, tt := range []struct {
		args []string
		want int
	}{
		{[]string{"--reason", "rejected"}, 1},
		{[]string{"--reason", "exhausted"}, 2},
		{[]string{"--reason", "expired"}, 0},
		{[]string{"--subject", "orders.*.paid"}, 2},
		{[]string{"--subject", "orders.>"}, 3},
		{[]string{"--subject", "orders.created", "--reason", "exhausted"}, 0},
		{[]string{"--since", "1h"}, 3},
		{[]string{"--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}, 0},
		{[]string{"--since", time.Now().Add(-time.Hour).Format(time.RFC3339Nano)}, 3},
	} {
		res := h.dlqCLI(live, append([]string{"ls"}, tt.args...)...)
		res.want(t, 0)
		if n := len(res.rows()); n != tt.want {
			t.Errorf("ls %q: %d rows, want %d:\n%s", tt.args, n, tt.want, res.stdout)
		}
	}

	res = h.dlqCLI(live, "ls", "--json", "--subject", "orders.*.paid")
	res.want(t, 0)
	var objs []map[string]any
	for line := range strings.Lines(res.stdout) {
		var o map[string]any
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			t.Fatalf("ls --json line %q: %v", line, err)
		}
		objs = append(objs, o)
	}
	if len(objs) != 2 {
		t.Fatalf("ls --json: %d objects, want 2:\n%s", len(objs), res.stdout)
	}
	if objs[0]["subject"] != "orders.eu.paid" {
		objs[0], objs[1] = objs[1], objs[0]
	}
	if o := objs[0]; o["reason"] != "exhausted" || o["status"] != float64(503) || o["subject"] != "orders.eu.paid" ||
		o["attempts"] != float64(2) || o["stream"] != "ORDERS" || o["consumer"] != "courier" || o["body"] != "eu" {
		t.Errorf("ls --json object = %v", o)
	}

	seq, _ := strconv.ParseUint(createdSeq, 10, 64)
	res = h.dlqCLI(live, "show", createdSeq)
	res.want(t, 0, "rejected", "422", "orders.created", "X-Tenant: acme", "Nats-Msg-Id: c-1", "created body")
	res = h.dlqCLI(live, "show", "--json", createdSeq)
	res.want(t, 0)
	var o struct {
		Seq     uint64              `json:"seq"`
		Headers map[string][]string `json:"headers"`
		Body    string              `json:"body"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &o); err != nil || o.Seq != seq || o.Body != "created body" ||
		!slices.Equal(o.Headers["X-Tenant"], []string{"acme"}) {
		t.Errorf("show --json = %+v (%v):\n%s", o, err, res.stdout)
	}
	// The same dead letter by its original's sequence in ORDERS.
	res = h.dlqCLI(live, "show", "--original", "1")
	res.want(t, 0, "Dead letter "+createdSeq+" ", "rejected", "created body")
	h.dlqCLI(live, "show", "--original", "99").want(t, 1) // another consumer's
	res = h.dlqCLI(live, "ls", "--reason", "bogus")
	res.want(t, 2)
	for _, r := range dlq.Reasons() {
		if !strings.Contains(res.stderr, r) {
			t.Errorf("ls --reason bogus: stderr does not list %q:\n%s", r, res.stderr)
		}
	}
	h.dlqCLI(live, "show", "99999").want(t, 1)
	h.dlqCLI(live, "show").want(t, 2)
	h.dlqCLI(live, "show", "abc").want(t, 2)
	h.dlqCLI(live, "ls", "--since", "yesterday").want(t, 2)
	h.dlqCLI(live, "ls", "--subject", "orders.>.x").want(t, 2)

	// The sidecar kept running throughout.
	if _, exited := c.exited(0); exited {
		t.Errorf("the sidecar stopped")
	}
}

func TestDLQReplayDryRunAndLimit(t *testing.T) {
	h := newHarness(t)
	for i := range 3 {
		h.publish("orders.created", strconv.Itoa(i), nil)
	}
	h.deadLettered(3, http.StatusBadRequest)
	before := h.deadLetterSeqs()

	res := h.dlq("replay", "--dry-run")
	res.want(t, 0, "dry run: would replay 3, nothing changed")
	if n := strings.Count(res.stdout, "would replay "); n != 4 { // 3 lines of the plan and the summary
		t.Errorf("dry run: the plan on stdout has %d lines, want 3:\n%s", n-1, res.stdout)
	}
	if got := h.deadLetterSeqs(); !slices.Equal(got, before) || h.streamMsgs() != 3 {
		t.Fatalf("dry run changed something: dead letters %v (was %v), %d originals", got, before, h.streamMsgs())
	}

	h.dlq("replay", "--limit", "2").want(t, 0, "replayed 2, kept 0 (duplicate window), failed 0")
	if got := h.deadLetterSeqs(); !slices.Equal(got, before[2:]) || h.streamMsgs() != 5 {
		t.Errorf("after --limit 2: dead letters %v, want %v; %d messages in ORDERS, want 5", got, before[2:], h.streamMsgs())
	}

	h.dlq("replay", "--rate", "fast").want(t, 2)
	h.dlq("replay", "--limit", "-1").want(t, 2)
	h.dlq("replay", "--rate", "50").want(t, 0, "replayed 1, kept 0 (duplicate window), failed 0")
	h.dlq("replay").want(t, 0, "replayed 0, kept 0 (duplicate window), failed 0")
	if n := len(h.deadLetters(dlqSubject)); n != 0 || h.streamMsgs() != 6 {
		t.Errorf("%d dead letters, %d messages in ORDERS; want 0 and 6", n, h.streamMsgs())
	}
}

func TestDLQReplayAfterInterruptedReplay(t *testing.T) {
	h := newHarness(t, func(c *jetstream.StreamConfig) { c.Duplicates = time.Second })
	h.publish("orders.created", "once", map[string]string{"Nats-Msg-Id": "order-1"})
	h.publish("orders.created", "once too", nil)
	h.deadLettered(2, http.StatusBadRequest)
	// The originals' ids forgotten: window 1s, and the server forgets an id
	// only when its timer fires, late on a loaded machine.
	time.Sleep(2 * time.Second)

	// An earlier replay republished both and was killed before removing
	// either dead letter.
	q, err := dlq.Open(context.Background(), h.js, dlqSubject)
	if err != nil {
		t.Fatal(err)
	}
	letters, err := q.List(context.Background(), dlq.Selection{})
	if err != nil || len(letters) != 2 {
		t.Fatalf("List = %d, %v", len(letters), err)
	}
	for _, d := range letters {
		if _, err := h.js.PublishMsg(context.Background(), d.Republish("Idempotency-Key")); err != nil {
			t.Fatal(err)
		}
	}

	res := h.dlq("replay")
	res.want(t, 0, "replayed 2, kept 0 (duplicate window), failed 0")
	if strings.Count(res.stderr, "earlier, interrupted replay") != 2 {
		t.Errorf("stderr does not say both were republished earlier:\n%s", res.stderr)
	}
	if n := len(h.deadLetters(dlqSubject)); n != 0 {
		t.Errorf("%d dead letters left, want 0", n)
	}
	if n := h.streamMsgs(); n != 4 {
		t.Errorf("ORDERS holds %d messages, want the 2 originals and one copy each", n)
	}

	a := newApp(t, nil)
	start(t, h.env(a.URL))
	poll.Until(t, 15*time.Second, "the copies delivered", func() bool { return h.settled("courier") && a.count() >= 2 })
	var bodies []string
	for _, r := range a.requests() {
		bodies = append(bodies, r.Body)
	}
	slices.Sort(bodies)
	if !slices.Equal(bodies, []string{"once", "once too"}) {
		t.Errorf("the app got %q, want each message once", bodies)
	}
}

func TestDLQReplayKeepsDuplicateOfOriginal(t *testing.T) {
	h := newHarness(t) // the default 2-minute duplicate window
	h.publish("orders.created", "x", map[string]string{"Nats-Msg-Id": "order-1"})
	h.deadLettered(1, http.StatusBadRequest)
	before := h.deadLetterSeqs()

	res := h.dlq("replay")
	res.want(t, 1, "replayed 0, kept 1 (duplicate window), failed 0")
	if !strings.Contains(res.stderr, "duplicate window") || !strings.Contains(res.stderr, "retry after ") {
		t.Errorf("stderr does not say when to retry:\n%s", res.stderr)
	}
	if got := h.deadLetterSeqs(); !slices.Equal(got, before) || h.streamMsgs() != 1 {
		t.Errorf("dead letters %v (want %v kept), %d messages in ORDERS (want 1)", got, before, h.streamMsgs())
	}
}

func TestDLQPurge(t *testing.T) {
	h := newHarness(t)
	h.publish("orders.created", "a", nil)
	h.publish("orders.paid", "b", nil)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		if r.Header.Get("Courier-Subject") == "orders.paid" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusBadRequest)
	})
	c := start(t, h.env(a.URL, "COURIER_MAX_DELIVER=1"))
	poll.Until(t, 15*time.Second, "2 dead letters", func() bool { return len(h.deadLetters(dlqSubject)) == 2 })
	c.stop()

	res := h.dlq("purge")
	res.want(t, 2)
	if !strings.Contains(res.stderr, "--yes") || len(h.deadLetters(dlqSubject)) != 2 {
		t.Errorf("purge without --yes: stderr %q, %d dead letters left (want 2)", res.stderr, len(h.deadLetters(dlqSubject)))
	}
	h.dlq("purge", "--reason", "exhausted", "--yes").want(t, 0, "purged 1, failed 0")
	left := h.deadLetters(dlqSubject)
	if len(left) != 1 || left[0].Header.Get(dlq.HeaderReason) != "rejected" {
		t.Errorf("after purging exhausted: %d left", len(left))
	}
	h.dlq("purge", "--yes", strconv.FormatUint(left[0].Sequence, 10)).want(t, 0, "purged 1, failed 0")
	h.dlq("purge", "--yes", strconv.FormatUint(left[0].Sequence, 10)).want(t, 1, "purged 0, failed 0")
	// A sequence given twice is one dead letter, counted once as missing.
	seq := strconv.FormatUint(left[0].Sequence, 10)
	if res := h.dlq("purge", "--yes", seq, seq); !strings.Contains(res.stderr, "1 of the 1 sequences given") {
		t.Errorf("purge of a sequence given twice: stderr %q, want it counted once", res.stderr)
	}
	if n := len(h.deadLetters(dlqSubject)); n != 0 {
		t.Errorf("%d dead letters left, want 0", n)
	}
}

func TestDLQUsageAndSetupErrors(t *testing.T) {
	h := newHarness(t)
	res := h.dlq("help")
	for _, r := range dlq.Reasons() {
		if !strings.Contains(res.stdout, r) {
			t.Errorf("dlq help does not list the reason %q", r)
		}
	}
	h.dlq().want(t, 2)
	h.dlq("bogus").want(t, 2)
	h.dlq("ls", "extra").want(t, 2)
	h.dlq("ls", "--no-such-flag").want(t, 2)
	h.dlq("help").want(t, 0, "courier dlq replay")
	h.dlqCLI([]string{"COURIER_STREAM="}, "ls").want(t, 2)
	h.dlq("ls", "--reason", "bogus").want(t, 2) // before connecting
	// No sidecar ever ran: no stream captures the dead-letter subject.
	res = h.dlq("ls")
	res.want(t, 1)
	if !strings.Contains(res.stderr, "no stream captures the dead-letter subject") {
		t.Errorf("stderr = %q", res.stderr)
	}
}

func TestDLQDepthGauge(t *testing.T) {
	// The gauge is served once the dead-letter stream has answered: -1 until then.
	deadLettersStored := func(t *testing.T, admin string) float64 {
		v, ok := metricstest.Lookup(t, metrics(admin), "courier_dead_letters_stored")
		if !ok {
			return -1
		}
		return v
	}
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, _ int) { w.WriteHeader(http.StatusBadRequest) })
	c := start(t, h.env(a.URL))
	admin := adminAddr(t, c)
	poll.Until(t, 15*time.Second, "courier_dead_letters_stored 0", func() bool { return deadLettersStored(t, admin) == 0 })
	h.publish("orders.created", "a", nil)
	h.publish("orders.created", "b", nil)
	poll.Until(t, 15*time.Second, "courier_dead_letters_stored 2", func() bool { return deadLettersStored(t, admin) == 2 })
	h.dlq("purge", "--yes", "--limit", "1").want(t, 0, "purged 1, failed 0")
	poll.Until(t, 15*time.Second, "courier_dead_letters_stored 1", func() bool { return deadLettersStored(t, admin) == 1 })
}

// A long replay reports progress on stderr, besides its line per dead
// letter.
func TestDLQReplayProgress(t *testing.T) {
	h := newHarness(t)
	if _, _, err := dlq.EnsureStream(context.Background(), h.js, dlqSubject, 1); err != nil {
		t.Fatal(err)
	}
	p := dlq.NewPublisher(h.js, dlqSubject)
	const n = 2*replayProgressEvery + 10
	for i := range n {
		if err := p.DeadLetter(context.Background(), dlq.Letter{
			Subject: "orders.created", Data: []byte(strconv.Itoa(i)), Stream: "ORDERS", Sequence: uint64(1000 + i),
			Consumer: "courier", Reason: dlq.ReasonRejected, Attempts: 1,
		}); err != nil {
			t.Fatal(err)
		}
	}
	res := h.dlq("replay")
	res.want(t, 0, "replayed "+strconv.Itoa(n)+", kept 0")
	for _, want := range []string{"progress: 100 handled so far: replayed 100, kept 0, failed 0", "progress: 200 handled so far"} {
		if !strings.Contains(res.stderr, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
}

// A filter given with an empty value ("--reason \"$R\"" with R unset) is a
// mistake to report, not "no filter": purge would delete every dead letter.
func TestDLQPurgeEmptyFilterRefused(t *testing.T) {
	h := newHarness(t)
	h.publish("orders.created", "a", nil)
	h.publish("orders.paid", "b", nil)
	h.deadLettered(2, http.StatusBadRequest, "COURIER_MAX_DELIVER=1")
	for _, flag := range []string{"--reason", "--subject", "--since"} {
		for _, v := range []string{"", " "} {
			res := h.dlq("purge", flag, v, "--yes")
			if n := len(h.deadLetters(dlqSubject)); res.code != 2 || n != 2 {
				t.Fatalf("purge %s %q --yes: exit status %d, %d dead letters left; want 2 (usage) and both kept\nstdout: %s",
					flag, v, res.code, n, res.stdout)
			}
		}
	}
}
