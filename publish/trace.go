package publish

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Tracing: with a Tracer, each publish is a producer span following
// OpenTelemetry's messaging conventions, whose parent is the request's
// traceparent, and the message carries the span's own context, so that the
// trace continues with whoever consumes it (courier's delivery spans take
// it from there: proxy/trace.go). Without one, traceparent passes as any
// other header.

// msgCarrier writes trace context into a message's headers under the W3C
// lower-case names, as NATS clients read them (NATS header names are
// case-sensitive; courier's own reader ignores case, internal/natshdr).
type msgCarrier nats.Header

func (c msgCarrier) Get(key string) string { return nats.Header(c).Get(strings.ToLower(key)) }
func (c msgCarrier) Set(key, value string) { c[strings.ToLower(key)] = []string{value} }
func (c msgCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// span is one publish's span; nil when tracing is off.
type span struct{ s trace.Span }

// startSpan starts the publish's span, child of the trace context in
// carrier (the request's headers, or a batch entry's), and puts the span's
// context on m in place of the one it came with.
func (s *Server) startSpan(ctx context.Context, carrier http.Header, m *nats.Msg) *span {
	if s.o.Tracer == nil {
		return nil
	}
	parent := s.o.Propagator.Extract(ctx, propagation.HeaderCarrier(carrier))
	ctx, sp := s.o.Tracer.Start(parent, "send "+m.Subject,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.operation.name", "publish"),
			attribute.String("messaging.destination.name", m.Subject),
			attribute.String("messaging.message.id", m.Header.Get(nats.MsgIdHdr)),
			attribute.Int("messaging.message.body.size", len(m.Data)),
		))
	delete(m.Header, "traceparent")
	delete(m.Header, "tracestate")
	s.o.Propagator.Inject(ctx, msgCarrier(m.Header))
	return &span{s: sp}
}

// end ends the span with the publish's answer.
func (sp *span) end(res result) {
	if sp == nil {
		return
	}
	sp.s.SetAttributes(
		attribute.Int("http.response.status_code", res.status),
		attribute.String("courier.outcome", res.outcome),
	)
	if res.ack != nil {
		sp.s.SetAttributes(
			attribute.String("courier.stream", res.ack.Stream),
			attribute.String("courier.stream.sequence", strconv.FormatUint(res.ack.Sequence, 10)),
			attribute.Bool("courier.publish.duplicate", res.dup),
		)
	} else {
		sp.s.SetStatus(codes.Error, res.msg)
	}
	sp.s.End()
}
