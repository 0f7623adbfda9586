package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/courierhq/courier/internal/poll"
	"github.com/nats-io/nats.go/jetstream"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// whsec returns a fresh Standard Webhooks secret as the file lists it.
func whsec(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// replaceFile writes content to path in one rename, as a Kubernetes Secret
// volume updates (courier never reads half a file).
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// signers returns which of secrets verify a request the app received (the
// Standard Webhooks Go library deciding), as a string of their indices.
func signers(t *testing.T, r request, secrets ...string) string {
	t.Helper()
	var ok []string
	for i, s := range secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			t.Fatal(err)
		}
		if wh.Verify([]byte(r.Body), r.Header) == nil {
			ok = append(ok, strconv.Itoa(i))
		}
	}
	return strings.Join(ok, "+")
}

// noSecret fails t if text holds a secret (encoded or decoded) or a token.
func noSecret(t *testing.T, what, text string, secrets []string, tokens ...string) {
	t.Helper()
	for _, s := range secrets {
		enc := strings.TrimPrefix(s, "whsec_")
		key, _ := base64.StdEncoding.DecodeString(enc)
		if strings.Contains(text, enc) || bytes.Contains([]byte(text), key) {
			t.Errorf("%s holds a signing secret", what)
		}
	}
	for _, tok := range tokens {
		if strings.Contains(text, tok) {
			t.Errorf("%s holds the token %q", what, tok)
		}
	}
}

// TestRotationWhileMessagesFlow: secrets are rotated (a new one added, then
// the old removed) and the token changed while messages flow, without a
// restart: every request verifies with exactly the secrets the file listed
// when it was sent (the sets follow one another, never back), carries
// webhook-id = Idempotency-Key and the token of the moment; every message is
// delivered; neither the secrets nor the tokens reach the logs.
func TestRotationWhileMessagesFlow(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	secretsFile, tokenFile := filepath.Join(dir, "secrets"), filepath.Join(dir, "token")
	oldS, newS := whsec(t), whsec(t)
	replaceFile(t, secretsFile, oldS+"\n")
	replaceFile(t, tokenFile, "token-one\n")
	a := newApp(t, nil)
	// One request at a time: the order the app sees is the order of signing.
	c := start(t, h.env(a.URL, "COURIER_SIGNING_SECRETS_FILE="+secretsFile, "COURIER_APP_TOKEN_FILE="+tokenFile,
		"COURIER_MAX_INFLIGHT=1"))

	var published atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			h.publish("orders.new", `{"n":`+strconv.Itoa(i)+`}`, nil)
			published.Add(1)
		}
	})
	stopPublishing := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopPublishing()

	last := func() request {
		reqs := a.requests()
		if len(reqs) == 0 {
			return request{}
		}
		return reqs[len(reqs)-1]
	}
	poll.Until(t, 15*time.Second, "requests signed with the old secret", func() bool { return signers(t, last(), oldS, newS) == "0" })
	replaceFile(t, secretsFile, newS+"\n"+oldS+"\n")
	poll.Until(t, 15*time.Second, "requests signed with both secrets", func() bool { return signers(t, last(), oldS, newS) == "0+1" })
	replaceFile(t, tokenFile, "token-two")
	poll.Until(t, 15*time.Second, "the new token", func() bool { return last().Header.Get("Authorization") == "Bearer token-two" })
	replaceFile(t, secretsFile, newS+"\n")
	poll.Until(t, 15*time.Second, "requests signed with the new secret only", func() bool { return signers(t, last(), oldS, newS) == "1" })
	stopPublishing()
	poll.Until(t, 30*time.Second, "every message delivered and acked", func() bool { return h.settled("courier") })

	// The sets of secrets the requests verify with, in order: old, both,
	// new, each for a run of requests, never one of them again later.
	var runs []string
	tokens := map[string]bool{}
	for i, r := range a.requests() {
		s := signers(t, r, oldS, newS)
		if s == "" {
			t.Fatalf("request %d verifies with neither secret: %v", i+1, r.Header)
		}
		if len(runs) == 0 || runs[len(runs)-1] != s {
			runs = append(runs, s)
		}
		if id, key := r.Header.Get("Webhook-Id"), r.Header.Get("Idempotency-Key"); id != key {
			t.Errorf("request %d: webhook-id %q, Idempotency-Key %q", i+1, id, key)
		}
		tokens[r.Header.Get("Authorization")] = true
	}
	if want := []string{"0", "0+1", "1"}; !slices.Equal(runs, want) {
		t.Errorf("secrets per request, in order: %v, want %v", runs, want)
	}
	if len(tokens) != 2 || !tokens["Bearer token-one"] || !tokens["Bearer token-two"] {
		t.Errorf("Authorization headers seen: %v", tokens)
	}
	if n := a.count(); int64(n) < published.Load() {
		t.Errorf("%d requests for %d messages", n, published.Load())
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	noSecret(t, "the logs", c.logs.String(), []string{oldS, newS}, "token-one", "token-two")
	if n := strings.Count(c.logs.String(), "COURIER_SIGNING_SECRETS_FILE changed"); n != 2 {
		t.Errorf("%d log lines say the secrets changed, want 2", n)
	}
}

