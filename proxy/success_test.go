package proxy_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natshdr"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
	"github.com/courierhq/courier/success"
)

// records returns every success record stored on subj.
func records(t *testing.T, js jetstream.JetStream, subj string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	name, err := js.StreamNameBySubject(ctx, subj)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		out = append(out, m)
	}
	return out
}

// The app's answer to each 2xx is stored as a success record before the
// original is acked: body and headers, courier's own, the final attempt of a
// retried message; one record per key, duplicates publishing nothing.
func TestSuccessRecords(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, _, err := success.EnsureStream(ctx, e.js, "ok.s", 1, dlq.CheckStream); err != nil {
		t.Fatal(err)
	}
	var first atomic.Bool
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(proxy.HeaderIdempotencyKey) == "retried" && !first.Swap(true) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("X-Order", "42")
		w.Header().Set("Connection", "keep-alive")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("answer to " + r.Header.Get(proxy.HeaderIdempotencyKey)))
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
	for _, k := range []string{"a", "retried", "a"} { // the second "a" is a duplicate
		m := nats.NewMsg("s.x")
		m.Header.Set(proxy.HeaderIdempotencyKey, k)
		if _, err := e.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = e.runWith(t, openStore(t), proxy.Options{
		Success: success.NewPublisher(e.js, "ok.s"), MaxDeliver: 3,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
	})
	poll.Until(t, 10*time.Second, "every message settled", func() bool { return e.settled(t) })
	recs := records(t, e.js, "ok.s")
	if len(recs) != 2 {
		t.Fatalf("%d success records, want 2 (one per key)", len(recs))
	}
	byKey := map[string]*jetstream.RawStreamMsg{}
	for _, m := range recs {
		byKey[m.Header.Get(success.HeaderKey)] = m
	}
	a, retried := byKey["a"], byKey["retried"]
	if a == nil || retried == nil {
		t.Fatalf("records by key: %v", byKey)
	}
	if string(a.Data) != "answer to a" || a.Header.Get(success.HeaderStatus) != "201" || a.Header.Get("X-Order") != "42" {
		t.Errorf("record of a: %q %v", a.Data, a.Header)
	}
	if a.Header.Get("Connection") != "" {
		t.Errorf("hop-by-hop header kept: %v", a.Header)
	}
	if got := retried.Header.Get(success.HeaderAttempt); got != strconv.Itoa(2) {
		t.Errorf("record of a retried message carries attempt %q, want 2", got)
	}
	if got := counter(t, e.reg, "courier_success_records_total", ""); got != 2 {
		t.Errorf("courier_success_records_total %v, want 2", got)
	}
}

// lostAck stores the record for real but reports a failure the first time,
// as when the acknowledgement is lost (or courier dies) after the publish.
type lostAck struct {
	*success.Publisher
	lost atomic.Bool
}

func (l *lostAck) Publish(ctx context.Context, r success.Record) error {
	err := l.Publisher.Publish(ctx, r)
	if err == nil && !l.lost.Swap(true) {
		return context.DeadlineExceeded
	}
	return err
}

// A record published again after its acknowledgement was lost is stored
// once, and the app is not called again for it.
func TestSuccessRecordOnceWhenAckLost(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, _, err := success.EnsureStream(ctx, e.js, "ok.s", 1, dlq.CheckStream); err != nil {
		t.Fatal(err)
	}
	e.publish(t, 1, []byte("x"))
	_, _ = e.runWith(t, openStore(t), proxy.Options{Success: &lostAck{Publisher: success.NewPublisher(e.js, "ok.s")}})
	poll.Until(t, 10*time.Second, "the message settled", func() bool { return e.settled(t) })
	if got := len(records(t, e.js, "ok.s")); got != 1 {
		t.Errorf("%d success records, want 1", got)
	}
	if got := e.calls.Load(); got != 1 {
		t.Errorf("app called %d times, want 1", got)
	}
}

// stuckAfterPublish stores the record for real, then fails every time: as if
// courier died between the publish and the ack.
type stuckAfterPublish struct{ *success.Publisher }

func (s stuckAfterPublish) Publish(ctx context.Context, r success.Record) error {
	if err := s.Publisher.Publish(ctx, r); err != nil {
		return err
	}
	return errors.New("killed before the ack")
}

