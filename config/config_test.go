package config

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// minimal is the smallest valid environment: the two required variables.
func minimal() map[string]string {
	return map[string]string{
		"COURIER_STREAM":  "ORDERS",
		"COURIER_APP_URL": "http://127.0.0.1:8080/messages",
	}
}

// with returns minimal() with kv applied; a value of "<unset>" deletes the
// variable.
func with(kv map[string]string) map[string]string {
	m := minimal()
	for k, v := range kv {
		if v == "<unset>" {
			delete(m, k)
			continue
		}
		m[k] = v
	}
	return m
}

// mustLoad loads environ and fails the test on any problem.
func mustLoad(t *testing.T, environ map[string]string) Config {
	t.Helper()
	cfg, err := Load(environ)
	if err != nil {
		t.Fatalf("Load: unexpected error:\n%v", err)
	}
	return cfg
}

// problems loads environ and returns its problems, failing the test if
// there are none or the error is not an *Error.
func problems(t *testing.T, environ map[string]string) []string {
	t.Helper()
	_, err := Load(environ)
	if err == nil {
		t.Fatal("Load: no error, want problems")
	}
	var cerr *Error
	if !errors.As(err, &cerr) {
		t.Fatalf("Load: error %T, want *Error: %v", err, err)
	}
	if got := strings.Join(cerr.Problems, "\n"); err.Error() != got {
		t.Errorf("Error() = %q, want the problems joined by newlines %q", err.Error(), got)
	}
	return cerr.Problems
}

// tempFile creates a readable file in a test directory.
func tempFile(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// specOrder returns the variables of the README's configuration table
// (README.md#configuration), in order.
func specOrder() []string {
	return []string{
		"NATS_URL", "NATS_CREDS", "NATS_NKEY", "NATS_USER", "NATS_PASSWORD", "NATS_TOKEN",
		"NATS_CA", "NATS_CERT", "NATS_KEY",
		"COURIER_STREAM", "COURIER_CONSUMER", "COURIER_SUBJECTS", "COURIER_APP_URL",
		"COURIER_APP_HEALTH_URL", "COURIER_DELIVER_POLICY", "COURIER_MAX_DELIVER", "COURIER_ACK_WAIT",
		"COURIER_MAX_INFLIGHT", "COURIER_MAX_ACK_PENDING", "COURIER_HTTP_TIMEOUT",
		"COURIER_BACKOFF_INITIAL", "COURIER_BACKOFF_MAX", "COURIER_BACKOFF_MULTIPLIER",
		"COURIER_RETRY_AFTER_MAX", "COURIER_RETRY_STATUSES", "COURIER_MAX_AGE", "COURIER_DLQ_SUBJECT",
		"COURIER_STREAM_REPLICAS", "COURIER_IDEMPOTENCY_HEADER", "COURIER_DEDUP_DIR",
		"COURIER_DEDUP_TTL", "COURIER_DEDUP_STORE", "COURIER_DEDUP_BUCKET",
		"COURIER_BREAKER_FAILURES", "COURIER_BREAKER_PROBE", "COURIER_BREAKER_PROBE_MAX", "COURIER_MAX_RATE",
		"COURIER_SUCCESS_SUBJECT", "COURIER_REPLY_SUBJECTS", "COURIER_REPLY_URL",
		"COURIER_REPLY_MAX_WAITING", // the bound on requests waiting for a reply slot
		"COURIER_ORDER_KEY", "COURIER_ORDER_PARTITIONS", "COURIER_BATCH_MAX", "COURIER_BATCH_WAIT", "COURIER_BATCH_BYTES",
		"COURIER_CLOUDEVENTS", "COURIER_SIGNING_SECRETS_FILE", "COURIER_APP_TOKEN_FILE",
		"COURIER_PUBLISH_ADDR", "COURIER_PUBLISH_SUBJECTS", "COURIER_SCHEDULE_PREFIX",
		"COURIER_ROUTES", "COURIER_SUBSCRIPTIONS",
		"COURIER_ADMIN_ADDR", "COURIER_LOG_LEVEL", "COURIER_LOG_FORMAT",
		"COURIER_SHUTDOWN_GRACE",
		"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
		"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
		"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
		"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_SDK_DISABLED",
	}
}

func TestLoadDefaults(t *testing.T) {
	cfg := mustLoad(t, minimal())
	want := Config{
		NATSURL:           "nats://127.0.0.1:4222",
		Stream:            "ORDERS",
		Consumer:          "courier",
		DeliverPolicy:     "all",
		MaxDeliver:        5,
		AckWait:           30 * time.Second,
		MaxAckPending:     1000,
		AppURL:            "http://127.0.0.1:8080/messages",
		MaxInflight:       8,
		HTTPTimeout:       30 * time.Second,
		BackoffInitial:    time.Second,
		BackoffMax:        10 * time.Minute,
		BackoffMultiplier: 2,
		RetryAfterMax:     10 * time.Minute,
		RetryStatuses:     StatusSet{ranges: [][2]int{{408, 409}, {425, 425}, {429, 429}, {500, 500}, {502, 599}}},
		MaxAge:            0,
		DLQSubject:        "dlq.ORDERS.courier",
		StreamReplicas:    1,
		IdempotencyHeader: "Idempotency-Key",
		DedupDir:          "./courier-data",
		DedupTTL:          24 * time.Hour,
		DedupStore:        "badger",
		DedupBucket:       "COURIER_DEDUP",
		BreakerFailures:   10,
		BreakerProbe:      5 * time.Second,
		BreakerProbeMax:   30 * time.Second,
		MaxRate:           0,
		BatchMax:          1,
		BatchWait:         2 * time.Millisecond,
		BatchBytes:        1 << 20,
		SchedulePrefix:    "_sched",
		AdminAddr:         ":7415",
		LogLevel:          "info",
		LogFormat:         "",
		ShutdownGrace:     25 * time.Second,
		OTLPProtocol:      "http/protobuf",
		OTELTracesSampler: "parentbased_always_on",
	}
	cfg.source = nil // TestSubscriptionSources
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", cfg, want)
	}
	if cfg.Subjects != nil {
		t.Errorf("Subjects = %q, want none (all of the stream)", cfg.Subjects)
	}
	if !cfg.DedupEnabled() {
		t.Error("DedupEnabled() = false with the default TTL")
	}
	if cfg.SlogLevel() != slog.LevelInfo {
		t.Errorf("SlogLevel() = %v, want INFO", cfg.SlogLevel())
	}
}

