package proxy

import (
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// BenchmarkAttemptSpan measures what tracing adds to one delivery attempt:
// off (no Tracer: what every message pays at the defaults), and on with the
// SDK recording every span in memory (no exporter).
func BenchmarkAttemptSpan(b *testing.B) {
	msg := &headerMsg{h: nats.Header{"traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}}
	meta := &jetstream.MsgMetadata{Stream: "S", NumDelivered: 1, Timestamp: time.Now()}
	d := &delivery{m: msg, meta: meta, attempt: 1, key: "k", arrived: time.Now(), ord: noLines{}}
	for _, tc := range []struct {
		name string
		t    *tracing
	}{
		{"off", &tracing{}},
		{"on", &tracing{consumer: "c", tracer: sdktrace.NewTracerProvider(
			sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder())).Tracer("bench")}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h := http.Header{}
			b.ReportAllocs()
			for b.Loop() {
				s := tc.t.startAttempt(d, h)
				s.request()
				s.setOutcome("delivered")
				s.end(nil)
			}
		})
	}
}