// Courier dies between the record's publish and the ack: the message comes
// back, the app is called again (its key was not recorded), and the record,
// published again under the same Nats-Msg-Id, is stored once.
func TestSuccessRecordOnceAcrossAKill(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, _, err := success.EnsureStream(ctx, e.js, "ok.s", 1, dlq.CheckStream); err != nil {
		t.Fatal(err)
	}
	store := openStore(t)
	e.publish(t, 1, []byte("x"))
	_, stopA := e.runWith(t, store, proxy.Options{Success: stuckAfterPublish{success.NewPublisher(e.js, "ok.s")}})
	poll.Until(t, 10*time.Second, "the first record stored", func() bool { return len(records(t, e.js, "ok.s")) == 1 })
	stopA() // the held message is given back
	e.reg = prometheus.NewRegistry()
	_, _ = e.runWith(t, store, proxy.Options{Success: success.NewPublisher(e.js, "ok.s")})
	poll.Until(t, 10*time.Second, "the message settled", func() bool { return e.settled(t) })
	if got := e.calls.Load(); got != 2 {
		t.Errorf("app called %d times, want 2 (once before the kill, once after)", got)
	}
	if got := len(records(t, e.js, "ok.s")); got != 1 {
		t.Errorf("%d success records, want 1", got)
	}
}

// successEnv is setup's environment on a server whose max_payload is
// maxPayload (0: the default), with the success stream of "ok.s".
func successEnv(t *testing.T, maxPayload int32) *env {
	t.Helper()
	s := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) {
		if maxPayload > 0 {
			o.MaxPayload = maxPayload
		}
	}})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	streams(t, js)
	if _, _, err := success.EnsureStream(ctx, js, "ok.s", 1, dlq.CheckStream); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{
		Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5, AckWait: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &env{js: js, cons: cons, reg: prometheus.NewRegistry()}
}

// With tracing off, a success record keeps the message's trace context
// (traceparent and tracestate, as the publisher wrote them), as a dead
// letter does, whatever trace context the app answered with.
func TestSuccessRecordKeepsTraceContext(t *testing.T) {
	e := successEnv(t, 0)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.calls.Add(1)
		// The app's own server span, which the record must not take for
		// the message's.
		w.Header().Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		w.Header().Set("X-Order", "42")
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
	m := nats.NewMsg("s.x")
	m.Header.Set("traceparent", publisherTraceparent) // lower case, as publishers write it
	m.Header.Set("tracestate", "vendor=abc")
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	_, _ = e.runWith(t, openStore(t), proxy.Options{Success: success.NewPublisher(e.js, "ok.s")})
	poll.Until(t, 10*time.Second, "the message settled", func() bool { return e.settled(t) })
	recs := records(t, e.js, "ok.s")
	if len(recs) != 1 {
		t.Fatalf("%d success records, want 1", len(recs))
	}
	h := recs[0].Header
	if got := natshdr.Get(h, "traceparent"); got != publisherTraceparent {
		t.Errorf("record's traceparent %q, want the message's %q (headers %v)", got, publisherTraceparent, h)
	}
	if got := natshdr.Get(h, "tracestate"); got != "vendor=abc" {
		t.Errorf("record's tracestate %q, want the message's (headers %v)", got, h)
	}
	if n := len(h.Values("traceparent")) + len(h.Values("Traceparent")); n != 1 {
		t.Errorf("record carries %d traceparent values, want 1: %v", n, h)
	}
	if h.Get("X-Order") != "42" {
		t.Errorf("the app's own headers lost: %v", h)
	}
}