// TestDefaultsAsSpecStates checks Describe's Value column against the
// defaults the README's configuration table states, in its words where
// those are values.
func TestDefaultsAsSpecStates(t *testing.T) {
	spec := map[string]string{
		"NATS_URL":                   "nats://127.0.0.1:4222",
		"COURIER_CONSUMER":           "courier",
		"COURIER_DELIVER_POLICY":     "all",
		"COURIER_MAX_DELIVER":        "5",
		"COURIER_ACK_WAIT":           "30s",
		"COURIER_MAX_INFLIGHT":       "8",
		"COURIER_MAX_ACK_PENDING":    "1000",
		"COURIER_HTTP_TIMEOUT":       "30s",
		"COURIER_BACKOFF_INITIAL":    "1s",
		"COURIER_BACKOFF_MAX":        "10m",
		"COURIER_BACKOFF_MULTIPLIER": "2",
		"COURIER_RETRY_AFTER_MAX":    "10m",
		"COURIER_RETRY_STATUSES":     "408,409,425,429,500,502-599",
		"COURIER_MAX_AGE":            "0",
		"COURIER_DLQ_SUBJECT":        "dlq.ORDERS.courier",
		"COURIER_STREAM_REPLICAS":    "1",
		"COURIER_IDEMPOTENCY_HEADER": "Idempotency-Key",
		"COURIER_DEDUP_DIR":          "./courier-data",
		"COURIER_DEDUP_TTL":          "24h",
		"COURIER_BREAKER_FAILURES":   "10",
		"COURIER_BREAKER_PROBE":      "5s",
		"COURIER_BREAKER_PROBE_MAX":  "30s",
		"COURIER_MAX_RATE":           "0",
		"COURIER_ADMIN_ADDR":         ":7415",
		"COURIER_LOG_LEVEL":          "info",
		"COURIER_SHUTDOWN_GRACE":     "25s",
	}
	for _, v := range Describe(mustLoad(t, minimal())) {
		want, ok := spec[v.Name]
		if !ok {
			continue
		}
		if v.Value != want {
			t.Errorf("%s: Value %q, want the documented default %q", v.Name, v.Value, want)
		}
		if v.Name != "COURIER_DLQ_SUBJECT" && v.Default != want {
			t.Errorf("%s: Default %q, want the documented %q", v.Name, v.Default, want)
		}
	}
}

// TestDescribeCoversConfig keeps Describe, the configuration table's order
// and the struct's tags in step: a variable added to one must be added to
// all.
func TestDescribeCoversConfig(t *testing.T) {
	vars := Describe(mustLoad(t, minimal()))
	var names []string
	for _, v := range vars {
		names = append(names, v.Name)
		if v.Meaning == "" || v.Default == "" {
			t.Errorf("%s: empty Meaning or Default", v.Name)
		}
	}
	if !slices.Equal(names, specOrder()) {
		t.Errorf("Describe names:\n got %q\nwant %q", names, specOrder())
	}

	ct := reflect.TypeFor[Config]()
	// COURIER_MAX_INFLIGHT is parsed by parseInflight, not by env.
	tags := map[string]string{inflightVar: strconv.Itoa(defaultInflight)}
	for i := range ct.NumField() {
		f := ct.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name == "" {
			continue // MaxInflight, InflightAuto and what Load fills in
		}
		tags[name] = f.Tag.Get("envDefault")
	}
	if got := slices.Sorted(maps.Keys(tags)); !slices.Equal(got, slices.Sorted(slices.Values(specOrder()))) {
		t.Errorf("Config's env tags %q differ from the configuration table's variables", got)
	}
	// Where the struct has a default, Describe must state the same one.
	for _, v := range vars {
		if d := tags[v.Name]; d != "" && d != v.Default {
			t.Errorf("%s: envDefault %q but Describe says %q", v.Name, d, v.Default)
		}
	}
}

func TestLoadValues(t *testing.T) {
	creds := tempFile(t, "user.creds")
	ca := tempFile(t, "ca.pem")
	cert := tempFile(t, "cert.pem")
	key := tempFile(t, "key.pem")
	environ := map[string]string{
		"NATS_URL":                   " nats://a:4222, ,tls://b:4222 ",
		"NATS_CREDS":                 creds,
		"NATS_CA":                    ca,
		"NATS_CERT":                  cert,
		"NATS_KEY":                   key,
		"COURIER_STREAM":             "ORDERS",
		"COURIER_CONSUMER":           "billing",
		"COURIER_SUBJECTS":           " orders.created , ,orders.*.paid,",
		"COURIER_APP_URL":            "https://app.internal/hook",
		"COURIER_APP_HEALTH_URL":     "http://[::1]:8080/health",
		"COURIER_DELIVER_POLICY":     "NEW",
		"COURIER_MAX_DELIVER":        " 10 ",
		"COURIER_ACK_WAIT":           "1m",
		"COURIER_MAX_INFLIGHT":       "32",
		"COURIER_MAX_ACK_PENDING":    "32",
		"COURIER_HTTP_TIMEOUT":       "1500ms",
		"COURIER_BACKOFF_INITIAL":    "250ms",
		"COURIER_BACKOFF_MAX":        "1h30m",
		"COURIER_BACKOFF_MULTIPLIER": "1.5",
		"COURIER_RETRY_AFTER_MAX":    "5m",
		"COURIER_RETRY_STATUSES":     " 503 , 429, 500-502 ",
		"COURIER_MAX_AGE":            "72h",
		"COURIER_DLQ_SUBJECT":        "dead.orders",
		"COURIER_STREAM_REPLICAS":    "3",
		"COURIER_IDEMPOTENCY_HEADER": "X-Request-Id",
		"COURIER_DEDUP_DIR":          "/var/lib/courier",
		"COURIER_DEDUP_TTL":          "0",
		"COURIER_BREAKER_FAILURES":   "0",
		"COURIER_BREAKER_PROBE":      "1500ms",
		"COURIER_BREAKER_PROBE_MAX":  "45s",
		"COURIER_MAX_RATE":           "2.5",
		"COURIER_SUCCESS_SUBJECT":    "orders.done",
		"COURIER_REPLY_SUBJECTS":     " quote.get, ,quote.*.price",
		"COURIER_REPLY_URL":          "http://127.0.0.1:8081/quote",
		"COURIER_ADMIN_ADDR":         "127.0.0.1:0",
		"COURIER_LOG_LEVEL":          "DEBUG",
		"COURIER_LOG_FORMAT":         "Json",
		"COURIER_SHUTDOWN_GRACE":     "0s",

		"OTEL_EXPORTER_OTLP_ENDPOINT":        " http://otel:4318 ",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "otel:4317",
		"OTEL_EXPORTER_OTLP_PROTOCOL":        "HTTP/Protobuf",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "gRPC",
		"OTEL_EXPORTER_OTLP_HEADERS":         "a=1",
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS":  "api-key=s%20cret",
		"OTEL_EXPORTER_OTLP_INSECURE":        "TRUE",
		"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "False",
		"OTEL_SERVICE_NAME":                  "billing-courier",
		"OTEL_RESOURCE_ATTRIBUTES":           "deployment.environment=prod",
		"OTEL_TRACES_SAMPLER":                "ParentBased_TraceIDRatio",
		"OTEL_TRACES_SAMPLER_ARG":            "0.25",
		"OTEL_SDK_DISABLED":                  "false",
	}
	cfg := mustLoad(t, environ)
	want := Config{
		NATSURL:           " nats://a:4222, ,tls://b:4222 ", // the NATS client splits and trims it
		NATSCreds:         creds,
		NATSCA:            ca,
		NATSCert:          cert,
		NATSKey:           key,
		Stream:            "ORDERS",
		Consumer:          "billing",
		Subjects:          []string{"orders.created", "orders.*.paid"},
		DeliverPolicy:     "new",
		MaxDeliver:        10,
		AckWait:           time.Minute,
		MaxAckPending:     32,
		AppURL:            "https://app.internal/hook",
		AppHealthURL:      "http://[::1]:8080/health",
		MaxInflight:       32,
		HTTPTimeout:       1500 * time.Millisecond,
		BackoffInitial:    250 * time.Millisecond,
		BackoffMax:        90 * time.Minute,
		BackoffMultiplier: 1.5,
		RetryAfterMax:     5 * time.Minute,
		RetryStatuses:     StatusSet{ranges: [][2]int{{429, 429}, {500, 503}}},
		MaxAge:            72 * time.Hour,
		DLQSubject:        "dead.orders",
		StreamReplicas:    3,
		IdempotencyHeader: "X-Request-Id",
		DedupDir:          "/var/lib/courier",
		DedupTTL:          0,
		DedupStore:        "badger",
		DedupBucket:       "COURIER_DEDUP",
		BreakerFailures:   0,
		BreakerProbe:      1500 * time.Millisecond,
		BreakerProbeMax:   45 * time.Second,
		MaxRate:           2.5,
		SuccessSubject:    "orders.done",
		ReplySubjects:     []string{"quote.get", "quote.*.price"},
		ReplyURL:          "http://127.0.0.1:8081/quote",
		BatchMax:          1,
		BatchWait:         2 * time.Millisecond,
		BatchBytes:        1 << 20,
		SchedulePrefix:    "_sched",
		AdminAddr:         "127.0.0.1:0",
		LogLevel:          "debug",
		LogFormat:         "json",
		ShutdownGrace:     0,

		OTLPEndpoint:           "http://otel:4318",
		OTLPTracesEndpoint:     "otel:4317",
		OTLPProtocol:           "http/protobuf",
		OTLPTracesProtocol:     "grpc",
		OTLPHeaders:            "a=1",
		OTLPTracesHeaders:      "api-key=s%20cret",
		OTLPInsecure:           true,
		OTLPTracesInsecure:     new(bool),
		OTELServiceName:        "billing-courier",
		OTELResourceAttributes: "deployment.environment=prod",
		OTELTracesSampler:      "parentbased_traceidratio",
		OTELTracesSamplerArg:   "0.25",
	}
	cfg.source = nil // TestSubscriptionSources
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("values:\n got %+v\nwant %+v", cfg, want)
	}
	if cfg.DedupEnabled() {
		t.Error("DedupEnabled() = true with COURIER_DEDUP_TTL=0")
	}
	if cfg.SlogLevel() != slog.LevelDebug {
		t.Errorf("SlogLevel() = %v, want DEBUG", cfg.SlogLevel())
	}
}

