package config

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/courierhq/courier/internal/printable"
)

// Var describes one environment variable for `courier config`.
type Var struct {
	// Name is the environment variable, such as COURIER_MAX_DELIVER.
	Name string
	// Meaning is a short description, as in the README's configuration table.
	Meaning string
	// Default is the default as that table states it: a value, or words such
	// as "required", "unset" or "dlq.<stream>.<consumer>".
	Default string
	// Value is the value in effect, formatted as it could be set. Secrets
	// are "[redacted]": the whole value when Secret is true, the password
	// alone inside URLs (NATS_URL, COURIER_APP_URL, COURIER_APP_HEALTH_URL).
	// An unset value without a default stays "". A value that is invalid
	// is shown as it was given (redacted likewise), not as what Load left
	// in its place.
	Value string
	// Secret is true for the variables whose whole value is withheld:
	// NATS_PASSWORD, NATS_TOKEN and the OTLP headers.
	Secret bool
	// Problems are what is wrong with the variable, as in *Error; none
	// when it is fine. Only Inspect and InspectSubscriptions fill them in.
	Problems []string
	// PerSubscription is true for the variables of one message's path,
	// which each subscription of COURIER_SUBSCRIPTIONS may set for itself
	// as COURIER_SUB_<NAME>_<VAR>.
	PerSubscription bool
	// Source is, in InspectSubscriptions' Vars only, where the value came
	// from, as Subscription.Source says.
	Source string
}

// spec is one row of the README's configuration table
// (README.md#configuration): the single list that orders
// Describe's output and the problems of an *Error.
type spec struct {
	name, meaning, def string
	secret             bool
	// perSub marks a variable of one message's path: with
	// COURIER_SUBSCRIPTIONS, each subscription may set it as
	// COURIER_SUB_<NAME>_<VAR> (subscriptions.go).
	perSub bool
	value  func(Config) string // of a Config already redacted
}

