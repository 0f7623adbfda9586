package tracing

import (
	"context"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/courierhq/courier/internal/oteltest"
)

type export = oteltest.Export

func receiver(t *testing.T) (*httptest.Server, <-chan export) { return oteltest.Receiver(t) }

// shutdown shuts p down within a bound, failing the test on an error.
func shutdown(t *testing.T, p *Provider) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// TestHTTPExportOnShutdown: a span created through the provider reaches
// an OTLP/HTTP collector when Shutdown flushes, with courier's resource,
// scope and headers; a second Shutdown is harmless.
func TestHTTPExportOnShutdown(t *testing.T) {
	srv, got := receiver(t)
	p, err := New(t.Context(), Config{
		Endpoint:           srv.URL + "/v1/traces",
		Protocol:           ProtocolHTTPProtobuf,
		Headers:            map[string]string{"Api-Key": "k/1"},
		ServiceName:        "billing-courier",
		ServiceVersion:     "1.2.3",
		ResourceAttributes: map[string]string{"deployment.environment": "test", "service.name": "overridden"},
		Sampler:            SamplerParentBasedAlwaysOn,
	})
	if err != nil {
		t.Fatal(err)
	}
	tracer := p.Tracer()
	if tracer == nil {
		t.Fatal("Tracer() = nil with an endpoint")
	}
	_, span := tracer.Start(t.Context(), "ORDERS process", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("messaging.system", "nats")))
	span.End()

	select {
	case e := <-got:
		t.Fatalf("exported before Shutdown (the batch waits 5s): %d resource spans", len(e.Req.GetResourceSpans()))
	default:
	}
	shutdown(t, p)

	var e export
	select {
	case e = <-got:
	default:
		t.Fatal("Shutdown returned before the span was exported")
	}
	if e.Header.Get("Api-Key") != "k/1" {
		t.Errorf("Api-Key header %q", e.Header.Get("Api-Key"))
	}
	spans := oteltest.Spans(e)
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	if s.Span.GetName() != "ORDERS process" || s.Span.GetKind() != tracepb.Span_SPAN_KIND_CONSUMER {
		t.Errorf("span %q kind %v", s.Span.GetName(), s.Span.GetKind())
	}
	if s.Scope != TracerName {
		t.Errorf("scope %q, want %q", s.Scope, TracerName)
	}
	for k, want := range map[string]string{
		"service.name": "billing-courier", "service.version": "1.2.3",
		"deployment.environment": "test", "telemetry.sdk.language": "go",
	} {
		if s.Resource[k] != want {
			t.Errorf("resource %s = %q, want %q", k, s.Resource[k], want)
		}
	}

	if err := p.Shutdown(t.Context()); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
}

// TestIgnoresProcessEnvironment: the SDK and the exporter read
// OpenTelemetry's variables from the process when not told otherwise;
// courier tells them everything, so only Config counts. (The one test that
// sets the process environment: what it proves is that nothing reads it.)
func TestIgnoresProcessEnvironment(t *testing.T) {
	tlsSrv := httptest.NewTLSServer(http.NotFoundHandler())
	tlsSrv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://127.0.0.1:1",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces",
		"OTEL_EXPORTER_OTLP_PROTOCOL":        "http/json",
		"OTEL_EXPORTER_OTLP_HEADERS":         "leak=1",
		"OTEL_EXPORTER_OTLP_CERTIFICATE":     ca, // a TLS configuration the exporter refuses with an http URL
		"OTEL_EXPORTER_OTLP_COMPRESSION":     "none",
		"OTEL_SERVICE_NAME":                  "leak",
		"OTEL_RESOURCE_ATTRIBUTES":           "leak=1",
		"OTEL_TRACES_SAMPLER":                "always_off",
		"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT":    "0",
	} {
		t.Setenv(k, v)
	}
	srv, got := receiver(t)
	p, err := New(t.Context(), Config{Endpoint: srv.URL + "/v1/traces"})
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.Tracer().Start(t.Context(), "ORDERS process", trace.WithAttributes(attribute.Int("messaging.nats.attempt", 1)))
	span.End()
	shutdown(t, p)
	var e export
	select {
	case e = <-got:
	default:
		t.Fatal("nothing exported to the configured endpoint")
	}
	if e.Header.Get("Leak") != "" || e.Header.Get("Content-Encoding") != "gzip" {
		t.Errorf("headers %v: the variables' headers or compression were used", e.Header)
	}
	// sdktrace.WithResource merges the variables' resource under the one
	// given, with no way around it: theirs only adds keys, never replaces
	// one of ours. (In courier both come from the same environment.)
	spans := oteltest.Spans(e)
	if len(spans) != 1 || spans[0].Resource["service.name"] != "courier" || len(spans[0].Span.GetAttributes()) != 1 {
		t.Errorf("spans %v: the variables' sampler, service name or limits were used", spans)
	}
}