// TestEmptyMeansDefault: a variable set to "" is as if unset.
// A subject key with partitions loads; the filter subjects hold the key's
// token as a wildcard or under a '>'.
func TestOrderPartitions(t *testing.T) {
	cfg := mustLoad(t, with(map[string]string{"COURIER_ORDER_KEY": "subject:2", "COURIER_ORDER_PARTITIONS": "8",
		"COURIER_SUBJECTS": "orders.*.created,payments.>"}))
	if cfg.OrderPartitions != 8 {
		t.Errorf("OrderPartitions = %d, want 8", cfg.OrderPartitions)
	}
	if cfg := mustLoad(t, minimal()); cfg.OrderPartitions != 0 {
		t.Errorf("OrderPartitions defaults to %d, want 0", cfg.OrderPartitions)
	}
}

func TestEmptyMeansDefault(t *testing.T) {
	cfg := mustLoad(t, with(map[string]string{
		"COURIER_MAX_DELIVER": "", "COURIER_ACK_WAIT": "", "COURIER_RETRY_STATUSES": "",
		"COURIER_CONSUMER": "", "COURIER_SUBJECTS": "", "COURIER_DLQ_SUBJECT": "",
	}))
	if cfg.MaxDeliver != 5 || cfg.AckWait != 30*time.Second || cfg.RetryStatuses.String() != "408,409,425,429,500,502-599" ||
		cfg.Consumer != "courier" || cfg.Subjects != nil || cfg.DLQSubject != "dlq.ORDERS.courier" {
		t.Errorf("empty variables did not take their defaults: %+v", cfg)
	}
}

// TestLoadNilEnviron: nil is an empty environment, not the process's.
func TestLoadNilEnviron(t *testing.T) {
	_, err := Load(nil)
	if err == nil || !strings.Contains(err.Error(), "COURIER_STREAM is required") {
		t.Fatalf("Load(nil) = %v, want COURIER_STREAM required", err)
	}
}