func specs() []spec {
	return []spec{
		{"NATS_URL", "server URL(s), comma separated", "nats://127.0.0.1:4222", false, false, func(c Config) string { return c.NATSURL }},
		{"NATS_CREDS", "credentials file, as in the nats CLI", "unset", false, false, func(c Config) string { return c.NATSCreds }},
		{"NATS_NKEY", "NKey seed file", "unset", false, false, func(c Config) string { return c.NATSNKey }},
		{"NATS_USER", "user name (with NATS_PASSWORD)", "unset", false, false, func(c Config) string { return c.NATSUser }},
		{"NATS_PASSWORD", "password (with NATS_USER)", "unset", true, false, func(c Config) string { return c.NATSPassword }},
		{"NATS_TOKEN", "authentication token", "unset", true, false, func(c Config) string { return c.NATSToken }},
		{"NATS_CA", "CA certificate file for TLS", "unset", false, false, func(c Config) string { return c.NATSCA }},
		{"NATS_CERT", "client certificate file for TLS", "unset", false, false, func(c Config) string { return c.NATSCert }},
		{"NATS_KEY", "client private key file for TLS", "unset", false, false, func(c Config) string { return c.NATSKey }},
		{"COURIER_STREAM", "stream to consume (must exist; courier does not create it)", "required (unless only COURIER_REPLY_SUBJECTS are served)", false, true, func(c Config) string { return c.Stream }},
		{"COURIER_CONSUMER", "durable consumer name; created or updated by courier", "courier", false, true, func(c Config) string { return c.Consumer }},
		{"COURIER_SUBJECTS", "filter subjects, comma separated", "all of the stream", false, true, func(c Config) string { return strings.Join(c.Subjects, ",") }},
		{"COURIER_APP_URL", "where each message is POSTed: http(s)://..., or unix:///path/to.sock[:/request-path]", "required (unless only COURIER_REPLY_SUBJECTS are served)", false, true, func(c Config) string { return c.AppURL }},
		{"COURIER_APP_HEALTH_URL", "polled before consuming and during outages", "unset", false, true, func(c Config) string { return c.AppHealthURL }},
		{"COURIER_DELIVER_POLICY", "where a new durable starts: all or new (fixed once created)", "all", false, true, func(c Config) string { return c.DeliverPolicy }},
		{"COURIER_MAX_DELIVER", "delivery attempts per message, the first included", "5", false, true, func(c Config) string { return strconv.Itoa(c.MaxDeliver) }},
		{"COURIER_ACK_WAIT", "JetStream ack wait", "30s", false, true, func(c Config) string { return formatDuration(c.AckWait) }},
		{"COURIER_MAX_INFLIGHT", "concurrent HTTP requests to the app: a number, or auto / auto:N: courier finds the number from the app's answers (raised while answer times stay near the lowest measured lately, lowered when they grow, on 429, 503 and timeouts), between 1 and N (default 64); N or the number at most 10000, and times COURIER_BATCH_MAX at most 100000", "8", false, true, func(c Config) string { return c.inflightString() }},
		{"COURIER_MAX_ACK_PENDING", "consumer's ack-pending limit (messages in flight or waiting out a backoff)", "1000", false, true, func(c Config) string { return strconv.Itoa(c.MaxAckPending) }},
		{"COURIER_HTTP_TIMEOUT", "per-request timeout", "30s", false, true, func(c Config) string { return formatDuration(c.HTTPTimeout) }},
		{"COURIER_BACKOFF_INITIAL", "retry schedule before jitter: first delay", "1s", false, true, func(c Config) string { return formatDuration(c.BackoffInitial) }},
		{"COURIER_BACKOFF_MAX", "retry schedule before jitter: longest delay", "10m", false, true, func(c Config) string { return formatDuration(c.BackoffMax) }},
		{"COURIER_BACKOFF_MULTIPLIER", "retry schedule before jitter: growth per attempt", "2", false, true, func(c Config) string { return strconv.FormatFloat(c.BackoffMultiplier, 'g', -1, 64) }},
		{"COURIER_RETRY_AFTER_MAX", "cap on an app's Retry-After", "10m", false, true, func(c Config) string { return formatDuration(c.RetryAfterMax) }},
		{"COURIER_RETRY_STATUSES", "statuses treated as transient", "408,409,425,429,500,502-599", false, true, func(c Config) string { return c.RetryStatuses.String() }},
		{"COURIER_MAX_AGE", "older messages (stream timestamp) are dead-lettered instead of sent; 0 = never", "0", false, true, func(c Config) string { return formatDuration(c.MaxAge) }},
		{"COURIER_DLQ_SUBJECT", "dead-letter subject", "dlq.<stream>.<consumer>", false, true, func(c Config) string { return c.DLQSubject }},
		{"COURIER_STREAM_REPLICAS", "replicas of the streams courier creates (dead letters, captured advisories)", "1", false, false, func(c Config) string { return strconv.Itoa(c.StreamReplicas) }},
		{"COURIER_IDEMPOTENCY_HEADER", "header that carries the idempotency key", "Idempotency-Key", false, true, func(c Config) string { return c.IdempotencyHeader }},
		{"COURIER_DEDUP_DIR", "Badger directory", "./courier-data", false, false, func(c Config) string { return c.DedupDir }},
		{"COURIER_DEDUP_TTL", "how long a processed key is remembered; 0 = no dedup", "24h", false, true, func(c Config) string { return formatDuration(c.DedupTTL) }},
		{"COURIER_DEDUP_STORE", "badger: embedded, this courier's keys only; shared: keys shared by every courier of the durable through a replicated key-value bucket, the embedded store as a local cache", "badger", false, false, func(c Config) string { return c.DedupStore }},
		{"COURIER_DEDUP_BUCKET", "the bucket of the shared store (COURIER_STREAM_REPLICAS replicas; keys scoped by stream and consumer)", "COURIER_DEDUP", false, false, func(c Config) string { return c.DedupBucket }},
		{"COURIER_BREAKER_FAILURES", "transient failures in a row (from more than one message) after which courier stops sending and probes; 0 = never", "10", false, true, func(c Config) string { return strconv.Itoa(c.BreakerFailures) }},
		{"COURIER_BREAKER_PROBE", "wait before the first probe while stopped (the app's Retry-After wins; doubles per failed probe up to COURIER_BREAKER_PROBE_MAX)", "5s", false, true, func(c Config) string { return formatDuration(c.BreakerProbe) }},
		{"COURIER_BREAKER_PROBE_MAX", "longest wait between two probes while stopped, never below COURIER_BREAKER_PROBE (the app's Retry-After wins)", "30s", false, true, func(c Config) string { return formatDuration(c.BreakerProbeMax) }},
		{"COURIER_MAX_RATE", "requests per second to the app, all messages together; 0 = no limit", "0", false, true, func(c Config) string { return strconv.FormatFloat(c.MaxRate, 'g', -1, 64) }},
		{"COURIER_SUCCESS_SUBJECT", "where the app's answer to each 2xx is published; unset = nowhere", "unset", false, true, func(c Config) string { return c.SuccessSubject }},
		{"COURIER_REPLY_SUBJECTS", "subjects courier answers as a NATS service: request → POST → reply; unset = none", "unset", false, false, func(c Config) string { return strings.Join(c.ReplySubjects, ",") }},
		{"COURIER_REPLY_URL", "where requests on COURIER_REPLY_SUBJECTS are POSTed", "COURIER_APP_URL", false, false, func(c Config) string { return c.ReplyURL }},
		{"COURIER_REPLY_MAX_WAITING", "requests that may wait for a free COURIER_MAX_INFLIGHT slot; beyond it a request is answered 503 busy at once", "64 × COURIER_MAX_INFLIGHT", false, false, func(c Config) string { return strconv.Itoa(c.EffectiveReplyMaxWaiting()) }},
		{"COURIER_ORDER_KEY", "per-key order: subject:N (the subject's N-th token) or header:NAME; messages of one key reach the app one at a time, in stream order; unset = no order", "unset", false, true, func(c Config) string { return c.OrderKey }},
		{"COURIER_ORDER_PARTITIONS", "with COURIER_ORDER_KEY=subject:N: partitions of the durable by key, shared out among the replicas (each partition one replica at a time); 0 = one replica at a time for the whole durable", "0", false, true, func(c Config) string { return strconv.Itoa(c.OrderPartitions) }},
		{"COURIER_BATCH_MAX", "messages per request to the app (a JSON batch, answered per entry); 1 = one message per request", "1", false, true, func(c Config) string { return strconv.Itoa(c.BatchMax) }},
		{"COURIER_BATCH_WAIT", "how long a batch waits to fill after its first entry, from 1µs to 1m (0 is refused: every entry would go alone)", "2ms", false, true, func(c Config) string { return formatDuration(c.BatchWait) }},
		{"COURIER_BATCH_BYTES", "the most message data one batch carries (a larger message goes alone)", "1048576", false, true, func(c Config) string { return strconv.Itoa(c.BatchBytes) }},
		{"COURIER_CLOUDEVENTS", "binary: requests carry CloudEvents 1.0 attributes as ce-* headers; unset = off", "unset", false, true, func(c Config) string { return c.CloudEvents }},
		{"COURIER_SIGNING_SECRETS_FILE", "file of Standard Webhooks secrets (whsec_..., one a line): every request to the app is signed; re-read when it changes", "unset", false, false, func(c Config) string { return c.SigningSecretsFile }},
		{"COURIER_APP_TOKEN_FILE", "file holding a token sent as Authorization: Bearer <token> to the app; re-read when it changes", "unset", false, false, func(c Config) string { return c.AppTokenFile }},
		{"COURIER_PUBLISH_ADDR", "where the app publishes through courier: POST /v1/publish/<subject>, or a batch to /v1/publish-batch; a bare :port listens on " + DefaultPublishHost + "; unset = off", "unset", false, false, func(c Config) string { return c.PublishAddr }},
		{"COURIER_PUBLISH_SUBJECTS", "subjects (NATS wildcards allowed) the app may publish to; required with COURIER_PUBLISH_ADDR", "unset", false, false, func(c Config) string { return strings.Join(c.PublishSubjects, ",") }},
		{"COURIER_SCHEDULE_PREFIX", "where delayed publishes (Courier-Delay, Courier-Deliver-At) wait for their time: <prefix>.<STREAM>.<id> in the stream of their subject, which must capture it; courier's durables leave it out", "_sched", false, false, func(c Config) string { return c.SchedulePrefix }},
		{"COURIER_ROUTES", "PATTERN=PATH pairs, comma separated: a message whose subject matches the NATS subject pattern (first match wins) is POSTed to that path (and query) of COURIER_APP_URL's origin; others to COURIER_APP_URL", "unset", false, true, func(c Config) string { return c.Routes.String() }},
		{"COURIER_SUBSCRIPTIONS", "names (letters and digits) of several subscriptions served by one courier, each set by COURIER_SUB_<NAME>_<VAR> (the variables marked per subscription), falling back to the plain COURIER_<VAR>; unset = one, set by the plain variables", "unset", false, false, func(c Config) string { return strings.Join(c.SubscriptionNames, ",") }},
		{"COURIER_ADMIN_ADDR", "address of /healthz, /readyz, /metrics", DefaultAdminAddr, false, false, func(c Config) string { return c.AdminAddr }},
		{"COURIER_LOG_LEVEL", "debug, info, warn or error", "info", false, false, func(c Config) string { return c.LogLevel }},
		{"COURIER_LOG_FORMAT", "text (tint) or json", "text on a terminal, else json", false, false, func(c Config) string { return c.LogFormat }},
		{"COURIER_SHUTDOWN_GRACE", "time in-flight requests get after SIGTERM", "25s", false, false, func(c Config) string { return formatDuration(c.ShutdownGrace) }},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "OpenTelemetry collector; set (or the next), tracing is on: a span per delivery attempt. For http/protobuf a base URL, /v1/traces appended", "unset: tracing off", false, false, func(c Config) string { return c.OTLPEndpoint }},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "where spans go, used as it is; wins over OTEL_EXPORTER_OTLP_ENDPOINT", "unset", false, false, func(c Config) string { return c.OTLPTracesEndpoint }},
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc or http/protobuf", ProtocolHTTPProtobuf, false, false, func(c Config) string { return c.OTLPProtocol }},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc or http/protobuf, for spans; wins over OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL", false, false, func(c Config) string { return c.OTLPTracesProtocol }},
		{"OTEL_EXPORTER_OTLP_HEADERS", "headers sent to the collector: name=value, comma separated, values percent-encoded", "unset", true, false, func(c Config) string { return c.OTLPHeaders }},
		{"OTEL_EXPORTER_OTLP_TRACES_HEADERS", "headers sent with spans; replaces OTEL_EXPORTER_OTLP_HEADERS", "unset", true, false, func(c Config) string { return c.OTLPTracesHeaders }},
		{"OTEL_EXPORTER_OTLP_INSECURE", "true: plaintext to a gRPC endpoint given as host:port (a URL's scheme decides otherwise)", "false", false, false, func(c Config) string { return strconv.FormatBool(c.OTLPInsecure) }},
		{"OTEL_EXPORTER_OTLP_TRACES_INSECURE", "the same, for spans; wins over OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE", false, false, func(c Config) string {
			if c.OTLPTracesInsecure == nil {
				return ""
			}
			return strconv.FormatBool(*c.OTLPTracesInsecure)
		}},
		{"OTEL_SERVICE_NAME", "service.name of courier's spans", DefaultServiceName + " (or service.name in OTEL_RESOURCE_ATTRIBUTES)", false, false, func(c Config) string { return c.TracesServiceName() }},
		{"OTEL_RESOURCE_ATTRIBUTES", "more attributes of courier's spans: key=value, comma separated, values percent-encoded", "unset", false, false, func(c Config) string { return c.OTELResourceAttributes }},
		{"OTEL_TRACES_SAMPLER", "which traces are recorded: " + strings.Join(samplers, ", "), "parentbased_always_on", false, false, func(c Config) string { return c.OTELTracesSampler }},
		{"OTEL_TRACES_SAMPLER_ARG", "ratio from 0 to 1 of the traceidratio samplers", "1", false, false, func(c Config) string { return c.OTELTracesSamplerArg }},
		{"OTEL_SDK_DISABLED", "true: no tracing, whatever the endpoint", "false", false, false, func(c Config) string { return strconv.FormatBool(c.OTELSDKDisabled) }},
	}
}

