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
// traceparent (README, "Tracing").
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

// Spans go over OTLP/gRPC in plaintext to a collector given as host:port
// when OTEL_EXPORTER_OTLP_TRACES_INSECURE says so, even against
// OTEL_EXPORTER_OTLP_INSECURE=false; without it the exporter speaks TLS and
// the plaintext collector gets nothing.
func TestTracingGRPCInsecure(t *testing.T) {
	for _, tc := range []struct {
		name     string
		insecure string
		want     bool
	}{
		{"traces insecure wins", "OTEL_EXPORTER_OTLP_TRACES_INSECURE=true", true},
		{"TLS by default", "OTEL_EXPORTER_OTLP_TRACES_INSECURE=", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			addr, exports := oteltest.GRPCReceiver(t)
			called := make(chan struct{}, 4)
			app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { called <- struct{}{} }))
			t.Cleanup(app.Close)
			c := start(t, h.env(app.URL, "OTEL_EXPORTER_OTLP_ENDPOINT="+addr, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
				"OTEL_EXPORTER_OTLP_INSECURE=false", tc.insecure))
			h.publish("orders.created", "x", nil)
			select {
			case <-called:
			case <-time.After(10 * time.Second):
				t.Fatal("app not called")
			}
			_ = c.stop() // flushes the spans (an export over TLS fails, and is logged)
			select {
			case e := <-exports:
				if !tc.want {
					t.Fatalf("a plaintext collector got %d spans from an exporter that should speak TLS", len(oteltest.Spans(e)))
				}
				if len(oteltest.Spans(e)) == 0 {
					t.Fatal("an export without spans")
				}
			case <-time.After(5 * time.Second):
				if tc.want {
					t.Fatal("no span exported over plaintext gRPC")
				}
			}
		})
	}
}