// TestBadValue checks that each bad value yields exactly one problem, which
// names its variable first and says what is wrong.
func TestBadValue(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		environ map[string]string
		want    string // the whole problem, or a prefix ending in "…"
	}{
		{"stream unset", with(map[string]string{"COURIER_STREAM": "<unset>"}), "COURIER_STREAM is required: …"},
		{"stream empty", with(map[string]string{"COURIER_STREAM": ""}), "COURIER_STREAM is required: …"},
		{"app url unset", with(map[string]string{"COURIER_APP_URL": "<unset>"}), "COURIER_APP_URL is required: …"},
		{"stream dot", with(map[string]string{"COURIER_STREAM": "OR.DERS"}), `COURIER_STREAM="OR.DERS": not a valid JetStream name: it contains '.' …`},
		{"stream space", with(map[string]string{"COURIER_STREAM": "OR DERS"}), `COURIER_STREAM="OR DERS": not a valid JetStream name: …`},
		{"stream star", with(map[string]string{"COURIER_STREAM": "A*"}), `COURIER_STREAM="A*": not a valid JetStream name: it contains '*' …`},
		{"stream gt", with(map[string]string{"COURIER_STREAM": "A>"}), `COURIER_STREAM="A>": not a valid JetStream name: it contains '>' …`},
		{"stream slash", with(map[string]string{"COURIER_STREAM": "a/b"}), `COURIER_STREAM="a/b": not a valid JetStream name: it contains '/' …`},
		{"stream backslash", with(map[string]string{"COURIER_STREAM": `a\b`}), `COURIER_STREAM="a\\b": not a valid JetStream name: it contains '\\' …`},
		{"stream control", with(map[string]string{"COURIER_STREAM": "a\x01b"}), `COURIER_STREAM="a\x01b": not a valid JetStream name: …`},
		{"stream too long", with(map[string]string{"COURIER_STREAM": strings.Repeat("s", 256)}), "COURIER_STREAM=\"" + strings.Repeat("s", 256) + "\": longer than 255 bytes, JetStream's limit"},
		{"consumer tab", with(map[string]string{"COURIER_CONSUMER": "a\tb"}), `COURIER_CONSUMER="a\tb": not a valid JetStream name: …`},
		{"subject empty token", with(map[string]string{"COURIER_SUBJECTS": "orders..created"}), `COURIER_SUBJECTS="orders..created": "orders..created" is not a valid subject: it has an empty token …`},
		{"subject trailing dot", with(map[string]string{"COURIER_SUBJECTS": "orders."}), `COURIER_SUBJECTS="orders.": "orders." is not a valid subject: …`},
		{"subject gt not last", with(map[string]string{"COURIER_SUBJECTS": "a.>.b"}), `COURIER_SUBJECTS="a.>.b": "a.>.b" is not a valid subject: '>' can only be the last token`},
		{"subject glued wildcard", with(map[string]string{"COURIER_SUBJECTS": "orders*"}), `COURIER_SUBJECTS="orders*": "orders*" is not a valid subject: '*' and '>' are wildcards only as whole tokens…`},
		{"subject space", with(map[string]string{"COURIER_SUBJECTS": "a b.c"}), `COURIER_SUBJECTS="a b.c": "a b.c" is not a valid subject: it contains whitespace …`},
		{"subjects overlap", with(map[string]string{"COURIER_SUBJECTS": "orders.*,orders.created"}), `COURIER_SUBJECTS="orders.*,orders.created": filter subjects "orders.*" and "orders.created" overlap…`},
		{"subjects duplicate", with(map[string]string{"COURIER_SUBJECTS": "a.b, a.b"}), `COURIER_SUBJECTS="a.b, a.b": filter subjects "a.b" and "a.b" overlap…`},
		{"partitions one", with(map[string]string{"COURIER_ORDER_KEY": "subject:2", "COURIER_ORDER_PARTITIONS": "1"}), `COURIER_ORDER_PARTITIONS="1": must be 0 (one replica at a time delivers the durable) or from 2 to 128`},
		{"partitions negative", with(map[string]string{"COURIER_ORDER_KEY": "subject:2", "COURIER_ORDER_PARTITIONS": "-3"}), `COURIER_ORDER_PARTITIONS="-3": must be 0 …`},
		{"partitions too many", with(map[string]string{"COURIER_ORDER_KEY": "subject:2", "COURIER_ORDER_PARTITIONS": "500"}), `COURIER_ORDER_PARTITIONS="500": must be 0 …`},
		{"partitions without key", with(map[string]string{"COURIER_ORDER_PARTITIONS": "4"}), `COURIER_ORDER_PARTITIONS="4": needs COURIER_ORDER_KEY=subject:N: partitions split the durable by ordering key`},
		{"partitions header key", with(map[string]string{"COURIER_ORDER_KEY": "header:Order-Id", "COURIER_ORDER_PARTITIONS": "4"}), `COURIER_ORDER_PARTITIONS="4": needs COURIER_ORDER_KEY=subject:N, not header:Order-Id: the server computes a partition from subject tokens only, never from a header; …`},
		{"partitions literal key token", with(map[string]string{"COURIER_ORDER_KEY": "subject:2", "COURIER_ORDER_PARTITIONS": "4", "COURIER_SUBJECTS": "orders.eu.*"}), `COURIER_ORDER_PARTITIONS="4": COURIER_SUBJECTS cannot be partitioned by COURIER_ORDER_KEY=subject:2: subject "orders.eu.*" has "eu" as its token 2, the ordering key: the server partitions by wildcard tokens only…`},
		{"app url relative", with(map[string]string{"COURIER_APP_URL": "/messages"}), `COURIER_APP_URL="/messages": expected an absolute http, https or unix URL…`},
		{"app url scheme", with(map[string]string{"COURIER_APP_URL": "ftp://host/x"}), `COURIER_APP_URL="ftp://host/x": expected an absolute http, https or unix URL…`},
		{"app url no host", with(map[string]string{"COURIER_APP_URL": "http:///x"}), `COURIER_APP_URL="http:///x": no host: …`},
		{"app url port only", with(map[string]string{"COURIER_APP_URL": "http://:8080/x"}), `COURIER_APP_URL="http://:8080/x": no host: …`},
		{"app url unparsable", with(map[string]string{"COURIER_APP_URL": "http://a b/"}), `COURIER_APP_URL="http://a b/": not a valid URL: …`},
		{"health url", with(map[string]string{"COURIER_APP_HEALTH_URL": "localhost:8080/health"}), `COURIER_APP_HEALTH_URL="localhost:8080/health": expected an absolute http, https or unix URL…`},
		{"app socket relative", with(map[string]string{"COURIER_APP_URL": "unix://run/app.sock"}), `COURIER_APP_URL="unix://run/app.sock": socket path "run/app.sock" is not absolute: expected unix:// and an absolute path, such as unix:///run/app/app.sock (three slashes)`},
		{"app socket one slash", with(map[string]string{"COURIER_APP_URL": "unix:/run/app.sock"}), `COURIER_APP_URL="unix:/run/app.sock": a Unix socket is named unix:// and its absolute path, such as unix:///run/app/app.sock`},
		{"app socket no path", with(map[string]string{"COURIER_APP_URL": "unix:///"}), `COURIER_APP_URL="unix:///": no socket path: …`},
		{"app socket request path", with(map[string]string{"COURIER_APP_URL": "unix:///run/app.sock:messages"}), `COURIER_APP_URL="unix:///run/app.sock:messages": request path "messages" after the socket's ':' must start with '/', such as unix:///run/app/app.sock:/messages`},
		{"deliver policy", with(map[string]string{"COURIER_DELIVER_POLICY": "last"}), `COURIER_DELIVER_POLICY="last": expected all or new`},
		{"max deliver abc", with(map[string]string{"COURIER_MAX_DELIVER": "abc"}), `COURIER_MAX_DELIVER="abc": not an integer`},
		{"max deliver float", with(map[string]string{"COURIER_MAX_DELIVER": "2.5"}), `COURIER_MAX_DELIVER="2.5": not an integer`},
		{"max deliver huge", with(map[string]string{"COURIER_MAX_DELIVER": "99999999999999999999"}), `COURIER_MAX_DELIVER="99999999999999999999": integer out of range`},
		{"max deliver zero", with(map[string]string{"COURIER_MAX_DELIVER": "0"}), `COURIER_MAX_DELIVER="0": must be at least 1 …`},
		{"max deliver unlimited", with(map[string]string{"COURIER_MAX_DELIVER": "-1"}), `COURIER_MAX_DELIVER="-1": must be at least 1 …`},
		{"ack wait unit", with(map[string]string{"COURIER_ACK_WAIT": "30"}), `COURIER_ACK_WAIT="30": missing a unit: a duration in Go syntax, such as 30s`},
		{"ack wait junk", with(map[string]string{"COURIER_ACK_WAIT": "half a minute"}), `COURIER_ACK_WAIT="half a minute": not a duration: Go syntax expected…`},
		{"ack wait short", with(map[string]string{"COURIER_ACK_WAIT": "999ms"}), `COURIER_ACK_WAIT="999ms": must be at least 1s…`},
		{"max inflight zero", with(map[string]string{"COURIER_MAX_INFLIGHT": "0"}), `COURIER_MAX_INFLIGHT="0": must be at least 1: expected a number from 1 to 10000 (the requests in flight), or auto or auto:N…`},
		{"reply waiting negative", with(map[string]string{"COURIER_REPLY_SUBJECTS": "q.get", "COURIER_REPLY_MAX_WAITING": "-1"}), `COURIER_REPLY_MAX_WAITING="-1": must be at least 1 (or unset: 64 × COURIER_MAX_INFLIGHT)`},
		{"ack pending below inflight", with(map[string]string{"COURIER_MAX_INFLIGHT": "2000"}), `COURIER_MAX_ACK_PENDING="1000" (default): must be at least COURIER_MAX_INFLIGHT (2000), and should be far larger: messages waiting out a backoff count toward it…`},
		{"ack pending set low", with(map[string]string{"COURIER_MAX_ACK_PENDING": "4"}), `COURIER_MAX_ACK_PENDING="4": must be at least COURIER_MAX_INFLIGHT (8)…`},
		{"ack pending unlimited", with(map[string]string{"COURIER_MAX_ACK_PENDING": "-1"}), `COURIER_MAX_ACK_PENDING="-1": must be at least COURIER_MAX_INFLIGHT (8)…`},
		{"http timeout zero", with(map[string]string{"COURIER_HTTP_TIMEOUT": "0s"}), `COURIER_HTTP_TIMEOUT="0s": must be more than 0`},
		{"http timeout bad", with(map[string]string{"COURIER_HTTP_TIMEOUT": "5 s"}), `COURIER_HTTP_TIMEOUT="5 s": not a duration…`},
		{"backoff initial zero", with(map[string]string{"COURIER_BACKOFF_INITIAL": "0"}), `COURIER_BACKOFF_INITIAL="0": must be more than 0`},
		{"backoff max below initial", with(map[string]string{"COURIER_BACKOFF_INITIAL": "1m", "COURIER_BACKOFF_MAX": "30s"}), `COURIER_BACKOFF_MAX="30s": must be at least COURIER_BACKOFF_INITIAL (1m)`},
		{"backoff max negative", with(map[string]string{"COURIER_BACKOFF_MAX": "-2s"}), `COURIER_BACKOFF_MAX="-2s": must be at least COURIER_BACKOFF_INITIAL (1s)`},
		{"backoff initial bad, max fine", with(map[string]string{"COURIER_BACKOFF_INITIAL": "x", "COURIER_BACKOFF_MAX": "30s"}), `COURIER_BACKOFF_INITIAL="x": not a duration…`},
		{"multiplier below 1", with(map[string]string{"COURIER_BACKOFF_MULTIPLIER": "0.5"}), `COURIER_BACKOFF_MULTIPLIER="0.5": must be at least 1…`},
		{"multiplier nan", with(map[string]string{"COURIER_BACKOFF_MULTIPLIER": "NaN"}), `COURIER_BACKOFF_MULTIPLIER="NaN": not a finite number`},
		{"multiplier inf", with(map[string]string{"COURIER_BACKOFF_MULTIPLIER": "+Inf"}), `COURIER_BACKOFF_MULTIPLIER="+Inf": not a finite number`},
		{"multiplier word", with(map[string]string{"COURIER_BACKOFF_MULTIPLIER": "double"}), `COURIER_BACKOFF_MULTIPLIER="double": not a number`},
		{"retry after max zero", with(map[string]string{"COURIER_RETRY_AFTER_MAX": "0s"}), `COURIER_RETRY_AFTER_MAX="0s": must be more than 0`},
		{"retry statuses", with(map[string]string{"COURIER_RETRY_STATUSES": "500-"}), `COURIER_RETRY_STATUSES="500-": "500-" is not a status code or range (expected …`},
		{"max age negative", with(map[string]string{"COURIER_MAX_AGE": "-1h"}), `COURIER_MAX_AGE="-1h": must not be negative (0 means no limit)`},
		{"dlq wildcard", with(map[string]string{"COURIER_DLQ_SUBJECT": "dlq.*"}), `COURIER_DLQ_SUBJECT="dlq.*": must be a literal subject…`},
		{"dlq invalid", with(map[string]string{"COURIER_DLQ_SUBJECT": "dlq..x"}), `COURIER_DLQ_SUBJECT="dlq..x": is not a valid subject…`},
		{"dlq reserved", with(map[string]string{"COURIER_DLQ_SUBJECT": "$JS.API.STREAM.NAMES"}), `COURIER_DLQ_SUBJECT="$JS.API.STREAM.NAMES": subjects starting with $JS. are reserved by NATS`},
		{"replicas zero", with(map[string]string{"COURIER_STREAM_REPLICAS": "0"}), `COURIER_STREAM_REPLICAS="0": must be between 1 and 5`},
		{"replicas six", with(map[string]string{"COURIER_STREAM_REPLICAS": "6"}), `COURIER_STREAM_REPLICAS="6": must be between 1 and 5`},
		{"header space", with(map[string]string{"COURIER_IDEMPOTENCY_HEADER": "Idempotency Key"}), `COURIER_IDEMPOTENCY_HEADER="Idempotency Key": not a valid HTTP header name…`},
		{"header colon", with(map[string]string{"COURIER_IDEMPOTENCY_HEADER": "Key:"}), `COURIER_IDEMPOTENCY_HEADER="Key:": not a valid HTTP header name…`},
		{"dedup ttl negative", with(map[string]string{"COURIER_DEDUP_TTL": "-1s"}), `COURIER_DEDUP_TTL="-1s": must not be negative (0 turns dedup off)`},
		{"dedup store unknown", with(map[string]string{"COURIER_DEDUP_STORE": "redis"}), `COURIER_DEDUP_STORE="redis": must be badger (embedded, this courier's keys) or shared …`},
		{"dedup bucket invalid", with(map[string]string{"COURIER_DEDUP_BUCKET": "a.b"}), `COURIER_DEDUP_BUCKET="a.b": not a valid key-value bucket name: letters, digits, - and _ only`},
		{"dedup ttl subsecond", with(map[string]string{"COURIER_DEDUP_TTL": "500ms"}), `COURIER_DEDUP_TTL="500ms": must be at least 1s…`},
		{"admin addr", with(map[string]string{"COURIER_ADMIN_ADDR": "7415"}), `COURIER_ADMIN_ADDR="7415": not a listen address…`},
		{"admin addr no port", with(map[string]string{"COURIER_ADMIN_ADDR": "localhost:"}), `COURIER_ADMIN_ADDR="localhost:": not a listen address…`},
		{"log level", with(map[string]string{"COURIER_LOG_LEVEL": "verbose"}), `COURIER_LOG_LEVEL="verbose": expected debug, info, warn or error`},
		{"log level warning", with(map[string]string{"COURIER_LOG_LEVEL": "warning"}), `COURIER_LOG_LEVEL="warning": expected debug, info, warn or error`},
		{"log format", with(map[string]string{"COURIER_LOG_FORMAT": "logfmt"}), `COURIER_LOG_FORMAT="logfmt": expected text or json…`},
		{"shutdown grace", with(map[string]string{"COURIER_SHUTDOWN_GRACE": "-5s"}), `COURIER_SHUTDOWN_GRACE="-5s": must not be negative`},
		{"nats url scheme", with(map[string]string{"NATS_URL": "http://127.0.0.1:4222"}), `NATS_URL="http://127.0.0.1:4222": the scheme must be nats, tls, ws or wss`},
		{"nats url one of several", with(map[string]string{"NATS_URL": "nats://a:4222,http://b:4222"}), `NATS_URL="nats://a:4222,http://b:4222": "http://b:4222": the scheme must be nats, tls, ws or wss`},
		{"nats url no host", with(map[string]string{"NATS_URL": "nats://"}), `NATS_URL="nats://": no host…`},
		{"nats url only commas", with(map[string]string{"NATS_URL": " , "}), `NATS_URL=" , ": no server URL…`},
		{"nats url mixed websocket", with(map[string]string{"NATS_URL": "nats://a:4222,ws://b:8080"}), `NATS_URL="nats://a:4222,ws://b:8080": mixes websocket (ws, wss) and plain (nats, tls) URLs…`},
		{"cert without key", with(map[string]string{"NATS_CERT": tempFile(t, "c.pem")}), "NATS_CERT is set but NATS_KEY is not…"},
		{"key without cert", with(map[string]string{"NATS_KEY": tempFile(t, "k.pem")}), "NATS_KEY is set but NATS_CERT is not…"},
		{"user without password", with(map[string]string{"NATS_USER": "alice"}), "NATS_USER is set but NATS_PASSWORD is not…"},
		{"password without user", with(map[string]string{"NATS_PASSWORD": "s3cret"}), "NATS_PASSWORD is set but NATS_USER is not…"},
		{"token and user", with(map[string]string{"NATS_TOKEN": "t0k", "NATS_USER": "alice", "NATS_PASSWORD": "pw"}), "NATS_USER, NATS_TOKEN are all set: choose one way to authenticate…"},
		{"creds and nkey", with(map[string]string{"NATS_CREDS": tempFile(t, "u.creds"), "NATS_NKEY": tempFile(t, "u.nk")}), "NATS_CREDS, NATS_NKEY are all set: …"},
		{"creds missing", with(map[string]string{"NATS_CREDS": filepath.Join(dir, "none.creds")}), `NATS_CREDS="` + filepath.Join(dir, "none.creds") + `": cannot read the file: no such file or directory`},
		{"nkey directory", with(map[string]string{"NATS_NKEY": dir}), `NATS_NKEY="` + dir + `": is a directory, not a file`},
		{"ca missing", with(map[string]string{"NATS_CA": filepath.Join(dir, "ca.pem")}), `NATS_CA="` + filepath.Join(dir, "ca.pem") + `": cannot read the file: …`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problems(t, tt.environ)
			if len(got) != 1 {
				t.Fatalf("want one problem, got %d:\n%s", len(got), strings.Join(got, "\n"))
			}
			if prefix, ok := strings.CutSuffix(tt.want, "…"); ok {
				if !strings.HasPrefix(got[0], prefix) {
					t.Errorf("problem\n %q\nwant prefix\n %q", got[0], prefix)
				}
			} else if got[0] != tt.want {
				t.Errorf("problem\n %q\nwant\n %q", got[0], tt.want)
			}
		})
	}
}

