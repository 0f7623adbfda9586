package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// With an OTLP endpoint, courier starts with tracing on, says where spans
// go (no secret), delivers, and stops cleanly, flushing within its bound.
func TestTracingOnStartsAndStops(t *testing.T) {
	const secret = "otlp-key-Vb7Qm2Rx9"
	h := newHarness(t)
	a := newApp(t, nil)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(collector.Close)

	c := start(t, h.env(a.URL,
		"OTEL_EXPORTER_OTLP_ENDPOINT="+collector.URL,
		"OTEL_EXPORTER_OTLP_HEADERS=api-key="+secret,
		"OTEL_SERVICE_NAME=orders-courier",
	))
	h.publish("orders.created", "{}", map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	waitFor(t, 10*time.Second, "the app to receive the message", func() bool { return a.count() == 1 })
	waitFor(t, 10*time.Second, "the message to be acked", func() bool { return h.settled("courier") })
	if err := c.stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	logs := c.logs.String()
	if !strings.Contains(logs, `"msg":"tracing on: a span per delivery attempt"`) ||
		!strings.Contains(logs, `"endpoint":"`+collector.URL+`/v1/traces"`) || !strings.Contains(logs, `"service":"orders-courier"`) {
		t.Errorf("no start-up line saying where spans go:\n%s", logs)
	}
	if strings.Contains(logs, secret) || strings.Contains(logs, "not a courier variable") {
		t.Errorf("logs hold the OTLP headers or warn about OpenTelemetry's variables:\n%s", logs)
	}
}

// `courier config` describes OpenTelemetry's variables, headers redacted,
// without calling them unknown; an invalid protocol is a configuration
// error (exit 2).
func TestConfigCommandTracing(t *testing.T) {
	const secret = "otlp-key-Vb7Qm2Rx9"
	base := []string{"COURIER_STREAM=ORDERS", "COURIER_APP_URL=http://127.0.0.1:8080/",
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://otel:4318", "OTEL_EXPORTER_OTLP_TRACES_HEADERS=authorization=Bearer%20" + secret}

	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"config"}, base, &stdout, &stderr)
	if code := exitCode(err, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	rows := map[string]string{}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if name, rest, ok := strings.Cut(line, " "); ok {
			rows[name] = strings.TrimSpace(rest)
		}
	}
	for name, want := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT":       "http://otel:4318",
		"OTEL_EXPORTER_OTLP_PROTOCOL":       "http/protobuf",
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "[redacted]",
		"OTEL_SERVICE_NAME":                 "courier",
		"OTEL_TRACES_SAMPLER":               "parentbased_always_on",
	} {
		if !strings.HasPrefix(rows[name], want+" ") {
			t.Errorf("%s row %q, want the value %q", name, rows[name], want)
		}
	}
	if out := stdout.String() + stderr.String(); strings.Contains(out, secret) || stderr.Len() > 0 {
		t.Errorf("a secret or a warning:\n%s", out)
	}

	stdout.Reset()
	stderr.Reset()
	err = run(context.Background(), nil, append(base, "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"), &stdout, &stderr)
	if code := exitCode(err, &stderr); code != 2 || !strings.Contains(stderr.String(), `OTEL_EXPORTER_OTLP_PROTOCOL="http/json": http/json is not supported`) {
		t.Errorf("exit %d, want 2 naming the protocol:\n%s", code, stderr.String())
	}
}