// TestParentIsTheMessage: with the propagator, a span started from a
// message's traceparent joins its trace; a parent-based sampler follows
// the parent's decision.
func TestParentIsTheMessage(t *testing.T) {
	srv, got := receiver(t)
	p, err := New(t.Context(), Config{Endpoint: srv.URL + "/v1/traces", Sampler: SamplerParentBasedTraceIDRatio, SamplerRatio: 0})
	if err != nil {
		t.Fatal(err)
	}
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	carrier := propagation.HeaderCarrier(http.Header{})
	carrier.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	ctx := p.Propagator().Extract(t.Context(), carrier)
	_, span := p.Tracer().Start(ctx, "ORDERS process")
	span.End()
	// No parent and a ratio of 0: not recorded.
	_, orphan := p.Tracer().Start(t.Context(), "orphan")
	orphan.End()
	if orphan.IsRecording() || orphan.SpanContext().IsSampled() {
		t.Error("a root span was sampled with a ratio of 0")
	}

	out := http.Header{}
	p.Propagator().Inject(trace.ContextWithSpan(t.Context(), span), propagation.HeaderCarrier(out))
	if tp := out.Get("traceparent"); !strings.HasPrefix(tp, "00-"+traceID+"-") || strings.Contains(tp, parentID) {
		t.Errorf("injected traceparent %q: want the span's, in trace %s", tp, traceID)
	}

	shutdown(t, p)
	spans := oteltest.Spans(<-got)
	if len(spans) != 1 {
		t.Fatalf("%d spans, want the one with a sampled parent", len(spans))
	}
	s := spans[0].Span
	if hex.EncodeToString(s.GetTraceId()) != traceID || hex.EncodeToString(s.GetParentSpanId()) != parentID {
		t.Errorf("trace %x parent %x, want %s %s", s.GetTraceId(), s.GetParentSpanId(), traceID, parentID)
	}
}

// TestGRPCShutdownBounded: the gRPC exporter is built without connecting,
// and Shutdown gives up when its context ends while no collector listens.
func TestGRPCShutdownBounded(t *testing.T) {
	for _, endpoint := range []string{"127.0.0.1:" + deadPort(t), "http://127.0.0.1:" + deadPort(t)} {
		t.Run(endpoint, func(t *testing.T) {
			p, err := New(t.Context(), Config{Endpoint: endpoint, Protocol: ProtocolGRPC, Insecure: true,
				Headers: map[string]string{"api-key": "x"}})
			if err != nil {
				t.Fatal(err)
			}
			_, span := p.Tracer().Start(t.Context(), "ORDERS process")
			span.End()
			ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- p.Shutdown(ctx) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("Shutdown did not return after its context ended")
			}
			if err := p.Shutdown(t.Context()); err != nil {
				t.Errorf("second Shutdown: %v", err)
			}
		})
	}
}

// deadPort returns a local port nothing listens on.
func deadPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	return port
}

// TestOff: without an endpoint there is no tracer, no propagator and
// nothing to shut down; so for a nil Provider.
func TestOff(t *testing.T) {
	p, err := New(t.Context(), Config{Sampler: "nonsense"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*Provider{p, nil} {
		if p.Tracer() != nil || p.Propagator() != nil {
			t.Errorf("%v: Tracer %v, Propagator %v; want nil", p, p.Tracer(), p.Propagator())
		}
		if err := p.Shutdown(t.Context()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	}
}

// TestInvalidConfig: what the exporter would quietly replace by a default
// is an error.
func TestInvalidConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Endpoint: "otel:4318"},
		{Endpoint: "ftp://otel/v1/traces"},
		{Endpoint: "http:///v1/traces"},
		{Endpoint: "otel", Protocol: ProtocolGRPC},
		{Endpoint: "unix:///run/otel.sock", Protocol: ProtocolGRPC},
		{Endpoint: "http://otel:4318", Protocol: "http/json"},
		{Endpoint: "http://otel:4318", Sampler: "jaeger_remote"},
		{Endpoint: "http://otel:4318", Sampler: SamplerTraceIDRatio, SamplerRatio: 1.5},
	} {
		if p, err := New(t.Context(), cfg); err == nil {
			t.Errorf("New(%+v): no error", cfg)
			shutdown(t, p)
		}
	}
}

