package config

import (
	"maps"
	"strings"
	"testing"
)

// TestTracesEndpoint: tracing is on when an endpoint is set and the SDK is
// not disabled; the traces endpoint wins and is used as it is, the generic
// one gets /v1/traces for OTLP/HTTP only.
func TestTracesEndpoint(t *testing.T) {
	tests := []struct {
		name     string
		environ  map[string]string
		want     string // "" = tracing off
		protocol string
	}{
		{"none", nil, "", "http/protobuf"},
		{"generic http", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318"}, "http://otel:4318/v1/traces", "http/protobuf"},
		{"generic http, slash", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel:4318/"}, "https://otel:4318/v1/traces", "http/protobuf"},
		{"generic http, base path", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://gw.example/otlp/"}, "https://gw.example/otlp/v1/traces", "http/protobuf"},
		{"traces wins, as it is", map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://otel:4318",
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://tempo:4318/custom",
		}, "http://tempo:4318/custom", "http/protobuf"},
		{"generic grpc, as it is", map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		}, "http://otel:4317", "grpc"},
		{"grpc host:port", map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "otel:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		}, "otel:4317", "grpc"},
		{"traces protocol wins", map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT":        "otel:4317",
			"OTEL_EXPORTER_OTLP_PROTOCOL":        "http/protobuf",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
		}, "otel:4317", "grpc"},
		{"sdk disabled", map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318", "OTEL_SDK_DISABLED": "True",
		}, "", "http/protobuf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustLoad(t, with(tt.environ))
			if got := cfg.TracesEndpoint(); got != tt.want {
				t.Errorf("TracesEndpoint() = %q, want %q", got, tt.want)
			}
			if on := cfg.TracingEnabled(); on != (tt.want != "") {
				t.Errorf("TracingEnabled() = %v", on)
			}
			if got := cfg.TracesProtocol(); got != tt.protocol {
				t.Errorf("TracesProtocol() = %q, want %q", got, tt.protocol)
			}
		})
	}
}