// TestUnreadableFile needs permissions to mean something, which they do not
// to root.
func TestUnreadableFile(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads any file")
	}
	p := tempFile(t, "locked.creds")
	if err := os.Chmod(p, 0); err != nil {
		t.Fatal(err)
	}
	got := problems(t, with(map[string]string{"NATS_CREDS": p}))
	if len(got) != 1 || got[0] != `NATS_CREDS="`+p+`": cannot read the file: permission denied` {
		t.Errorf("problems %q", got)
	}
}

// TestAllProblemsAtOnce: parse errors of several variables and cross-field
// problems come back together, in the configuration table's order.
func TestAllProblemsAtOnce(t *testing.T) {
	got := problems(t, map[string]string{
		"COURIER_SHUTDOWN_GRACE":     "soon",
		"COURIER_MAX_DELIVER":        "abc",
		"COURIER_ACK_WAIT":           "30",
		"COURIER_BACKOFF_MULTIPLIER": "x",
		"COURIER_RETRY_STATUSES":     "abc,700,599-500,200",
		"COURIER_LOG_LEVEL":          "loud",
		"COURIER_MAX_INFLIGHT":       "0",
		"NATS_USER":                  "u",
		"COURIER_DEDUP_TTL":          "-1s",
	})
	want := []string{
		"NATS_USER is set but NATS_PASSWORD is not",
		"COURIER_STREAM is required",
		"COURIER_APP_URL is required",
		`COURIER_MAX_DELIVER="abc": not an integer`,
		`COURIER_ACK_WAIT="30": missing a unit`,
		`COURIER_MAX_INFLIGHT="0": must be at least 1`,
		`COURIER_BACKOFF_MULTIPLIER="x": not a number`,
		`COURIER_RETRY_STATUSES="abc,700,599-500,200": "abc" is not a status code or range; "700" is outside 100-599; "599-500" is backwards: the low end comes first; "200" includes 2xx`,
		`COURIER_DEDUP_TTL="-1s": must not be negative`,
		`COURIER_LOG_LEVEL="loud": expected debug, info, warn or error`,
		`COURIER_SHUTDOWN_GRACE="soon": not a duration`,
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d:\n %q\nwant prefix\n %q", i, got[i], want[i])
		}
	}
}

