package main

import (
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/oteltest"
)

// With an OTLP endpoint set, each delivery attempt is exported as a span in
// the publisher's trace, and the app's request carries that span's
// traceparent (behaviour 19).
func TestTracingEndToEnd(t *testing.T) {
	h := newHarness(t)
	collector, exports := oteltest.Receiver(t)
	got := make(chan string, 4)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Traceparent")
	}))
	t.Cleanup(app.Close)
	c := start(t, h.env(app.URL, "OTEL_EXPORTER_OTLP_ENDPOINT="+collector.URL, "OTEL_SERVICE_NAME=orders-worker"))
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	h.publish("orders.created", "x", map[string]string{"traceparent": "00-" + traceID + "-" + parentID + "-01"})
	var appSaw string
	select {
	case appSaw = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("app not called")
	}
	if err := c.stop(); err != nil { // flushes the spans
		t.Fatal(err)
	}
	var spans []oteltest.Span
	for len(spans) == 0 {
		select {
		case e := <-exports:
			spans = append(spans, oteltest.Spans(e)...)
		case <-time.After(5 * time.Second):
			t.Fatal("no span exported")
		}
	}
	s := spans[0]
	if hex.EncodeToString(s.Span.GetTraceId()) != traceID || hex.EncodeToString(s.Span.GetParentSpanId()) != parentID {
		t.Errorf("span in trace %x under %x, want the publisher's", s.Span.GetTraceId(), s.Span.GetParentSpanId())
	}
	if s.Resource["service.name"] != "orders-worker" {
		t.Errorf("service.name %q", s.Resource["service.name"])
	}
	if want := "00-" + traceID + "-" + hex.EncodeToString(s.Span.GetSpanId()) + "-01"; appSaw != want {
		t.Errorf("the app got traceparent %q, want the span's %q", appSaw, want)
	}
	attrs := map[string]string{}
	for _, kv := range s.Span.GetAttributes() {
		attrs[kv.GetKey()] = kv.GetValue().String()
	}
	if !strings.Contains(attrs["messaging.system"], "nats") || !strings.Contains(attrs["courier.outcome"], "delivered") {
		t.Errorf("attributes %v", attrs)
	}
}
