package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

const publisherTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// Every delivery attempt is a span whose parent is the message's
// traceparent; the app's request carries the span's own traceparent, in the
// same trace.
func TestAttemptSpans(t *testing.T) {
	e := setup(t)
	var mu sync.Mutex
	var seen []string
	var failed bool
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, r.Header.Get("Traceparent"))
		if !failed { // the first attempt fails: two spans
			failed = true
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	m := nats.NewMsg("s.x")
	m.Header.Set("traceparent", publisherTraceparent) // lower case, as publishers write it
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	_, _ = e.runWith(t, nil, proxy.Options{Tracer: tp.Tracer("test"),
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	poll.Until(t, 10*time.Second, "the message delivered", func() bool { return e.settled(t) && len(rec.Ended()) == 2 })

	spans := rec.Ended()
	for i, s := range spans {
		if got := s.Parent().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("span %d in trace %s, want the publisher's", i, got)
		}
		if s.Parent().SpanID().String() != "00f067aa0ba902b7" {
			t.Errorf("span %d's parent %s, want the publisher's span", i, s.Parent().SpanID())
		}
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span %d kind %v", i, s.SpanKind())
		}
		attrs := map[attribute.Key]attribute.Value{}
		for _, a := range s.Attributes() {
			attrs[a.Key] = a.Value
		}
		if attrs["messaging.system"].AsString() != "nats" || attrs["messaging.destination.name"].AsString() != "s.x" {
			t.Errorf("span %d attributes %v", i, attrs)
		}
		if got := attrs["courier.delivery.attempt"].AsInt64(); got != int64(i+1) {
			t.Errorf("span %d attempt %d", i, got)
		}
		want := []string{"retried", "delivered"}[i]
		if got := attrs["courier.outcome"].AsString(); got != want {
			t.Errorf("span %d outcome %q, want %q", i, got, want)
		}
		mu.Lock()
		if want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + s.SpanContext().SpanID().String() + "-01"; seen[i] != want {
			t.Errorf("request %d carried traceparent %q, want the span's %q", i, seen[i], want)
		}
		mu.Unlock()
	}
}

// With tracing off, traceparent passes through unchanged.
func TestTraceparentPassesThroughWhenOff(t *testing.T) {
	e := setup(t)
	got := make(chan string, 1)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Traceparent")
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
	m := nats.NewMsg("s.x")
	m.Header.Set("traceparent", publisherTraceparent)
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	_, _ = e.runWith(t, nil, proxy.Options{})
	select {
	case tp := <-got:
		if tp != publisherTraceparent {
			t.Errorf("traceparent %q, want the publisher's unchanged", tp)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("app not called")
	}
}