// TestNoDoubleBlame: a value that does not parse is not also blamed by the
// checks that would read the zero left in its place, nor are the values
// derived from it.
func TestNoDoubleBlame(t *testing.T) {
	tests := []struct {
		name    string
		environ map[string]string
		want    string
	}{
		{"inflight", with(map[string]string{"COURIER_MAX_INFLIGHT": "many"}), "COURIER_MAX_INFLIGHT"},
		{"ack pending", with(map[string]string{"COURIER_MAX_ACK_PENDING": "lots"}), "COURIER_MAX_ACK_PENDING"},
		{"backoff initial", with(map[string]string{"COURIER_BACKOFF_INITIAL": "1"}), "COURIER_BACKOFF_INITIAL"},
		{"backoff max", with(map[string]string{"COURIER_BACKOFF_MAX": "1"}), "COURIER_BACKOFF_MAX"},
		{"dedup ttl", with(map[string]string{"COURIER_DEDUP_TTL": "day"}), "COURIER_DEDUP_TTL"},
		{"replicas", with(map[string]string{"COURIER_STREAM_REPLICAS": "three"}), "COURIER_STREAM_REPLICAS"},
		// A bad stream name makes no default DLQ subject to blame.
		{"stream", with(map[string]string{"COURIER_STREAM": "a.b"}), "COURIER_STREAM"},
		{"consumer", with(map[string]string{"COURIER_CONSUMER": "a>b"}), "COURIER_CONSUMER"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problems(t, tt.environ)
			if len(got) != 1 || !strings.HasPrefix(got[0], tt.want+"=") {
				t.Errorf("want one problem with %s, got:\n%s", tt.want, strings.Join(got, "\n"))
			}
		})
	}
}