// Describe returns one Var per environment variable, in the order of the
// README's configuration table, with the values of cfg in effect and its
// secrets redacted.
func Describe(cfg Config) []Var {
	r := cfg.Redacted()
	ss := specs()
	vars := make([]Var, len(ss))
	for i, s := range ss {
		vars[i] = Var{Name: s.name, Meaning: s.meaning, Default: s.def, Value: s.value(r), Secret: s.secret, PerSubscription: s.perSub}
	}
	return vars
}

// WriteTable writes vars as an aligned table with a header line, for
// people: an empty cell shows as "-", a value that would break the layout
// (a tab, a newline) is quoted, and a value with problems is followed by
// "(invalid)".
func WriteTable(w io.Writer, vars []Var) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var err error
	row := func(cells ...string) {
		if err == nil {
			_, err = fmt.Fprintln(tw, strings.Join(cells, "\t"))
		}
	}
	row("VARIABLE", "VALUE", "DEFAULT", "MEANING")
	for _, v := range vars {
		value := cell(v.Value)
		if len(v.Problems) > 0 && v.Value != "" {
			value += " (invalid)"
		}
		row(cell(v.Name), value, cell(v.Default), cell(v.Meaning))
	}
	if err != nil {
		return err
	}
	return tw.Flush()
}