// An answer whose headers alone exceed the server's max_payload is stored
// all the same, once: the app's headers that do not fit are left out
// (largest first), courier's own headers and the trace context are kept,
// the body is kept when it fits, and the record says what was left out. The
// app is called once: an answer of any size is no reason to call it again.
func TestSuccessRecordWithHeadersOverMaxPayload(t *testing.T) {
	const maxPayload = 8192
	big := strings.Repeat("h", 6000)
	tests := []struct {
		name     string
		header   map[string]string
		body     int
		wantBody bool
		wantGone []string // the app's headers left out
		wantKept []string // the app's headers kept
	}{
		{"headers that fit", map[string]string{"X-Huge": big, "X-Small": "1"}, 100, true, nil, []string{"X-Huge", "X-Small"}},
		{"two huge headers", map[string]string{"X-Huge": big, "X-Huger": big + "h", "X-Small": "1"}, 100, true, []string{"X-Huger"}, []string{"X-Huge", "X-Small"}},
		{"huge headers and a body over the limit", map[string]string{"X-Huge": big, "X-Huger": big + "h", "X-Small": "1"}, 3 * maxPayload, false, []string{"X-Huger"}, []string{"X-Huge", "X-Small"}},
		{"a body that fits only without a header", map[string]string{"X-Huge": big, "X-Small": "1"}, 4000, true, []string{"X-Huge"}, []string{"X-Small"}},
		{"a body too large even alone", map[string]string{"X-Huge": big, "X-Small": "1"}, maxPayload - 100, false, nil, []string{"X-Huge", "X-Small"}},
		{"a header too large even alone", map[string]string{"X-Huge": strings.Repeat("h", maxPayload+10), "X-Small": "1"}, 100, true, []string{"X-Huge"}, []string{"X-Small"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := successEnv(t, maxPayload)
			body := strings.Repeat("b", tt.body)
			app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				e.calls.Add(1)
				for k, v := range tt.header {
					w.Header().Set(k, v)
				}
				_, _ = w.Write([]byte(body))
			}))
			t.Cleanup(app.Close)
			e.url = app.URL
			m := nats.NewMsg("s.x")
			m.Header.Set(proxy.HeaderIdempotencyKey, "k-1")
			m.Header.Set("traceparent", publisherTraceparent)
			if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			_, _ = e.runWith(t, openStore(t), proxy.Options{Success: success.NewPublisher(e.js, "ok.s"), MaxPayload: maxPayload})
			poll.Until(t, 10*time.Second, "the message settled", func() bool { return e.settled(t) })
			recs := records(t, e.js, "ok.s")
			if len(recs) != 1 {
				t.Fatalf("%d success records, want 1", len(recs))
			}
			if got := e.calls.Load(); got != 1 {
				t.Errorf("app called %d times, want 1", got)
			}
			rec := recs[0]
			h := rec.Header
			for name, want := range map[string]string{success.HeaderStatus: "200", success.HeaderKey: "k-1",
				success.HeaderSubject: "s.x", success.HeaderAttempt: "1", "traceparent": publisherTraceparent,
			} {
				if got := h.Get(name); got != want {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
			if !strings.HasPrefix(h.Get("Nats-Msg-Id"), "courier-success:") {
				t.Errorf("Nats-Msg-Id %q, want the record's own", h.Get("Nats-Msg-Id"))
			}
			omitted := strings.Split(h.Get(success.HeaderOmittedHeaders), ", ")
			if len(tt.wantGone) == 0 && h.Get(success.HeaderOmittedHeaders) != "" {
				t.Errorf("%s = %q, want none left out", success.HeaderOmittedHeaders, h.Get(success.HeaderOmittedHeaders))
			}
			for _, name := range tt.wantGone {
				if h.Get(name) != "" {
					t.Errorf("%s kept: the record could not be stored with it", name)
				}
				if !slices.Contains(omitted, name) {
					t.Errorf("%s = %q does not name %s", success.HeaderOmittedHeaders, h.Get(success.HeaderOmittedHeaders), name)
				}
			}
			for _, name := range tt.wantKept {
				if h.Get(name) != tt.header[name] {
					t.Errorf("%s = %q, want it kept (%q)", name, h.Get(name), tt.header[name])
				}
			}
			switch {
			case tt.wantBody && (string(rec.Data) != body || h.Get(success.HeaderBody) != ""):
				t.Errorf("body %d bytes (%s %q), want the whole %d", len(rec.Data), success.HeaderBody, h.Get(success.HeaderBody), len(body))
			case !tt.wantBody && (len(rec.Data) != 0 || h.Get(success.HeaderBody) != success.BodyOmitted):
				t.Errorf("body %d bytes (%s %q), want it omitted", len(rec.Data), success.HeaderBody, h.Get(success.HeaderBody))
			}
		})
	}
}

// With tracing on, a success record carries the attempt span's trace
// context (same trace as the publisher's, courier's span), not the app's.
func TestSuccessRecordCarriesTheSpanWithTracingOn(t *testing.T) {
	e := successEnv(t, 0)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	m := nats.NewMsg("s.x")
	m.Header.Set("traceparent", publisherTraceparent)
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	_, _ = e.runWith(t, openStore(t), proxy.Options{Success: success.NewPublisher(e.js, "ok.s"), Tracer: tp.Tracer("test")})
	poll.Until(t, 10*time.Second, "the message settled and its span ended", func() bool { return e.settled(t) && len(rec.Ended()) == 1 })
	recs := records(t, e.js, "ok.s")
	if len(recs) != 1 {
		t.Fatalf("%d success records, want 1", len(recs))
	}
	span := rec.Ended()[0].SpanContext()
	want := "00-" + span.TraceID().String() + "-" + span.SpanID().String() + "-01"
	if got := natshdr.Get(recs[0].Header, "traceparent"); got != want || span.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("record's traceparent %q, want the attempt span's %q in the publisher's trace", got, want)
	}
}