// TestProbesAndRepliesSigned: the health URL's probes, the breaker's probes
// (deliveries sent while it is open) and request/reply calls are signed and
// carry the token, as deliveries are.
func TestProbesAndRepliesSigned(t *testing.T) {
	h := newHarness(t)
	secret := whsec(t)
	dir := t.TempDir()
	secretsFile, tokenFile := filepath.Join(dir, "secrets"), filepath.Join(dir, "token")
	replaceFile(t, secretsFile, secret+"\n")
	replaceFile(t, tokenFile, "probe-token")
	var failing atomic.Bool
	failing.Store(true)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.URL.Path == "/messages" && failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	c := start(t, h.env(a.URL+"/messages", "COURIER_APP_HEALTH_URL="+a.URL+"/healthz",
		"COURIER_SIGNING_SECRETS_FILE="+secretsFile, "COURIER_APP_TOKEN_FILE="+tokenFile,
		"COURIER_REPLY_SUBJECTS=quote.get", "COURIER_BREAKER_FAILURES=3", "COURIER_BREAKER_PROBE=100ms",
		"COURIER_MAX_DELIVER=100"))
	admin := adminAddr(t, c)
	poll.Until(t, 15*time.Second, "ready", func() bool { code, _ := get(t, "http://"+admin+"/readyz"); return code == 200 })

	for i := range 5 {
		h.publish("orders.new", "order "+strconv.Itoa(i), nil)
	}
	poll.Until(t, 15*time.Second, "the breaker open", func() bool { return strings.Contains(c.logs.String(), "breaker open") })
	opened := a.count()
	poll.Until(t, 15*time.Second, "probes while the breaker is open", func() bool { return a.count() >= opened+2 })
	failing.Store(false)
	poll.Until(t, 15*time.Second, "every message delivered", func() bool { return h.settled("courier") })

	resp, err := h.nc.Request("quote.get", []byte(`{"sku":"A1"}`), 5*time.Second)
	if err != nil || resp.Header.Get("Courier-Status") != "200" {
		t.Fatalf("reply: %v %v", err, resp)
	}

	kinds := map[string]int{}
	for i, r := range a.requests() {
		kind := "delivery"
		switch {
		case r.Header.Get("Courier-Stream") == "" && r.Body == "":
			kind = "health probe"
		case r.Header.Get("Courier-Stream") == "":
			kind = "request/reply"
		case i >= opened:
			kind = "delivery while the breaker was open"
		}
		kinds[kind]++
		if signers(t, r, secret) != "0" {
			t.Errorf("%s (request %d) does not verify: %v", kind, i+1, r.Header)
		}
		if got := r.Header.Get("Authorization"); got != "Bearer probe-token" {
			t.Errorf("%s (request %d): Authorization %q", kind, i+1, got)
		}
	}
	for _, k := range []string{"health probe", "request/reply", "delivery", "delivery while the breaker was open"} {
		if kinds[k] == 0 {
			t.Errorf("no %s seen (requests: %v)", k, kinds)
		}
	}
	_ = c.stop()
}

