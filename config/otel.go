package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
)

// The values of OTEL_EXPORTER_OTLP_PROTOCOL that courier's exporters speak
// (OpenTelemetry's http/json is not one of them).
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf"
)

// Samplers are the values of OTEL_TRACES_SAMPLER courier supports, in the
// order `courier config` names them. The traceidratio ones take
// OTEL_TRACES_SAMPLER_ARG as their ratio.
var samplers = []string{
	"always_on", "always_off", "traceidratio",
	"parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio",
}

// DefaultServiceName is the service.name of courier's spans when neither
// OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one.
const DefaultServiceName = "courier"

// tracesPath is what OpenTelemetry appends to OTEL_EXPORTER_OTLP_ENDPOINT
// for spans sent over OTLP/HTTP.
const tracesPath = "/v1/traces"

// TracingEnabled reports whether courier exports spans: an OTLP endpoint is
// set (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT)
// and OTEL_SDK_DISABLED is not true.
func (c Config) TracingEnabled() bool {
	return !c.OTELSDKDisabled && (c.OTLPTracesEndpoint != "" || c.OTLPEndpoint != "")
}

// TracesProtocol returns ProtocolGRPC or ProtocolHTTPProtobuf:
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL.
func (c Config) TracesProtocol() string {
	if c.OTLPTracesProtocol != "" {
		return c.OTLPTracesProtocol
	}
	return c.OTLPProtocol
}

// TracesInsecure reports whether spans go in plaintext to a gRPC endpoint
// given as host:port: OTEL_EXPORTER_OTLP_TRACES_INSECURE if set, else
// OTEL_EXPORTER_OTLP_INSECURE.
func (c Config) TracesInsecure() bool {
	if c.OTLPTracesInsecure != nil {
		return *c.OTLPTracesInsecure
	}
	return c.OTLPInsecure
}

// TracesEndpoint returns where spans are exported, or "" when tracing is
// off (TracingEnabled). OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as it
// is. OTEL_EXPORTER_OTLP_ENDPOINT is a base URL for OTLP/HTTP, to which
// /v1/traces is appended, and used as it is for gRPC. A gRPC endpoint may
// be a URL (its scheme decides on TLS) or host:port (OTLPInsecure does).
func (c Config) TracesEndpoint() string {
	switch {
	case !c.TracingEnabled():
		return ""
	case c.OTLPTracesEndpoint != "":
		return c.OTLPTracesEndpoint
	case c.TracesProtocol() == ProtocolGRPC:
		return c.OTLPEndpoint
	}
	u, err := url.Parse(c.OTLPEndpoint)
	if err != nil {
		return c.OTLPEndpoint // Load refused it already
	}
	u.Path = path.Join("/", u.Path, tracesPath)
	u.RawPath = ""
	return u.String()
}

// TracesHeaders returns the headers sent with every export:
// OTEL_EXPORTER_OTLP_TRACES_HEADERS if set, else
// OTEL_EXPORTER_OTLP_HEADERS (as OpenTelemetry's Go exporters do, the
// first replaces the second rather than adding to it). Nil when none.
func (c Config) TracesHeaders() map[string]string {
	v := c.OTLPTracesHeaders
	if v == "" {
		v = c.OTLPHeaders
	}
	h, _ := parseKeyValues(v, true) // Load checked it
	return h
}

// TracesServiceName returns the service.name of courier's spans:
// OTEL_SERVICE_NAME, else service.name in OTEL_RESOURCE_ATTRIBUTES, else
// DefaultServiceName.
func (c Config) TracesServiceName() string {
	if c.OTELServiceName != "" {
		return c.OTELServiceName
	}
	if n := c.ResourceAttributes()["service.name"]; n != "" {
		return n
	}
	return DefaultServiceName
}

// ResourceAttributes returns OTEL_RESOURCE_ATTRIBUTES, decoded; nil when
// unset.
func (c Config) ResourceAttributes() map[string]string {
	a, _ := parseKeyValues(c.OTELResourceAttributes, false) // Load checked it
	return a
}

// TracesSamplerRatio returns the ratio of the traceidratio samplers:
// OTEL_TRACES_SAMPLER_ARG, 1 when unset. Other samplers ignore it.
func (c Config) TracesSamplerRatio() float64 {
	r, err := parseRatio(c.OTELTracesSamplerArg)
	if err != nil {
		return 1 // Load refused it already
	}
	return r
}

// usesRatio reports whether sampler reads OTEL_TRACES_SAMPLER_ARG.
func usesRatio(sampler string) bool { return strings.HasSuffix(sampler, "traceidratio") }

