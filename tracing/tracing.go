// Package tracing sets up OpenTelemetry tracing for courier (README, "Tracing"):
// a TracerProvider exporting spans over OTLP, built from explicit settings
// only. The settings come from config (OpenTelemetry's own variables);
// nothing here reads the process environment, and every exporter and SDK
// setting the environment could otherwise change is passed explicitly (but
// one: the SDK merges OTEL_RESOURCE_ATTRIBUTES under the resource given,
// see newResource).
//
// With tracing off, New returns a Provider whose Tracer is nil: the proxy
// then creates no spans and passes traceparent through unchanged.
package tracing

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// TracerName is the instrumentation scope of courier's spans.
const TracerName = "github.com/courierhq/courier"

// The protocols of Config.Protocol, as OTEL_EXPORTER_OTLP_PROTOCOL names
// them.
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf"
)

// The samplers of Config.Sampler, as OTEL_TRACES_SAMPLER names them.
const (
	SamplerAlwaysOn                = "always_on"
	SamplerAlwaysOff               = "always_off"
	SamplerTraceIDRatio            = "traceidratio"
	SamplerParentBasedAlwaysOn     = "parentbased_always_on"
	SamplerParentBasedAlwaysOff    = "parentbased_always_off"
	SamplerParentBasedTraceIDRatio = "parentbased_traceidratio"
)

// exportTimeout bounds one export to the collector, as OpenTelemetry's
// default does.
const exportTimeout = 10 * time.Second

// Config says where and how spans are exported. The zero value is tracing
// off.
type Config struct {
	// Endpoint is where spans go; "" turns tracing off. For
	// ProtocolHTTPProtobuf an http or https URL used as it is (the path
	// included: config appends /v1/traces to a base URL). For ProtocolGRPC
	// an http or https URL, whose scheme decides on TLS and whose path is
	// ignored, or host:port.
	Endpoint string
	// Protocol is ProtocolGRPC or ProtocolHTTPProtobuf (the default).
	Protocol string
	// Insecure sends spans without TLS to a gRPC Endpoint given as
	// host:port; a URL's scheme decides otherwise.
	Insecure bool
	// Headers are sent with every export (an API key, as a rule).
	Headers map[string]string
	// ServiceName is the resource's service.name. Default "courier".
	ServiceName string
	// ServiceVersion is the resource's service.version (courier's version);
	// none when empty.
	ServiceVersion string
	// ResourceAttributes are further attributes of the resource
	// (OTEL_RESOURCE_ATTRIBUTES); ServiceName and ServiceVersion win over a
	// service.name or service.version among them.
	ResourceAttributes map[string]string
	// Sampler decides which traces are recorded, one of the Sampler*
	// names. Default SamplerParentBasedAlwaysOn.
	Sampler string
	// SamplerRatio is the ratio from 0 to 1 of the traceidratio samplers,
	// used as it is (0 records none); other samplers ignore it.
	SamplerRatio float64
}

// Enabled reports whether c turns tracing on.
func (c Config) Enabled() bool { return c.Endpoint != "" }

// Provider is courier's tracer provider. Its methods are safe for
// concurrent use, also on a nil *Provider, which is tracing off. The owner
// must call Shutdown, which flushes the spans not exported yet.
type Provider struct {
	tp     *sdktrace.TracerProvider // nil: tracing off
	tracer trace.Tracer
}

