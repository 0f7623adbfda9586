package config

import (
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
)

// redacted stands in for a secret wherever a value is shown.
const redacted = "[redacted]"

// Var describes one environment variable for `courier config`.
type Var struct {
	// Name is the environment variable, such as COURIER_MAX_DELIVER.
	Name string
	// Meaning is a short description, as in the SPEC's table.
	Meaning string
	// Default is the default as the SPEC states it: a value, or words such
	// as "required", "unset" or "dlq.<stream>.<consumer>".
	Default string
	// Value is the value in effect, formatted as it could be set. Secrets
	// are "[redacted]": the whole value when Secret is true, the password
	// alone inside URLs (NATS_URL, COURIER_APP_URL, COURIER_APP_HEALTH_URL).
	// An unset value without a default stays "".
	Value string
	// Secret is true for the variables whose whole value is withheld:
	// NATS_PASSWORD and NATS_TOKEN.
	Secret bool
}

// spec is one row of the SPEC's table: the single list that orders
// Describe's output and the problems of an *Error.
type spec struct {
	name, meaning, def string
	secret             bool
	value              func(Config) string // of a Config already redacted
}

func specs() []spec {
	return []spec{
		{"NATS_URL", "server URL(s), comma separated", "nats://127.0.0.1:4222", false, func(c Config) string { return c.NATSURL }},
		{"NATS_CREDS", "credentials file, as in the nats CLI", "unset", false, func(c Config) string { return c.NATSCreds }},
		{"NATS_NKEY", "NKey seed file", "unset", false, func(c Config) string { return c.NATSNKey }},
		{"NATS_USER", "user name (with NATS_PASSWORD)", "unset", false, func(c Config) string { return c.NATSUser }},
		{"NATS_PASSWORD", "password (with NATS_USER)", "unset", true, func(c Config) string { return c.NATSPassword }},
		{"NATS_TOKEN", "authentication token", "unset", true, func(c Config) string { return c.NATSToken }},
		{"NATS_CA", "CA certificate file for TLS", "unset", false, func(c Config) string { return c.NATSCA }},
		{"NATS_CERT", "client certificate file for TLS", "unset", false, func(c Config) string { return c.NATSCert }},
		{"NATS_KEY", "client private key file for TLS", "unset", false, func(c Config) string { return c.NATSKey }},
		{"COURIER_STREAM", "stream to consume (must exist; courier does not create it)", "required", false, func(c Config) string { return c.Stream }},
		{"COURIER_CONSUMER", "durable consumer name; created or updated by courier", "courier", false, func(c Config) string { return c.Consumer }},
		{"COURIER_SUBJECTS", "filter subjects, comma separated", "all of the stream", false, func(c Config) string { return strings.Join(c.Subjects, ",") }},
		{"COURIER_APP_URL", "where each message is POSTed", "required", false, func(c Config) string { return c.AppURL }},
		{"COURIER_APP_HEALTH_URL", "polled before consuming and during outages", "unset", false, func(c Config) string { return c.AppHealthURL }},
		{"COURIER_DELIVER_POLICY", "where a new durable starts: all or new (fixed once created)", "all", false, func(c Config) string { return c.DeliverPolicy }},
		{"COURIER_MAX_DELIVER", "delivery attempts per message, the first included", "5", false, func(c Config) string { return strconv.Itoa(c.MaxDeliver) }},
		{"COURIER_ACK_WAIT", "JetStream ack wait", "30s", false, func(c Config) string { return formatDuration(c.AckWait) }},
		{"COURIER_MAX_INFLIGHT", "concurrent HTTP requests to the app", "8", false, func(c Config) string { return strconv.Itoa(c.MaxInflight) }},
		{"COURIER_MAX_ACK_PENDING", "consumer's ack-pending limit (messages in flight or waiting out a backoff)", "1000", false, func(c Config) string { return strconv.Itoa(c.MaxAckPending) }},
		{"COURIER_HTTP_TIMEOUT", "per-request timeout", "30s", false, func(c Config) string { return formatDuration(c.HTTPTimeout) }},
		{"COURIER_BACKOFF_INITIAL", "retry schedule before jitter: first delay", "1s", false, func(c Config) string { return formatDuration(c.BackoffInitial) }},
		{"COURIER_BACKOFF_MAX", "retry schedule before jitter: longest delay", "10m", false, func(c Config) string { return formatDuration(c.BackoffMax) }},
		{"COURIER_BACKOFF_MULTIPLIER", "retry schedule before jitter: growth per attempt", "2", false, func(c Config) string { return strconv.FormatFloat(c.BackoffMultiplier, 'g', -1, 64) }},
		{"COURIER_RETRY_AFTER_MAX", "cap on an app's Retry-After", "10m", false, func(c Config) string { return formatDuration(c.RetryAfterMax) }},
		{"COURIER_RETRY_STATUSES", "statuses treated as transient", "408,429,500,502-599", false, func(c Config) string { return c.RetryStatuses.String() }},
		{"COURIER_MAX_AGE", "older messages (stream timestamp) are dead-lettered instead of sent; 0 = never", "0", false, func(c Config) string { return formatDuration(c.MaxAge) }},
		{"COURIER_DLQ_SUBJECT", "dead-letter subject", "dlq.<stream>.<consumer>", false, func(c Config) string { return c.DLQSubject }},
		{"COURIER_STREAM_REPLICAS", "replicas of the streams courier creates (dead letters, captured advisories)", "1", false, func(c Config) string { return strconv.Itoa(c.StreamReplicas) }},
		{"COURIER_IDEMPOTENCY_HEADER", "header that carries the idempotency key", "Idempotency-Key", false, func(c Config) string { return c.IdempotencyHeader }},
		{"COURIER_DEDUP_DIR", "Badger directory", "./courier-data", false, func(c Config) string { return c.DedupDir }},
		{"COURIER_DEDUP_TTL", "how long a processed key is remembered; 0 = no dedup", "24h", false, func(c Config) string { return formatDuration(c.DedupTTL) }},
		{"COURIER_DEDUP_STORE", "badger (embedded, one per courier) or kv (a JetStream bucket shared by replicas)", "badger", false, func(c Config) string { return c.DedupStore }},
		{"COURIER_DEDUP_BUCKET", "key-value bucket of the kv store (keys scoped by stream and consumer)", "COURIER_DEDUP", false, func(c Config) string { return c.DedupBucket }},
		{"COURIER_ADMIN_ADDR", "address of /healthz, /readyz, /metrics", ":9464", false, func(c Config) string { return c.AdminAddr }},
		{"COURIER_LOG_LEVEL", "debug, info, warn or error", "info", false, func(c Config) string { return c.LogLevel }},
		{"COURIER_LOG_FORMAT", "text (tint) or json", "text on a terminal, else json", false, func(c Config) string { return c.LogFormat }},
		{"COURIER_SHUTDOWN_GRACE", "time in-flight requests get after SIGTERM", "25s", false, func(c Config) string { return formatDuration(c.ShutdownGrace) }},
	}
}