// TestBadSecretsFileExit2: a bad secret line, an empty token file or a
// missing secrets file is invalid configuration: exit 2 through run, one
// line naming the variable and the problem (never the content), and
// nothing consumed; `courier config` says the same.
func TestBadSecretsFileExit2(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	good := whsec(t)
	bad := filepath.Join(dir, "bad")
	replaceFile(t, bad, good+"\nwhsec_c2hvcnQ=\n")
	empty := filepath.Join(dir, "empty")
	replaceFile(t, empty, "\n")
	h.publish("orders.new", "order 1", nil)
	a := newApp(t, nil)

	for _, tt := range []struct {
		name string
		env  []string
		want string
	}{
		{"bad line", []string{"COURIER_SIGNING_SECRETS_FILE=" + bad}, "COURIER_SIGNING_SECRETS_FILE=" + bad + ": line 2: a secret of 5 bytes"},
		{"empty token", []string{"COURIER_APP_TOKEN_FILE=" + empty}, "COURIER_APP_TOKEN_FILE=" + empty + ": the file is empty"},
		{"missing", []string{"COURIER_SIGNING_SECRETS_FILE=" + filepath.Join(dir, "none")}, `COURIER_SIGNING_SECRETS_FILE="` + filepath.Join(dir, "none") + `": cannot read the file`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, args := range [][]string{nil, {"config"}} {
				var stdout, stderr bytes.Buffer
				err := run(context.Background(), args, h.env(a.URL, tt.env...), &stdout, &stderr)
				var line strings.Builder
				if code := exitCode(err, &line); code != 2 || !strings.Contains(line.String(), "invalid configuration") || !strings.Contains(line.String(), tt.want) {
					t.Errorf("%v: exit %d: %s\nwant 2 and %q", args, code, line.String(), tt.want)
				}
				noSecret(t, "the output", stdout.String()+stderr.String()+line.String(), []string{good})
			}
		})
	}
	if h.consumerInfo("courier") != nil || a.count() != 0 {
		t.Errorf("a consumer was created or the app called (%d requests) with invalid configuration", a.count())
	}
}

// TestConfigShowsNoSecret: `courier config` with valid files shows their
// paths, never what they hold.
func TestConfigShowsNoSecret(t *testing.T) {
	dir := t.TempDir()
	secret := whsec(t)
	secretsFile, tokenFile := filepath.Join(dir, "secrets"), filepath.Join(dir, "token")
	replaceFile(t, secretsFile, secret+"\n")
	replaceFile(t, tokenFile, "config-token\n")
	var stdout, stderr bytes.Buffer
	env := []string{"COURIER_STREAM=ORDERS", "COURIER_APP_URL=http://127.0.0.1:1/", "COURIER_CLOUDEVENTS=binary",
		"COURIER_SIGNING_SECRETS_FILE=" + secretsFile, "COURIER_APP_TOKEN_FILE=" + tokenFile}
	if err := run(context.Background(), []string{"config"}, env, &stdout, &stderr); err != nil {
		t.Fatalf("courier config: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{secretsFile, tokenFile, "binary"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("courier config does not show %q", want)
		}
	}
	noSecret(t, "courier config's output", stdout.String()+stderr.String(), []string{secret}, "config-token")
}

// ceApp is an app that reads each request with the CloudEvents Go SDK,
// as a Knative or Dapr app would, and answers as answer says.
type ceApp struct {
	*httptest.Server
	mu     sync.Mutex
	events map[string]*event.Event // by the message's body
	errs   map[string]error
	heads  map[string]http.Header
}

func newCEApp(t *testing.T, answer func(w http.ResponseWriter, body string)) *ceApp {
	t.Helper()
	a := &ceApp{events: map[string]*event.Event{}, errs: map[string]error{}, heads: map[string]http.Header{}}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		ev, err := cehttp.NewEventFromHTTPRequest(r)
		if err == nil {
			err = ev.Validate()
		}
		a.mu.Lock()
		a.events[string(body)], a.errs[string(body)], a.heads[string(body)] = ev, err, r.Header.Clone()
		a.mu.Unlock()
		answer(w, string(body))
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *ceApp) got(body string) (*event.Event, http.Header, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.events[body], a.heads[body], a.errs[body]
}