// New builds the provider cfg describes: an OTLP exporter for the protocol
// behind a batch span processor, the sampler, and a resource naming
// courier. It connects to nothing yet (export failures are reported
// through OpenTelemetry's error handler, otel.SetErrorHandler). With
// tracing off (cfg.Endpoint empty) it returns a Provider whose Tracer is
// nil. An invalid cfg is an error.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if !cfg.Enabled() {
		return &Provider{}, nil
	}
	sampler, err := NewSampler(cfg.Sampler, cfg.SamplerRatio)
	if err != nil {
		return nil, err
	}
	res, err := newResource(ctx, cfg)
	if err != nil {
		return nil, err
	}
	exp, err := newExporter(ctx, cfg)
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp,
			// The SDK's defaults, stated so that no OTEL_BSP_* variable
			// changes them behind config's back.
			sdktrace.WithBatchTimeout(sdktrace.DefaultScheduleDelay*time.Millisecond),
			sdktrace.WithExportTimeout(sdktrace.DefaultExportTimeout*time.Millisecond),
			sdktrace.WithMaxQueueSize(sdktrace.DefaultMaxQueueSize),
			sdktrace.WithMaxExportBatchSize(sdktrace.DefaultMaxExportBatchSize),
		),
		sdktrace.WithSampler(sampler),
		sdktrace.WithResource(res),
		sdktrace.WithRawSpanLimits(sdktrace.SpanLimits{ // likewise OTEL_SPAN_*
			AttributeValueLengthLimit:   sdktrace.DefaultAttributeValueLengthLimit,
			AttributeValueDepthLimit:    sdktrace.DefaultAttributeValueDepthLimit,
			AttributeCountLimit:         sdktrace.DefaultAttributeCountLimit,
			EventCountLimit:             sdktrace.DefaultEventCountLimit,
			LinkCountLimit:              sdktrace.DefaultLinkCountLimit,
			AttributePerEventCountLimit: sdktrace.DefaultAttributePerEventCountLimit,
			AttributePerLinkCountLimit:  sdktrace.DefaultAttributePerLinkCountLimit,
		}),
	)
	return &Provider{
		tp:     tp,
		tracer: tp.Tracer(TracerName, trace.WithInstrumentationVersion(cfg.ServiceVersion)),
	}, nil
}

// Tracer returns the tracer named TracerName, or nil when tracing is off
// (proxy.Options.Tracer's "off").
func (p *Provider) Tracer() trace.Tracer {
	if p == nil || p.tp == nil {
		return nil
	}
	return p.tracer
}

// Propagator returns how trace context travels in message and request
// headers: W3C Trace Context (traceparent, tracestate). Nil when tracing is
// off.
func (p *Provider) Propagator() propagation.TextMapPropagator {
	if p == nil || p.tp == nil {
		return nil
	}
	return propagation.TraceContext{}
}

// Shutdown flushes the spans not exported yet and stops the exporter,
// giving up when ctx ends (then returning its error). Spans started
// afterwards are not recorded. It is idempotent: a second call returns nil
// at once.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.tp == nil {
		return nil
	}
	if err := p.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flushing spans: %w", err)
	}
	return nil
}

// NewSampler returns the sampler named as OTEL_TRACES_SAMPLER names them
// ("" is SamplerParentBasedAlwaysOn); ratio is the fraction of the
// traceidratio ones, from 0 to 1.
func NewSampler(name string, ratio float64) (sdktrace.Sampler, error) {
	if strings.HasSuffix(name, SamplerTraceIDRatio) && !(ratio >= 0 && ratio <= 1) {
		return nil, fmt.Errorf("tracing: sampler ratio %g: expected 0 to 1", ratio)
	}
	switch name {
	case SamplerAlwaysOn:
		return sdktrace.AlwaysSample(), nil
	case SamplerAlwaysOff:
		return sdktrace.NeverSample(), nil
	case SamplerTraceIDRatio:
		return sdktrace.TraceIDRatioBased(ratio), nil
	case SamplerParentBasedAlwaysOn, "":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case SamplerParentBasedAlwaysOff:
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case SamplerParentBasedTraceIDRatio:
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	}
	return nil, fmt.Errorf("tracing: unknown sampler %q", name)
}