// TestParseKeyValues: OpenTelemetry's key=value lists, values
// percent-decoded; a mistake is named without quoting the value.
func TestParseKeyValues(t *testing.T) {
	tests := []struct {
		in      string
		headers bool
		want    map[string]string
		err     string // a substring; "" = no error
	}{
		{"", true, nil, ""},
		{"k=v,k2=v2", true, map[string]string{"k": "v", "k2": "v2"}, ""},
		{" Authorization = Basic%20dXNlcjpwdw%3D%3D , ,x-tenant=a%2Cb,", true,
			map[string]string{"Authorization": "Basic dXNlcjpwdw==", "x-tenant": "a,b"}, ""},
		{"k=a=b", true, map[string]string{"k": "a=b"}, ""},
		{"k=", true, map[string]string{"k": ""}, ""},
		{"k=1+2", true, map[string]string{"k": "1+2"}, ""}, // percent-decoding, not form decoding
		{"service.name=x,deployment.environment=prod", false, map[string]string{"service.name": "x", "deployment.environment": "prod"}, ""},
		{"Bearer s3cret", true, nil, "no '='"},
		{"k=v,Bearer s3cret", true, nil, "item 2: no '='"},
		{"=s3cret", true, nil, "no key"},
		{"bad key=s3cret", true, nil, `"bad key" is not a valid HTTP header name`},
		{"bad key=v", false, map[string]string{"bad key": "v"}, ""},
		{"k=s3cret%zz", true, nil, "the value of k is not validly percent-encoded"},
	}
	for _, tt := range tests {
		got, err := parseKeyValues(tt.in, tt.headers)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("parseKeyValues(%q): error %v, want one containing %q", tt.in, err, tt.err)
		case tt.err != "" && strings.Contains(err.Error(), "s3cret"):
			t.Errorf("parseKeyValues(%q): the error quotes the value: %v", tt.in, err)
		case tt.err == "" && err != nil:
			t.Errorf("parseKeyValues(%q): %v", tt.in, err)
		case !maps.Equal(got, tt.want):
			t.Errorf("parseKeyValues(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

// TestTracingValues: what each variable accepts, as Load checks it.
func TestTracingValues(t *testing.T) {
	tests := []struct {
		name    string
		environ map[string]string
		want    string // a prefix of the one problem; "" = valid
	}{
		{"every sampler", nil, ""},
		{"sampler case", map[string]string{"OTEL_TRACES_SAMPLER": "Always_Off"}, ""},
		{"sampler unknown", map[string]string{"OTEL_TRACES_SAMPLER": "jaeger_remote"}, `OTEL_TRACES_SAMPLER="jaeger_remote": expected one of always_on, always_off, traceidratio, parentbased_always_on`},
		{"ratio", map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}, ""},
		{"ratio not a number", map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "ten percent"}, `OTEL_TRACES_SAMPLER_ARG="ten percent": not a number`},
		{"ratio too big", map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "10"}, `OTEL_TRACES_SAMPLER_ARG="10": expected a ratio from 0 to 1`},
		{"arg of another sampler", map[string]string{"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "whatever"}, ""},
		{"protocol", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "udp"}, `OTEL_EXPORTER_OTLP_PROTOCOL="udp": expected grpc or http/protobuf`},
		{"json", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/json": http/json is not supported`},
		{"http endpoint without scheme", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "otel:4318"}, `OTEL_EXPORTER_OTLP_ENDPOINT="otel:4318": expected an http or https URL`},
		{"endpoint scheme", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://otel/"}, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="ftp://otel/": expected an http or https URL`},
		{"endpoint host", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http:///v1"}, `OTEL_EXPORTER_OTLP_ENDPOINT="http:///v1": no host`},
		{"grpc endpoint", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "otel"}, `OTEL_EXPORTER_OTLP_ENDPOINT="otel": expected host:port or an http or https URL`},
		{"headers", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "api-key"}, `OTEL_EXPORTER_OTLP_HEADERS="[redacted]": no '='`},
		{"traces headers", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "a=1,x y=2"}, `OTEL_EXPORTER_OTLP_TRACES_HEADERS="[redacted]": item 2: "x y" is not a valid HTTP header name`},
		{"resource attributes", map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "team"}, `OTEL_RESOURCE_ATTRIBUTES="team": no '='`},
		{"insecure", map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "yes"}, `OTEL_EXPORTER_OTLP_INSECURE="yes": expected true or false`},
		{"disabled", map[string]string{"OTEL_SDK_DISABLED": "1"}, `OTEL_SDK_DISABLED="1": expected true or false`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want == "" {
				for _, s := range samplers {
					environ := with(tt.environ)
					if tt.environ == nil {
						environ["OTEL_TRACES_SAMPLER"] = s
					}
					mustLoad(t, environ)
				}
				return
			}
			got := problems(t, with(tt.environ))
			if len(got) != 1 || !strings.HasPrefix(got[0], tt.want) {
				t.Errorf("problems:\n%s\nwant one starting\n %s", strings.Join(got, "\n"), tt.want)
			}
		})
	}
}

// TestTracingDerived: headers (the traces ones replace the others), the
// service name and the sampler's ratio.
func TestTracingDerived(t *testing.T) {
	cfg := mustLoad(t, with(map[string]string{
		"OTEL_EXPORTER_OTLP_HEADERS":        "a=1,b=2",
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api-key=x%2Fy",
		"OTEL_RESOURCE_ATTRIBUTES":          "service.name=from-attributes,team=payments",
		"OTEL_TRACES_SAMPLER":               "traceidratio",
		"OTEL_TRACES_SAMPLER_ARG":           "0.5",
	}))
	if got := cfg.TracesHeaders(); !maps.Equal(got, map[string]string{"api-key": "x/y"}) {
		t.Errorf("TracesHeaders() = %v", got)
	}
	if got := cfg.TracesServiceName(); got != "from-attributes" {
		t.Errorf("TracesServiceName() = %q, want service.name of OTEL_RESOURCE_ATTRIBUTES", got)
	}
	if got := cfg.ResourceAttributes(); got["team"] != "payments" || len(got) != 2 {
		t.Errorf("ResourceAttributes() = %v", got)
	}
	if got := cfg.TracesSamplerRatio(); got != 0.5 {
		t.Errorf("TracesSamplerRatio() = %v", got)
	}

	cfg = mustLoad(t, with(map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_SERVICE_NAME": "mine",
		"OTEL_RESOURCE_ATTRIBUTES": "service.name=other"}))
	if got := cfg.TracesHeaders(); !maps.Equal(got, map[string]string{"a": "1"}) {
		t.Errorf("TracesHeaders() = %v", got)
	}
	if got := cfg.TracesServiceName(); got != "mine" {
		t.Errorf("TracesServiceName() = %q, want OTEL_SERVICE_NAME's", got)
	}

	cfg = mustLoad(t, minimal())
	if cfg.TracesHeaders() != nil || cfg.TracesServiceName() != "courier" || cfg.TracesSamplerRatio() != 1 {
		t.Errorf("defaults: headers %v, service %q, ratio %v", cfg.TracesHeaders(), cfg.TracesServiceName(), cfg.TracesSamplerRatio())
	}
}