func (c *checker) checkTracing(cfg *Config) {
	protocols := []struct{ name, value string }{
		{"OTEL_EXPORTER_OTLP_PROTOCOL", cfg.OTLPProtocol},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", cfg.OTLPTracesProtocol},
	}
	protocolOK := true
	for _, p := range protocols {
		switch p.value {
		case "", ProtocolGRPC, ProtocolHTTPProtobuf:
		case "http/json":
			protocolOK = false
			c.add(p.name, "http/json is not supported: expected grpc or http/protobuf")
		default:
			protocolOK = false
			c.add(p.name, "expected grpc or http/protobuf")
		}
	}
	if protocolOK {
		for _, e := range []struct{ name, value string }{
			{"OTEL_EXPORTER_OTLP_ENDPOINT", cfg.OTLPEndpoint},
			{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", cfg.OTLPTracesEndpoint},
		} {
			if e.value != "" {
				c.checkOTLPEndpoint(e.name, e.value, cfg.TracesProtocol())
			}
		}
	}
	for _, h := range []struct{ name, value string }{
		{"OTEL_EXPORTER_OTLP_HEADERS", cfg.OTLPHeaders},
		{"OTEL_EXPORTER_OTLP_TRACES_HEADERS", cfg.OTLPTracesHeaders},
	} {
		if _, err := parseKeyValues(h.value, true); err != nil {
			c.add(h.name, "%s", err)
		}
	}
	if _, err := parseKeyValues(cfg.OTELResourceAttributes, false); err != nil {
		c.add("OTEL_RESOURCE_ATTRIBUTES", "%s", err)
	}
	if !slices.Contains(samplers, cfg.OTELTracesSampler) {
		c.add("OTEL_TRACES_SAMPLER", "expected one of %s", strings.Join(samplers, ", "))
	} else if usesRatio(cfg.OTELTracesSampler) {
		if _, err := parseRatio(cfg.OTELTracesSamplerArg); err != nil {
			c.add("OTEL_TRACES_SAMPLER_ARG", "%s", err)
		}
	}
}

// checkOTLPEndpoint checks an endpoint for the protocol: an http or https
// URL, or for gRPC also host:port.
func (c *checker) checkOTLPEndpoint(name, v, protocol string) {
	const want = "expected an http or https URL, such as http://otel-collector:4318"
	if protocol == ProtocolGRPC && !strings.Contains(v, "://") {
		if host, port, err := net.SplitHostPort(v); err != nil || host == "" || port == "" {
			c.add(name, "expected host:port or an http or https URL, such as http://otel-collector:4317")
		}
		return
	}
	u, err := url.Parse(v)
	switch {
	case err != nil:
		c.add(name, "not a valid URL: %s", want) // url's error would quote it, userinfo and all
	case u.Scheme != "http" && u.Scheme != "https":
		if protocol == ProtocolGRPC {
			c.add(name, "expected host:port or an http or https URL, such as http://otel-collector:4317")
		} else {
			c.add(name, "%s", want)
		}
	case u.Hostname() == "":
		c.add(name, "no host: %s", want)
	}
}

// parseKeyValues parses OpenTelemetry's lists of key=value pairs
// (OTEL_EXPORTER_OTLP_HEADERS, OTEL_RESOURCE_ATTRIBUTES): comma separated,
// keys and values trimmed, values percent-decoded, empty items skipped. For
// headers, keys must be HTTP header names. Errors never quote a value,
// which may be a secret.
func parseKeyValues(v string, headers bool) (map[string]string, error) {
	var m map[string]string
	items := strings.Split(v, ",")
	for i, item := range items {
		if strings.TrimSpace(item) == "" {
			continue
		}
		which := ""
		if len(items) > 1 {
			which = fmt.Sprintf("item %d: ", i+1)
		}
		k, val, ok := strings.Cut(item, "=")
		k = strings.TrimSpace(k)
		switch {
		case !ok:
			return nil, fmt.Errorf("%sno '=': expected key=value, comma separated", which)
		case k == "":
			return nil, fmt.Errorf("%sno key before '=': expected key=value, comma separated", which)
		case headers && !isToken(k):
			return nil, fmt.Errorf("%s%q is not a valid HTTP header name", which, k)
		}
		decoded, err := url.PathUnescape(val)
		if err != nil {
			return nil, fmt.Errorf("%sthe value of %s is not validly percent-encoded (a '%%' must start %%XX)", which, k)
		}
		if m == nil {
			m = map[string]string{}
		}
		m[k] = strings.TrimSpace(decoded)
	}
	return m, nil
}

// parseRatio parses OTEL_TRACES_SAMPLER_ARG for a traceidratio sampler: a
// number from 0 to 1, 1 when unset.
func parseRatio(v string) (float64, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 1, nil
	}
	r, err := strconv.ParseFloat(v, 64)
	if err != nil || r != r { // NaN
		return 0, errors.New("not a number: expected a ratio from 0 to 1, such as 0.25")
	}
	if r < 0 || r > 1 {
		return 0, errors.New("expected a ratio from 0 to 1, such as 0.25")
	}
	return r, nil
}

// ignoredOTLPVars returns, sorted, the OTEL_EXPORTER_OTLP_* variables in
// environ that concern spans but that courier does not read (certificates,
// timeouts, compression...): the exporter is configured from Config alone,
// so they would be silently ignored. Those of other signals
// (OTEL_EXPORTER_OTLP_METRICS_*, _LOGS_*) concern other programs.
func ignoredOTLPVars(environ map[string]string) []string {
	known := map[string]bool{}
	for _, s := range specs() {
		known[s.name] = true
	}
	var out []string
	for k, v := range environ {
		rest, ok := strings.CutPrefix(k, "OTEL_EXPORTER_OTLP_")
		if !ok || known[k] || v == "" || strings.HasPrefix(rest, "METRICS_") || strings.HasPrefix(rest, "LOGS_") {
			continue
		}
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