// newResource describes courier: the SDK's own attributes, cfg's resource
// attributes, then service.name and service.version, which win.
func newResource(ctx context.Context, cfg Config) (*resource.Resource, error) {
	var attrs []attribute.KeyValue
	for _, k := range slices.Sorted(maps.Keys(cfg.ResourceAttributes)) {
		attrs = append(attrs, attribute.String(k, cfg.ResourceAttributes[k]))
	}
	name := cfg.ServiceName
	if name == "" {
		name = "courier"
	}
	attrs = append(attrs, attribute.String("service.name", name))
	if cfg.ServiceVersion != "" {
		attrs = append(attrs, attribute.String("service.version", cfg.ServiceVersion))
	}
	// resource.Default and WithFromEnv would read OTEL_RESOURCE_ATTRIBUTES
	// and OTEL_SERVICE_NAME from the process: not used. (The SDK's
	// WithResource still merges them in under this resource, which wins on
	// every key it has; in courier they are the variables config read.)
	res, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithAttributes(attrs...))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return res, nil
}

// newExporter builds the OTLP exporter for cfg.Protocol. Every setting the
// exporter would otherwise take from OTEL_EXPORTER_OTLP_* variables of the
// process (endpoint, TLS, headers, compression, timeout) is passed.
func newExporter(ctx context.Context, cfg Config) (sdktrace.SpanExporter, error) {
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12} // the system's roots
	switch cfg.Protocol {
	case ProtocolHTTPProtobuf, "":
		u, err := url.Parse(cfg.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			// The exporter would quietly fall back to localhost:4318.
			return nil, errors.New("tracing: the OTLP/HTTP endpoint must be an http or https URL")
		}
		if u.Scheme == "http" {
			// Also clears a TLS configuration of the variables, which
			// the exporter refuses with an http URL.
			tlsConfig = nil
		}
		exp, err := otlptracehttp.New(ctx,
			otlptracehttp.WithEndpointURL(cfg.Endpoint), // plaintext for http, TLS for https
			otlptracehttp.WithEncoding(otlptracehttp.EncodingProtobuf),
			otlptracehttp.WithTLSClientConfig(tlsConfig),
			otlptracehttp.WithHeaders(cfg.Headers),
			otlptracehttp.WithCompression(otlptracehttp.GzipCompression),
			otlptracehttp.WithTimeout(exportTimeout),
		)
		if err != nil {
			return nil, fmt.Errorf("tracing: OTLP/HTTP exporter: %w", err)
		}
		return exp, nil
	case ProtocolGRPC:
		target, plaintext, err := grpcTarget(cfg.Endpoint, cfg.Insecure)
		if err != nil {
			return nil, err
		}
		creds := credentials.NewTLS(tlsConfig)
		if plaintext {
			creds = insecure.NewCredentials()
		}
		exp, err := otlptracegrpc.New(ctx,
			otlptracegrpc.WithEndpoint(target),
			otlptracegrpc.WithTLSCredentials(creds), // wins over the variables' certificates and insecure flag
			otlptracegrpc.WithHeaders(cfg.Headers),
			otlptracegrpc.WithCompressor("gzip"),
			otlptracegrpc.WithTimeout(exportTimeout),
		)
		if err != nil {
			return nil, fmt.Errorf("tracing: OTLP/gRPC exporter: %w", err)
		}
		return exp, nil
	}
	return nil, fmt.Errorf("tracing: unknown protocol %q: expected %s or %s", cfg.Protocol, ProtocolGRPC, ProtocolHTTPProtobuf)
}

// grpcTarget returns the host:port of a gRPC endpoint and whether to send
// without TLS: an http URL is plaintext, an https one TLS, host:port as
// insecure says.
func grpcTarget(endpoint string, insecure bool) (target string, plaintext bool, err error) {
	const want = "tracing: the OTLP/gRPC endpoint must be host:port or an http or https URL"
	if !strings.Contains(endpoint, "://") {
		if _, _, err := net.SplitHostPort(endpoint); err != nil {
			return "", false, errors.New(want)
		}
		return endpoint, insecure, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", false, errors.New(want)
	}
	return u.Host, u.Scheme == "http", nil
}