// cell makes s one printable line for the table, "-" when nothing is left
// of it.
func cell(s string) string {
	if s = printable.Line(s, 0); s == "" {
		return "-"
	}
	return s
}

// Redacted returns a copy of c that is safe to log or print: NATS_PASSWORD
// and NATS_TOKEN become "[redacted]" (empty stays empty), and so does a
// password in the userinfo of NATS_URL (or a bare token there, as in
// nats://token@host), COURIER_APP_URL, COURIER_APP_HEALTH_URL,
// COURIER_REPLY_URL or the OTLP endpoints; the OTLP headers become
// "[redacted]" whole. It must not be used to connect.
func (c Config) Redacted() Config {
	c.NATSURL = redactNATSURLs(c.NATSURL)
	c.NATSPassword = redactSecret(c.NATSPassword)
	c.NATSToken = redactSecret(c.NATSToken)
	c.AppURL = redactHTTPURL(c.AppURL)
	c.AppHealthURL = redactHTTPURL(c.AppHealthURL)
	c.ReplyURL = redactHTTPURL(c.ReplyURL)
	c.OTLPEndpoint = redactHTTPURL(c.OTLPEndpoint)
	c.OTLPTracesEndpoint = redactHTTPURL(c.OTLPTracesEndpoint)
	c.OTLPHeaders = redactSecret(c.OTLPHeaders)
	c.OTLPTracesHeaders = redactSecret(c.OTLPTracesHeaders)
	c.Subjects = slices.Clone(c.Subjects) // the copy shares nothing mutable
	c.ReplySubjects = slices.Clone(c.ReplySubjects)
	c.PublishSubjects = slices.Clone(c.PublishSubjects)
	return c
}

// LogValue implements slog.LogValuer, so that logging a Config logs its
// variables by name, redacted, leaving out those that are empty.
func (c Config) LogValue() slog.Value {
	vars := Describe(c)
	attrs := make([]slog.Attr, 0, len(vars))
	for _, v := range vars {
		if v.Value != "" {
			attrs = append(attrs, slog.String(v.Name, v.Value))
		}
	}
	return slog.GroupValue(attrs...)
}

// UnknownVars returns, sorted, the names in environ that start with
// COURIER_ but are none of courier's variables: most likely misspelt, and
// otherwise silently ignored. Load does not fail on them; the caller may
// warn. The variables of subscriptions (COURIER_SUB_<NAME>_<VAR>) are not
// among them: Load checks their names, and fails on a wrong one.
func UnknownVars(environ map[string]string) []string {
	known := map[string]bool{}
	for _, s := range specs() {
		known[s.name] = true
	}
	var unknown []string
	for k := range environ {
		if strings.HasPrefix(k, "COURIER_") && !known[k] && !strings.HasPrefix(k, SubscriptionPrefix) {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	return unknown
}
