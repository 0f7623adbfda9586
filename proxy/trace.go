package proxy

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/internal/natshdr"
)

// Tracing (README, "Tracing"): with a Tracer, every delivery attempt is a
// span following OpenTelemetry's messaging conventions, whose parent is the
// message's traceparent/tracestate, and the request to the app carries the
// span's own traceparent. The span starts when the message reached courier,
// so the time it waited in courier's queue is in it, and it says how long the
// message had waited since it was published (queue and backoff together).
// Without a Tracer none of this runs: traceparent passes through as any
// other header.

// tracing makes the spans of attempts and of batch requests; its zero
// value (no tracer) makes none.
type tracing struct {
	tracer   trace.Tracer // Options.Tracer; nil: tracing off
	prop     propagation.TextMapPropagator
	consumer string
	stream   string
}

func newTracing(o Options) *tracing {
	return &tracing{tracer: o.Tracer, prop: o.Propagator, consumer: o.Consumer, stream: o.Stream}
}

// natsCarrier reads a message's headers for a propagator: NATS header names
// are case-sensitive, and publishers write "traceparent" in lower case.
type natsCarrier nats.Header

func (c natsCarrier) Get(key string) string { return natshdr.Get(nats.Header(c), key) }
func (c natsCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }
func (c natsCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// attemptSpan is the span of one delivery attempt; nil when tracing is off.
type attemptSpan struct {
	span    trace.Span
	ctx     context.Context
	outcome string
}

// startAttempt starts the span of d's attempt and puts its traceparent on h, the request's
// headers. It returns nil when tracing is off.
func (t *tracing) startAttempt(d *delivery, h http.Header) *attemptSpan {
	if t.tracer == nil {
		return nil
	}
	parent := t.propagator().Extract(context.Background(), natsCarrier(d.m.Headers()))
	start := d.arrived
	if start.IsZero() {
		start = time.Now()
	}
	ctx, span := t.tracer.Start(parent, "process "+d.meta.Stream,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(start),
		trace.WithAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.operation.name", "process"),
			attribute.String("messaging.destination.name", d.m.Subject()),
			attribute.String("messaging.consumer.group.name", t.consumer),
			attribute.String("messaging.message.id", d.key),
			attribute.Int("messaging.message.body.size", len(d.m.Data())),
			attribute.Int("courier.delivery.attempt", d.attempt),
			attribute.String("courier.stream", d.meta.Stream),
			attribute.String("courier.stream.sequence", strconv.FormatUint(d.meta.Sequence.Stream, 10)),
			attribute.Float64("courier.waited.seconds", time.Since(d.meta.Timestamp).Seconds()),
		))
	// The app's request carries this span's context, not the publisher's.
	h.Del("Traceparent")
	h.Del("Tracestate")
	t.propagator().Inject(ctx, propagation.HeaderCarrier(h))
	return &attemptSpan{span: span, ctx: ctx}
}

// request marks the moment the request is sent (after any rate-limit wait).
func (s *attemptSpan) request() {
	if s != nil {
		s.span.AddEvent("request sent to the app")
	}
}

// setOutcome names how the attempt ended.
func (s *attemptSpan) setOutcome(o string) {
	if s != nil {
		s.outcome = o
	}
}

// end ends the span with the attempt's outcome and the app's answer.
func (s *attemptSpan) end(err error) {
	if s == nil {
		return
	}
	if s.outcome != "" {
		s.span.SetAttributes(attribute.String("courier.outcome", s.outcome))
	}
	if status := statusOf(err); status != 0 {
		s.span.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	if err != nil {
		s.span.SetStatus(codes.Error, err.Error())
	}
	s.span.End()
}

// inject puts the span's context on h (a success record's headers).
func (t *tracing) inject(s *attemptSpan, h http.Header) http.Header {
	if s == nil {
		return h
	}
	h = h.Clone()
	if h == nil {
		h = http.Header{}
	}
	t.propagator().Inject(s.ctx, propagation.HeaderCarrier(h))
	return h
}

func (t *tracing) propagator() propagation.TextMapPropagator {
	if t.prop != nil {
		return t.prop
	}
	return propagation.TraceContext{}
}

// startBatch starts the span of a batch request when tracing is on: a
// client span linked to the attempt span of each of its n entries
// (spanAt(i); nil: none), each of them linked to it in turn, whose context
// the request carries (traceparent on h). It returns nil when tracing is
// off.
func (t *tracing) startBatch(n int, spanAt func(i int) *attemptSpan, h http.Header) *attemptSpan {
	if t.tracer == nil {
		return nil
	}
	links := make([]trace.Link, 0, n)
	for i := range n {
		if s := spanAt(i); s != nil {
			links = append(links, trace.LinkFromContext(s.ctx))
		}
	}
	ctx, span := t.tracer.Start(context.Background(), "send "+t.stream+" batch",
		trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.Int("messaging.batch.message_count", n),
			attribute.String("courier.stream", t.stream),
		))
	for i := range n {
		if s := spanAt(i); s != nil {
			s.span.AddLink(trace.Link{SpanContext: span.SpanContext()})
		}
	}
	t.propagator().Inject(ctx, propagation.HeaderCarrier(h))
	return &attemptSpan{span: span, ctx: ctx}
}

// statusOf is the app's HTTP status in err, or 0.
func statusOf(err error) int {
	if ae, ok := err.(*apphttp.AppError); ok {
		return ae.Status
	}
	return 0
}