// TestTracingRedacted: the OTLP headers are secrets wherever a value is
// shown: `courier config`, a logged Config, a problem.
func TestTracingRedacted(t *testing.T) {
	environ := with(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT":       "https://user:pw-s3cret@otel:4318",
		"OTEL_EXPORTER_OTLP_HEADERS":        "authorization=Bearer%20s3cret",
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api-key=s3cret",
	})
	cfg := mustLoad(t, environ)
	if cfg.TracesHeaders()["api-key"] != "s3cret" {
		t.Fatal("the headers themselves were redacted")
	}
	vars, _, err := Inspect(environ)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vars {
		if strings.Contains(v.Value, "s3cret") {
			t.Errorf("%s shown as %q", v.Name, v.Value)
		}
		if strings.HasSuffix(v.Name, "_HEADERS") && (!v.Secret || v.Value != "[redacted]") {
			t.Errorf("%s: Secret %v, Value %q", v.Name, v.Secret, v.Value)
		}
	}
	var b strings.Builder
	if err := WriteTable(&b, vars); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "s3cret") {
		t.Errorf("table shows a secret:\n%s", b.String())
	}
}

// TestTracingWarnings: OpenTelemetry's variables are not unknown courier
// variables; OTLP exporter variables courier does not read are named.
func TestTracingWarnings(t *testing.T) {
	environ := with(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT":         "http://otel:4318",
		"OTEL_SERVICE_NAME":                   "courier",
		"OTEL_EXPORTER_OTLP_CERTIFICATE":      "/etc/ca.pem",
		"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://otel:4318/v1/metrics",
		"OTEL_PROPAGATORS":                    "tracecontext",
	})
	ws := Warnings(mustLoad(t, environ), environ)
	if len(ws) != 1 || ws[0].Variable != "OTEL_EXPORTER_OTLP_CERTIFICATE" || !strings.Contains(ws[0].Text, "not read by courier") {
		t.Errorf("warnings: %v", ws)
	}
}

// TestTracesInsecure: OTEL_EXPORTER_OTLP_TRACES_INSECURE wins over
// OTEL_EXPORTER_OTLP_INSECURE either way; unset, the generic one holds. It is
// read, not warned about as ignored.
func TestTracesInsecure(t *testing.T) {
	for _, tt := range []struct {
		name    string
		environ map[string]string
		want    bool
	}{
		{"neither", map[string]string{}, false},
		{"generic", map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "true"}, true},
		{"traces only", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"}, true},
		{"traces off wins", map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "false"}, false},
		{"traces on wins", map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "false", "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"}, true},
		{"traces empty is unset", map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_TRACES_INSECURE": ""}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustLoad(t, with(tt.environ))
			if got := cfg.TracesInsecure(); got != tt.want {
				t.Errorf("TracesInsecure() = %v, want %v", got, tt.want)
			}
		})
	}
	if got := ignoredOTLPVars(map[string]string{"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"}); len(got) != 0 {
		t.Errorf("ignoredOTLPVars = %v, want none: courier reads it", got)
	}
}