func TestDLQSubject(t *testing.T) {
	tests := []struct {
		name    string
		environ map[string]string
		want    string // DLQSubject, when valid
		problem string // prefix of the only problem, when not
	}{
		{"default", minimal(), "dlq.ORDERS.courier", ""},
		{"default with consumer", with(map[string]string{"COURIER_CONSUMER": "billing"}), "dlq.ORDERS.billing", ""},
		{"explicit", with(map[string]string{"COURIER_DLQ_SUBJECT": "dead.letters"}), "dead.letters", ""},
		{"subjects elsewhere", with(map[string]string{"COURIER_SUBJECTS": "orders.>,payments.*"}), "dlq.ORDERS.courier", ""},
		{"filter one token short", with(map[string]string{"COURIER_SUBJECTS": "dlq.ORDERS"}), "dlq.ORDERS.courier", ""},
		{"filter one token long", with(map[string]string{"COURIER_SUBJECTS": "dlq.ORDERS.courier.x"}), "dlq.ORDERS.courier", ""},
		// Without COURIER_SUBJECTS the stream's subjects decide, at run time.
		{"no subjects: not checked here", with(map[string]string{"COURIER_DLQ_SUBJECT": "orders.dlq"}), "orders.dlq", ""},
		{"default matched by >", with(map[string]string{"COURIER_SUBJECTS": ">"}), "",
			`COURIER_DLQ_SUBJECT="dlq.ORDERS.courier" (default): matched by the filter subject ">" of COURIER_SUBJECTS, so courier would consume its own dead letters`},
		{"default matched by dlq.>", with(map[string]string{"COURIER_SUBJECTS": "orders.*,dlq.>"}), "",
			`COURIER_DLQ_SUBJECT="dlq.ORDERS.courier" (default): matched by the filter subject "dlq.>"`},
		{"explicit matched by *", with(map[string]string{"COURIER_SUBJECTS": "orders.*", "COURIER_DLQ_SUBJECT": "orders.dlq"}), "",
			`COURIER_DLQ_SUBJECT="orders.dlq": matched by the filter subject "orders.*"`},
		{"explicit equal to filter", with(map[string]string{"COURIER_SUBJECTS": "a.b", "COURIER_DLQ_SUBJECT": "a.b"}), "",
			`COURIER_DLQ_SUBJECT="a.b": matched by the filter subject "a.b"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.problem == "" {
				if got := mustLoad(t, tt.environ).DLQSubject; got != tt.want {
					t.Errorf("DLQSubject = %q, want %q", got, tt.want)
				}
				return
			}
			got := problems(t, tt.environ)
			if len(got) != 1 || !strings.HasPrefix(got[0], tt.problem) {
				t.Errorf("problems:\n%s\nwant one starting\n %s", strings.Join(got, "\n"), tt.problem)
			}
		})
	}
}

func TestParseStatusSet(t *testing.T) {
	tests := []struct {
		in, want string // want: String() of the set
	}{
		{"408,429,500,502-599", "408,429,500,502-599"},
		{"500-599", "500-599"},
		{" 503 , 429 ,, 408 ", "408,429,503"},
		{"500,501,502", "500-502"},
		{"500-510,505-520", "500-520"},
		{"510-520,500-509", "500-520"},
		{"500-500", "500"},
		{"429,429", "429"},
		{"100-199,300-599", "100-199,300-599"},
		{"599", "599"},
		{" 500 - 503 ", "500-503"},
	}
	for _, tt := range tests {
		s, err := ParseStatusSet(tt.in)
		if err != nil {
			t.Errorf("ParseStatusSet(%q): %v", tt.in, err)
			continue
		}
		if got := s.String(); got != tt.want {
			t.Errorf("ParseStatusSet(%q).String() = %q, want %q", tt.in, got, tt.want)
		}
		// The canonical text reads back as the same set.
		again, err := ParseStatusSet(s.String())
		if err != nil || !reflect.DeepEqual(again, s) {
			t.Errorf("ParseStatusSet(%q) does not read back: %v, %v", s.String(), again, err)
		}
	}
}

func TestParseStatusSetErrors(t *testing.T) {
	tests := []struct {
		in   string
		want string // in the error
	}{
		{"", "no status codes"},
		{" , ,", "no status codes"},
		{"abc", `"abc" is not a status code or range`},
		{"5xx", `"5xx" is not a status code or range`},
		{"500-", `"500-" is not a status code or range`},
		{"-500", `"-500" is not a status code or range`},
		{"500-600-700", `"500-600-700" is not a status code or range`},
		{"99", `"99" is outside 100-599`},
		{"600", `"600" is outside 100-599`},
		{"500-600", `"500-600" is outside 100-599`},
		{"599-500", `"599-500" is backwards`},
		{"204", `"204" includes 2xx`},
		{"100-599", `"100-599" includes 2xx`},
		{"abc,999", `"abc" is not a status code or range; "999" is outside 100-599`},
	}
	for _, tt := range tests {
		_, err := ParseStatusSet(tt.in)
		if err == nil {
			t.Errorf("ParseStatusSet(%q): no error, want %q", tt.in, tt.want)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "expected status codes") {
			t.Errorf("ParseStatusSet(%q) = %q, want it to contain %q and the expected syntax", tt.in, err, tt.want)
		}
	}
}

func TestStatusSetContains(t *testing.T) {
	s, err := ParseStatusSet("408,429,500,502-599")
	if err != nil {
		t.Fatal(err)
	}
	for code, want := range map[int]bool{
		100: false, 200: false, 404: false, 407: false, 408: true, 409: false, 429: true,
		499: false, 500: true, 501: false, 502: true, 503: true, 599: true, 600: false, -1: false,
	} {
		if got := s.Contains(code); got != want {
			t.Errorf("Contains(%d) = %v, want %v", code, got, want)
		}
	}
	var zero StatusSet
	if zero.Contains(500) || zero.String() != "" {
		t.Errorf("zero StatusSet: Contains(500) = %v, String() = %q", zero.Contains(500), zero.String())
	}
}

func TestEnviron(t *testing.T) {
	got := Environ([]string{
		"A=1", "B=x=y", "EMPTY=", "NOEQUALS", "=C:=C:\\", "A=2",
	})
	want := map[string]string{"A": "1", "B": "x=y", "EMPTY": ""}
	if !maps.Equal(got, want) {
		t.Errorf("Environ = %q, want %q", got, want)
	}
	if m := Environ(nil); m == nil || len(m) != 0 {
		t.Errorf("Environ(nil) = %#v, want an empty map", m)
	}
}

// secrets are planted in an environment and must never be shown.
const (
	urlPassword = "url-pa55"
	urlToken    = "url-t0ken"
	appPassword = "app-pa55"
	password    = "natspa55"
	token       = "natst0ken"
)

func TestRedaction(t *testing.T) {
	// Two environments, as a password and a token cannot both be set.
	envs := []map[string]string{
		with(map[string]string{
			"NATS_URL":               "nats://alice:" + urlPassword + "@a:4222, nats://" + urlToken + "@b:4222",
			"NATS_USER":              "alice",
			"NATS_PASSWORD":          password,
			"COURIER_APP_URL":        "http://bob:" + appPassword + "@127.0.0.1:8080/m?to=x@y",
			"COURIER_APP_HEALTH_URL": "http://bob:" + appPassword + "@127.0.0.1:8080/health",
		}),
		with(map[string]string{"NATS_TOKEN": token}),
	}
	for _, environ := range envs {
		cfg := mustLoad(t, environ)

		var out strings.Builder
		if err := WriteTable(&out, Describe(cfg)); err != nil {
			t.Fatal(err)
		}
		var logged bytes.Buffer
		slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "config", cfg)
		r := cfg.Redacted()
		shown := map[string]string{
			"table":    out.String(),
			"log":      logged.String(),
			"redacted": r.NATSURL + r.NATSPassword + r.NATSToken + r.AppURL + r.AppHealthURL,
		}
		for where, text := range shown {
			for _, secret := range []string{urlPassword, urlToken, appPassword, password, token} {
				if strings.Contains(text, secret) {
					t.Errorf("%s shows the secret %q:\n%s", where, secret, text)
				}
			}
		}
		if !strings.Contains(logged.String(), `"COURIER_STREAM":"ORDERS"`) {
			t.Errorf("log lacks the stream: %s", logged.String())
		}
	}

	cfg := mustLoad(t, envs[0])
	vars := map[string]Var{}
	for _, v := range Describe(cfg) {
		vars[v.Name] = v
	}
	for name, want := range map[string]string{
		"NATS_URL":               "nats://alice:[redacted]@a:4222, nats://[redacted]@b:4222",
		"NATS_USER":              "alice",
		"NATS_PASSWORD":          "[redacted]",
		"NATS_TOKEN":             "",
		"COURIER_APP_URL":        "http://bob:[redacted]@127.0.0.1:8080/m?to=x@y",
		"COURIER_APP_HEALTH_URL": "http://bob:[redacted]@127.0.0.1:8080/health",
	} {
		if got := vars[name].Value; got != want {
			t.Errorf("%s: Value %q, want %q", name, got, want)
		}
	}
	if !vars["NATS_PASSWORD"].Secret || !vars["NATS_TOKEN"].Secret || vars["NATS_URL"].Secret {
		t.Error("Secret must be set for NATS_PASSWORD and NATS_TOKEN alone")
	}
	// Redacted is a copy: the original keeps its secrets to connect with.
	if cfg.Redacted(); cfg.NATSPassword != password {
		t.Errorf("Redacted changed the original: NATSPassword = %q", cfg.NATSPassword)
	}
}

// TestRedactionInProblems: a problem quoting a secret variable redacts it.
func TestRedactionInProblems(t *testing.T) {
	got := problems(t, with(map[string]string{
		"NATS_URL":        "nats://alice:" + urlPassword + "/x@a:4222,ftp://" + urlToken + "@b",
		"NATS_PASSWORD":   password,
		"COURIER_APP_URL": "ftp://bob:" + appPassword + "@app/x",
	}))
	text := strings.Join(got, "\n")
	for _, secret := range []string{urlPassword, urlToken, appPassword, password} {
		if strings.Contains(text, secret) {
			t.Errorf("problems show the secret %q:\n%s", secret, text)
		}
	}
	if len(got) != 4 { // bad URL, bad scheme, password without user, app URL scheme
		t.Errorf("want 4 problems, got:\n%s", text)
	}
}

func TestRedactURL(t *testing.T) {
	nats := []struct{ in, want string }{
		{"", ""},
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://u:p@h:4222", "nats://u:[redacted]@h:4222"},
		{"nats://tok@h", "nats://[redacted]@h"},
		{"u:p@h:4222", "u:[redacted]@h:4222"},
		{"nats://u:p@ss/w#rd@h", "nats://u:[redacted]@h"},
		{"nats://u:@h", "nats://u:[redacted]@h"},
		{"nats://a:1@x, tls://b:2@y", "nats://a:[redacted]@x, tls://b:[redacted]@y"},
	}
	for _, tt := range nats {
		if got := redactNATSURLs(tt.in); got != tt.want {
			t.Errorf("redactNATSURLs(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	web := []struct{ in, want string }{
		{"", ""},
		{"http://h/p", "http://h/p"},
		{"http://u:p@h/p", "http://u:[redacted]@h/p"},
		{"http://u@h/p", "http://u@h/p"}, // a user name alone is no secret over HTTP
		{"http://h/p?mail=a@b", "http://h/p?mail=a@b"},
		{"http://u:p@h/p?mail=a@b", "http://u:[redacted]@h/p?mail=a@b"},
		{"http://u:p/x@h/", "http://u:[redacted]@h/"}, // does not parse: all after the user is hidden
	}
	for _, tt := range web {
		if got := redactHTTPURL(tt.in); got != tt.want {
			t.Errorf("redactHTTPURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestWriteTable(t *testing.T) {
	var out strings.Builder
	vars := []Var{
		{Name: "A", Meaning: "first", Default: "1", Value: "1"},
		{Name: "LONGER_NAME", Meaning: "second", Default: "unset", Value: ""},
		{Name: "C", Meaning: "third", Default: "x", Value: "a\tb"},
		{Name: "D", Meaning: "fourth", Default: "  ", Value: "\x1b[2Jwiped\r\n"},
	}
	if err := WriteTable(&out, vars); err != nil {
		t.Fatal(err)
	}
	// A tab, a line break or a terminal escape would break the table or
	// the terminal: each becomes a space.
	want := "" +
		"VARIABLE     VALUE     DEFAULT  MEANING\n" +
		"A            1         1        first\n" +
		"LONGER_NAME  -         unset    second\n" +
		"C            a b       x        third\n" +
		"D            [2Jwiped  -        fourth\n"
	if out.String() != want {
		t.Errorf("WriteTable:\n%s\nwant:\n%s", out.String(), want)
	}

	// Every variable gets its line, the header too.
	out.Reset()
	if err := WriteTable(&out, Describe(mustLoad(t, minimal()))); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(out.String(), "\n"); lines != len(specOrder())+1 {
		t.Errorf("WriteTable wrote %d lines, want %d", lines, len(specOrder())+1)
	}

	if err := WriteTable(failingWriter{}, vars); err == nil {
		t.Error("WriteTable to a failing writer: no error")
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

func TestSlogLevel(t *testing.T) {
	for level, want := range map[string]slog.Level{
		"debug": slog.LevelDebug, "Info": slog.LevelInfo, "WARN": slog.LevelWarn, "error": slog.LevelError,
	} {
		cfg := mustLoad(t, with(map[string]string{"COURIER_LOG_LEVEL": level}))
		if got := cfg.SlogLevel(); got != want {
			t.Errorf("COURIER_LOG_LEVEL=%s: SlogLevel() = %v, want %v", level, got, want)
		}
	}
}

func TestDedupEnabled(t *testing.T) {
	for ttl, want := range map[string]bool{"": true, "0": false, "0s": false, "1s": true, "720h": true} {
		if got := mustLoad(t, with(map[string]string{"COURIER_DEDUP_TTL": ttl})).DedupEnabled(); got != want {
			t.Errorf("COURIER_DEDUP_TTL=%q: DedupEnabled() = %v, want %v", ttl, got, want)
		}
	}
}

func TestUnknownVars(t *testing.T) {
	got := UnknownVars(with(map[string]string{
		"COURIER_MAXDELIVER": "3", "COURIER_ACKWAIT": "1m", "COURIER_MAX_DELIVER": "3",
		"NATS_CONTEXT": "x", "HOME": "/root",
	}))
	if want := []string{"COURIER_ACKWAIT", "COURIER_MAXDELIVER"}; !slices.Equal(got, want) {
		t.Errorf("UnknownVars = %q, want %q", got, want)
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                               "0",
		time.Second:                     "1s",
		1500 * time.Millisecond:         "1.5s",
		10 * time.Minute:                "10m",
		24 * time.Hour:                  "24h",
		90 * time.Minute:                "1h30m",
		time.Hour + 30*time.Second:      "1h0m30s",
		-time.Minute:                    "-1m",
		250 * time.Millisecond:          "250ms",
		time.Hour + time.Minute + 1*1e9: "1h1m1s",
	} {
		got := formatDuration(d)
		if got != want {
			t.Errorf("formatDuration(%v) = %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(got); err != nil || back != d {
			t.Errorf("formatDuration(%v) = %q does not read back: %v, %v", d, got, back, err)
		}
	}
}

// TestUnixSocketURLs checks that the URLs courier sends to may name a Unix
// socket, with or without a request path.
func TestUnixSocketURLs(t *testing.T) {
	cfg := mustLoad(t, with(map[string]string{
		"COURIER_APP_URL":        "unix:///run/app/app.sock:/messages",
		"COURIER_APP_HEALTH_URL": "unix:///run/app/app.sock:/healthz",
		"COURIER_REPLY_SUBJECTS": "q",
	}))
	if cfg.AppURL != "unix:///run/app/app.sock:/messages" || cfg.ReplyURL != cfg.AppURL {
		t.Errorf("AppURL %q, ReplyURL %q: want the socket URL as given, the reply URL following it", cfg.AppURL, cfg.ReplyURL)
	}
	mustLoad(t, with(map[string]string{"COURIER_APP_URL": "unix:///run/app.sock"}))
}

// TestReplyMaxWaitingDefault: unset, 64 per COURIER_MAX_INFLIGHT slot, as
// `courier config` shows it; set, as given.
func TestReplyMaxWaitingDefault(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{minimal(), "512"},
		{with(map[string]string{"COURIER_MAX_INFLIGHT": "2"}), "128"},
		{with(map[string]string{"COURIER_REPLY_MAX_WAITING": "10"}), "10"},
	} {
		for _, v := range Describe(mustLoad(t, c.env)) {
			if v.Name == "COURIER_REPLY_MAX_WAITING" && v.Value != c.want {
				t.Errorf("%v: COURIER_REPLY_MAX_WAITING in effect %q, want %q", c.env, v.Value, c.want)
			}
		}
	}
}