func TestNewSampler(t *testing.T) {
	tests := []struct {
		name  string
		ratio float64
		want  sdktrace.Sampler // nil: an error
	}{
		{"", 0, sdktrace.ParentBased(sdktrace.AlwaysSample())},
		{SamplerAlwaysOn, 0.5, sdktrace.AlwaysSample()},
		{SamplerAlwaysOff, 0.5, sdktrace.NeverSample()},
		{SamplerTraceIDRatio, 0.25, sdktrace.TraceIDRatioBased(0.25)},
		{SamplerParentBasedAlwaysOn, 0.5, sdktrace.ParentBased(sdktrace.AlwaysSample())},
		{SamplerParentBasedAlwaysOff, 0.5, sdktrace.ParentBased(sdktrace.NeverSample())},
		{SamplerParentBasedTraceIDRatio, 0.1, sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1))},
		{SamplerParentBasedTraceIDRatio, 0, sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0))},
		{SamplerAlwaysOn, 7, sdktrace.AlwaysSample()}, // the ratio is not its business
		{SamplerTraceIDRatio, -0.1, nil},
		{SamplerParentBasedTraceIDRatio, 1.01, nil},
		{"ParentBased_Always_On", 1, nil}, // config lower-cases; New takes the names as they are
		{"xray", 1, nil},
	}
	for _, tt := range tests {
		got, err := NewSampler(tt.name, tt.ratio)
		switch {
		case tt.want == nil && err == nil:
			t.Errorf("NewSampler(%q, %g) = %s, want an error", tt.name, tt.ratio, got.Description())
		case tt.want != nil && err != nil:
			t.Errorf("NewSampler(%q, %g): %v", tt.name, tt.ratio, err)
		case tt.want != nil && got.Description() != tt.want.Description():
			t.Errorf("NewSampler(%q, %g) = %s, want %s", tt.name, tt.ratio, got.Description(), tt.want.Description())
		}
	}
}

func TestGRPCTarget(t *testing.T) {
	tests := []struct {
		endpoint  string
		insecure  bool
		target    string
		plaintext bool
	}{
		{"otel:4317", false, "otel:4317", false},
		{"otel:4317", true, "otel:4317", true},
		{"http://otel:4317", false, "otel:4317", true},
		{"https://otel:4317/ignored", true, "otel:4317", false},
		{"[::1]:4317", true, "[::1]:4317", true},
	}
	for _, tt := range tests {
		target, plaintext, err := grpcTarget(tt.endpoint, tt.insecure)
		if err != nil || target != tt.target || plaintext != tt.plaintext {
			t.Errorf("grpcTarget(%q, %v) = %q, %v, %v; want %q, %v", tt.endpoint, tt.insecure, target, plaintext, err, tt.target, tt.plaintext)
		}
	}
}

// TestErrorHandler: the first error is logged at once, the next ones at
// most once per interval, with how many were left out.
func TestErrorHandler(t *testing.T) {
	var buf strings.Builder
	now := time.Unix(0, 0)
	h := ErrorHandler(slog.New(slog.NewTextHandler(&buf, nil)), time.Minute).(*errorLog)
	h.now = func() time.Time { return now }
	for i := range 5 {
		h.Handle(errors.New("export failed " + strconv.Itoa(i)))
		now = now.Add(20 * time.Second)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "export failed 0") || !strings.Contains(lines[0], "errors_not_logged=0") ||
		!strings.Contains(lines[1], "export failed 3") || !strings.Contains(lines[1], "errors_not_logged=2") {
		t.Errorf("logged:\n%s", buf.String())
	}
}
