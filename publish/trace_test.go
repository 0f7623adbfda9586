package publish

import (
	"net/http"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/courierhq/courier/internal/natstest"
)

// TestPublishSpan: with a tracer, a publish is a producer span whose parent
// is the request's traceparent, and the stored message carries the span's
// own context, so that the trace continues with its consumer; a refusal's
// span is an error.
func TestPublishSpan(t *testing.T) {
	a, js, rec := tracedAPI(t)

	const traceID, parentID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	ans := a.post("orders.created", "x", "Traceparent", "00-"+traceID+"-"+parentID+"-01", "Tracestate", "vendor=1",
		"Idempotency-Key", "k-1")
	if ans.status != http.StatusOK {
		t.Fatalf("publish: %+v", ans)
	}
	if ans := a.post("billing.x", "x"); ans.status != http.StatusForbidden {
		t.Fatalf("forbidden: %+v", ans)
	}
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1 (a refusal before the publish makes none)", len(spans))
	}
	sp := spans[0]
	if sp.Name() != "send orders.created" || sp.SpanKind() != trace.SpanKindProducer {
		t.Errorf("span %q kind %v", sp.Name(), sp.SpanKind())
	}
	if sp.Parent().TraceID().String() != traceID || sp.Parent().SpanID().String() != parentID || !sp.Parent().IsRemote() {
		t.Errorf("parent %v, want the request's traceparent", sp.Parent())
	}
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range sp.Attributes() {
		attrs[kv.Key] = kv.Value
	}
	for k, want := range map[attribute.Key]string{
		"messaging.system": "nats", "messaging.destination.name": "orders.created", "messaging.message.id": "k-1",
		"courier.stream": "ORDERS", "courier.stream.sequence": "1", "courier.outcome": outcomeStored,
	} {
		if got := attrs[k].String(); got != want {
			t.Errorf("attribute %s = %q, want %q", k, got, want)
		}
	}
	m := stored(t, js, "ORDERS", 1)
	want := "00-" + traceID + "-" + sp.SpanContext().SpanID().String() + "-01"
	if got := m.Header.Get("traceparent"); got != want {
		t.Errorf("message traceparent %q, want the span's %q", got, want)
	}
	if got := m.Header.Get("tracestate"); got != "vendor=1" {
		t.Errorf("message tracestate %q", got)
	}

	// A publish refused by JetStream ends its span as an error.
	if ans := a.post("orders.created", "x", "Nats-Expected-Last-Sequence", "99"); ans.status != http.StatusPreconditionFailed {
		t.Fatalf("expectation: %+v", ans)
	}
	if spans := rec.Ended(); len(spans) != 2 || spans[1].Status().Code != codes.Error {
		t.Errorf("the refused publish's span: %v", spans)
	}
}

// tracedAPI is an API with a tracer recording its spans, publishing to a
// stream ORDERS on orders.> of an embedded server.
func tracedAPI(t *testing.T) (*api, jetstream.JetStream, *tracetest.SpanRecorder) {
	t.Helper()
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	return startAPI(t, srv.ClientURL(), Options{Tracer: tp.Tracer("test")}), js, rec
}

// TestPublishNoTracer: without a tracer the request's traceparent is the
// message's, unchanged.
func TestPublishNoTracer(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{})
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ans := a.post("orders.created", "x", "Traceparent", tp)
	if got := stored(t, js, "ORDERS", ans.Seq).Header.Get("traceparent"); got != tp {
		t.Errorf("traceparent %q, want %q", got, tp)
	}
}