// Describe returns one Var per environment variable, in the order of the
// SPEC's table, with the values of cfg in effect and its secrets redacted.
func Describe(cfg Config) []Var {
	r := cfg.Redacted()
	ss := specs()
	vars := make([]Var, len(ss))
	for i, s := range ss {
		vars[i] = Var{Name: s.name, Meaning: s.meaning, Default: s.def, Value: s.value(r), Secret: s.secret}
	}
	return vars
}

// WriteTable writes vars as an aligned table with a header line, for
// people: an empty cell shows as "-", and a value that would break the
// layout (a tab, a newline) is quoted.
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
		row(cell(v.Name), cell(v.Value), cell(v.Default), cell(v.Meaning))
	}
	if err != nil {
		return err
	}
	return tw.Flush()
}

func cell(s string) string {
	if s == "" {
		return "-"
	}
	if strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return strconv.Quote(s)
	}
	return s
}

// Redacted returns a copy of c that is safe to log or print: NATS_PASSWORD
// and NATS_TOKEN become "[redacted]" (empty stays empty), and so does a
// password in the userinfo of NATS_URL (or a bare token there, as in
// nats://token@host), COURIER_APP_URL or COURIER_APP_HEALTH_URL. It must not
// be used to connect.
func (c Config) Redacted() Config {
	c.NATSURL = redactNATSURLs(c.NATSURL)
	c.NATSPassword = redactSecret(c.NATSPassword)
	c.NATSToken = redactSecret(c.NATSToken)
	c.AppURL = redactHTTPURL(c.AppURL)
	c.AppHealthURL = redactHTTPURL(c.AppHealthURL)
	c.Subjects = slices.Clone(c.Subjects) // the copy shares nothing mutable
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
// warn.
func UnknownVars(environ map[string]string) []string {
	known := map[string]bool{}
	for _, s := range specs() {
		known[s.name] = true
	}
	var unknown []string
	for k := range environ {
		if strings.HasPrefix(k, "COURIER_") && !known[k] {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	return unknown
}

// redactVar redacts the raw value of the variable name for a message.
func redactVar(name, v string) string {
	switch name {
	case "NATS_PASSWORD", "NATS_TOKEN":
		return redactSecret(v)
	case "NATS_URL":
		return redactNATSURLs(v)
	case "COURIER_APP_URL", "COURIER_APP_HEALTH_URL":
		return redactHTTPURL(v)
	}
	return v
}

func redactSecret(v string) string {
	if v == "" {
		return ""
	}
	return redacted
}

// redactNATSURLs redacts each URL of a comma list, keeping the rest as is.
func redactNATSURLs(v string) string {
	parts := strings.Split(v, ",")
	for i, p := range parts {
		parts[i] = redactNATSURL(p)
	}
	return strings.Join(parts, ",")
}

// redactNATSURL redacts the userinfo of one NATS server URL. It works on
// the text rather than a parsed URL so that nothing leaks from a URL that
// does not parse (a raw '/' or '#' in a password); NATS URLs have no path,
// so everything before the last '@' is userinfo.
func redactNATSURL(raw string) string {
	at := strings.LastIndex(raw, "@")
	if at < 0 {
		return raw
	}
	start := 0
	if i := strings.Index(raw[:at], "://"); i >= 0 {
		start = i + len("://")
	}
	// A user without a password is a token to the NATS client.
	return raw[:start] + redactUserinfo(raw[start:at], true) + raw[at:]
}

// redactHTTPURL redacts the password in the userinfo of an http(s) URL.
// An '@' in its path or query is left alone.
func redactHTTPURL(raw string) string {
	if !strings.Contains(raw, "@") {
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return redactNATSURL(raw) // cannot tell where userinfo ends: hide all of it
	}
	if u.User == nil {
		return raw
	}
	start := strings.Index(raw, "//") + len("//") // a URL with userinfo has an authority
	end := len(raw)
	if i := strings.IndexAny(raw[start:], "/?#"); i >= 0 {
		end = start + i
	}
	at := start + strings.LastIndex(raw[start:end], "@")
	return raw[:start] + redactUserinfo(raw[start:at], false) + raw[at:]
}

// redactUserinfo redacts the password of "user:password", and a bare
// "user" too when bareIsSecret.
func redactUserinfo(userinfo string, bareIsSecret bool) string {
	if user, _, ok := strings.Cut(userinfo, ":"); ok {
		return user + ":" + redacted
	}
	if bareIsSecret {
		return redacted
	}
	return userinfo
}