// TestCloudEventsDelivery: with COURIER_CLOUDEVENTS=binary the app's SDK
// reads each delivery as an event: courier's attributes for a plain
// message, the publisher's for a binary CloudEvent, the body's for a
// structured one. The dead letter of the binary one keeps its attributes as
// published, and the success record of the plain one is the app's answer
// with its own ce-* headers; neither holds a signature or the token. Off,
// a request carries no ce-* header.
func TestCloudEventsDelivery(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	secretsFile, tokenFile := filepath.Join(dir, "secrets"), filepath.Join(dir, "token")
	replaceFile(t, secretsFile, whsec(t)+"\n")
	replaceFile(t, tokenFile, "ce-token")
	const plain, binary, structured = `{"n":1}`, `{"n":2}`, `{"specversion":"1.0","id":"evt-3","source":"/shop","type":"order.paid","data":{"n":3}}`
	a := newCEApp(t, func(w http.ResponseWriter, body string) {
		if body == binary {
			w.WriteHeader(http.StatusBadRequest) // dead-lettered
			return
		}
		w.Header().Set("Ce-Specversion", "1.0")
		w.Header().Set("Ce-Id", "answer-1")
		w.Header().Set("Ce-Type", "order.accepted")
		w.Header().Set("Ce-Source", "/orders-app")
		_, _ = w.Write([]byte(`{"accepted":true}`))
	})
	c := start(t, h.env(a.URL, "COURIER_CLOUDEVENTS=binary", "COURIER_SUCCESS_SUBJECT=ok.results",
		"COURIER_SIGNING_SECRETS_FILE="+secretsFile, "COURIER_APP_TOKEN_FILE="+tokenFile))
	seq := h.publish("orders.created", plain, map[string]string{"Nats-Msg-Id": "m1", "Content-Type": "application/json"})
	h.publish("orders.created", binary, map[string]string{"ce-specversion": "1.0", "ce-id": "evt-2",
		"ce-source": "https://shop.example/", "ce-type": "com.shop.order.created", "Content-Type": "application/json"})
	h.publish("orders.paid", structured, map[string]string{"Content-Type": "application/cloudevents+json"})
	poll.Until(t, 15*time.Second, "every message settled", func() bool { return h.settled("courier") && len(h.deadLetters("dlq.ORDERS.courier")) == 1 })

	ev, _, err := a.got(plain)
	if err != nil {
		t.Fatalf("plain message: the SDK reads no event: %v", err)
	}
	stored, err := h.js.Stream(context.Background(), "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	orig, err := stored.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatal(err)
	}
	if ev.ID() != "m1" || ev.Source() != "/courier/ORDERS" || ev.Type() != "orders.created" || ev.Subject() != "orders.created" ||
		!ev.Time().Equal(orig.Time) || string(ev.Data()) != plain || ev.DataContentType() != "application/json" {
		t.Errorf("plain message read as %s (stream time %v)", ev, orig.Time)
	}
	ev, _, err = a.got(binary)
	if err != nil || ev.ID() != "evt-2" || ev.Source() != "https://shop.example/" || ev.Type() != "com.shop.order.created" || ev.Subject() != "" {
		t.Errorf("binary CloudEvent read as %v (%v): want the publisher's attributes alone", ev, err)
	}
	ev, head, err := a.got(structured)
	if err != nil || ev.ID() != "evt-3" || ev.Type() != "order.paid" || head.Get("Ce-Specversion") != "" {
		t.Errorf("structured CloudEvent read as %v (%v), ce-specversion header %q", ev, err, head.Get("Ce-Specversion"))
	}

	dls := h.deadLetters("dlq.ORDERS.courier")
	dl := dls[0].Header
	for k, want := range map[string]string{"ce-specversion": "1.0", "ce-id": "evt-2", "ce-source": "https://shop.example/", "ce-type": "com.shop.order.created"} {
		if got := dl.Get(k); got != want {
			t.Errorf("dead letter: %s = %q, want the original's %q", k, got, want)
		}
	}
	recs := h.deadLetters("ok.results")
	if len(recs) != 2 {
		t.Fatalf("%d success records, want 2", len(recs))
	}
	var rec *jetstream.RawStreamMsg
	for _, r := range recs {
		if r.Header.Get("Idempotency-Key") == "m1" {
			rec = r
		}
	}
	if rec == nil || rec.Header.Get("Ce-Id") != "answer-1" || rec.Header.Get("Ce-Type") != "order.accepted" {
		t.Errorf("the plain message's success record does not keep the app's ce-* headers: %v", rec)
	}
	for i, m := range append(dls, recs...) {
		for k := range m.Header {
			if strings.HasPrefix(strings.ToLower(k), "webhook-") || strings.EqualFold(k, "Authorization") {
				t.Errorf("stored message %d carries %s", i+1, k)
			}
		}
	}
	_ = c.stop()

	t.Run("off", func(t *testing.T) {
		off := newCEApp(t, func(w http.ResponseWriter, body string) {})
		c := start(t, h.env(off.URL, "COURIER_CONSUMER=plain", "COURIER_DEDUP_DIR="+t.TempDir(), "COURIER_SUBJECTS=orders.created"))
		poll.Until(t, 15*time.Second, "the plain message delivered", func() bool { _, hd, _ := off.got(plain); return hd != nil })
		_, hd, _ := off.got(plain)
		for k := range hd {
			if strings.HasPrefix(k, "Ce-") {
				t.Errorf("with COURIER_CLOUDEVENTS unset the request carries %s", k)
			}
		}
		_ = c.stop()
	})
}
