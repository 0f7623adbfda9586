// Package config owns courier's configuration: every environment variable,
// its default, and the checks across fields. No other package reads the
// environment.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
)

// Config is courier's whole configuration, parsed from the environment by
// Load. The zero value is not valid; use Load. A Config is a plain value:
// safe to copy and to read from several goroutines. Log it as a whole (it is
// a slog.LogValuer that redacts secrets) or through Redacted, never with fmt.
// With COURIER_SUBSCRIPTIONS its fields of one message's path are the plain
// variables, which subscriptions fall back to; Subscriptions gives each
// subscription's Config.
type Config struct {
	// NATS connection, named as in the nats CLI.
	NATSURL      string `env:"NATS_URL" envDefault:"nats://127.0.0.1:4222"`
	NATSCreds    string `env:"NATS_CREDS"`
	NATSNKey     string `env:"NATS_NKEY"`
	NATSUser     string `env:"NATS_USER"`
	NATSPassword string `env:"NATS_PASSWORD"`
	NATSToken    string `env:"NATS_TOKEN"`
	NATSCA       string `env:"NATS_CA"`
	NATSCert     string `env:"NATS_CERT"`
	NATSKey      string `env:"NATS_KEY"`

	// What to consume.
	Stream        string        `env:"COURIER_STREAM"`
	Consumer      string        `env:"COURIER_CONSUMER" envDefault:"courier"`
	Subjects      []string      `env:"COURIER_SUBJECTS"`
	DeliverPolicy string        `env:"COURIER_DELIVER_POLICY" envDefault:"all"`
	MaxDeliver    int           `env:"COURIER_MAX_DELIVER" envDefault:"5"`
	AckWait       time.Duration `env:"COURIER_ACK_WAIT" envDefault:"30s"`
	MaxAckPending int           `env:"COURIER_MAX_ACK_PENDING" envDefault:"1000"`

	// The app.
	AppURL       string `env:"COURIER_APP_URL"`
	AppHealthURL string `env:"COURIER_APP_HEALTH_URL"`
	// MaxInflight bounds concurrent requests to the app
	// (COURIER_MAX_INFLIGHT, default 8): the number itself, or with
	// InflightAuto the most the automatic limit may reach (auto:N; auto
	// alone is DefaultInflightCeiling). Load parses the variable itself
	// (inflight.go), so it has no env tag.
	MaxInflight int
	// InflightAuto is true for COURIER_MAX_INFLIGHT=auto or auto:N: courier
	// finds the limit from the app's answers, between 1 and MaxInflight.
	InflightAuto bool
	HTTPTimeout  time.Duration `env:"COURIER_HTTP_TIMEOUT" envDefault:"30s"`
	// Routes send a message whose subject matches a pattern to another path
	// of the app's origin (COURIER_ROUTES, routes.go); none = every message
	// to AppURL.
	Routes Routes `env:"COURIER_ROUTES"`

	// Retries.
	BackoffInitial    time.Duration `env:"COURIER_BACKOFF_INITIAL" envDefault:"1s"`
	BackoffMax        time.Duration `env:"COURIER_BACKOFF_MAX" envDefault:"10m"`
	BackoffMultiplier float64       `env:"COURIER_BACKOFF_MULTIPLIER" envDefault:"2"`
	RetryAfterMax     time.Duration `env:"COURIER_RETRY_AFTER_MAX" envDefault:"10m"`
	RetryStatuses     StatusSet     `env:"COURIER_RETRY_STATUSES" envDefault:"408,409,425,429,500,502-599"`
	MaxAge            time.Duration `env:"COURIER_MAX_AGE" envDefault:"0"`

	// Dead letters.
	DLQSubject     string `env:"COURIER_DLQ_SUBJECT"` // default dlq.<stream>.<consumer>, filled by Load
	StreamReplicas int    `env:"COURIER_STREAM_REPLICAS" envDefault:"1"`

	// Dedup.
	IdempotencyHeader string        `env:"COURIER_IDEMPOTENCY_HEADER" envDefault:"Idempotency-Key"`
	DedupDir          string        `env:"COURIER_DEDUP_DIR" envDefault:"./courier-data"`
	DedupTTL          time.Duration `env:"COURIER_DEDUP_TTL" envDefault:"24h"`
	// DedupStore is DedupBadger (an embedded store per courier) or
	// DedupShared (keys shared by every courier of the durable through a
	// JetStream key-value bucket). Load reads the deprecated "kv" as
	// DedupShared (Warnings names it).
	DedupStore  string `env:"COURIER_DEDUP_STORE" envDefault:"badger"`
	DedupBucket string `env:"COURIER_DEDUP_BUCKET" envDefault:"COURIER_DEDUP"`

	// Breaker and rate limit (README, "Dependency outages").
	// BreakerFailures is the number of transient failures in a row (from
	// more than one message) after which courier stops sending and probes;
	// 0 = never.
	BreakerFailures int `env:"COURIER_BREAKER_FAILURES" envDefault:"10"`
	// BreakerProbe is the wait before the first probe while stopped.
	BreakerProbe time.Duration `env:"COURIER_BREAKER_PROBE" envDefault:"5s"`
	// BreakerProbeMax is the longest wait between two probes: the wait
	// doubles per failed probe up to it (the app's Retry-After wins).
	BreakerProbeMax time.Duration `env:"COURIER_BREAKER_PROBE_MAX" envDefault:"30s"`
	// MaxRate caps requests per second to the app, all messages together;
	// 0 = no limit.
	MaxRate float64 `env:"COURIER_MAX_RATE" envDefault:"0"`

	// Success records and request/reply (README, "Results out").
	// SuccessSubject is where the app's answer to each 2xx is published;
	// "" = nowhere.
	SuccessSubject string `env:"COURIER_SUCCESS_SUBJECT"`
	// ReplySubjects are the subjects courier answers as a NATS service;
	// none = no service. With ReplySubjects and no Stream, courier serves
	// requests only (see ConsumesStream).
	ReplySubjects []string `env:"COURIER_REPLY_SUBJECTS"`
	// ReplyURL is where requests on ReplySubjects are POSTed; Load fills
	// in AppURL when it is unset.
	ReplyURL string `env:"COURIER_REPLY_URL"`
	// ReplyMaxWaiting bounds the requests waiting for one of the
	// MaxInflight slots; beyond it a request is answered 503 busy at once.
	// 0 = 64 × MaxInflight (EffectiveReplyMaxWaiting).
	ReplyMaxWaiting int `env:"COURIER_REPLY_MAX_WAITING"`

	// OrderKey orders the messages of one key (internal/orderkey):
	// "subject:N" or "header:NAME"; "" = no order.
	OrderKey string `env:"COURIER_ORDER_KEY"`
	// OrderPartitions, with a subject key, splits the durable into that
	// many partitions by key (package partition), each handled by one
	// replica at a time; 0 = one replica at a time for the whole durable.
	OrderPartitions int `env:"COURIER_ORDER_PARTITIONS" envDefault:"0"`

	// Batches (package batch): BatchMax messages per request to the app
	// (1 = one message per request); a batch goes when it holds BatchMax
	// entries or BatchBytes of message data, or BatchWait after its first
	// entry.
	BatchMax   int           `env:"COURIER_BATCH_MAX" envDefault:"1"`
	BatchWait  time.Duration `env:"COURIER_BATCH_WAIT" envDefault:"2ms"`
	BatchBytes int           `env:"COURIER_BATCH_BYTES" envDefault:"1048576"`

	// What the app learns of each request: CloudEvents attributes, a
	// signature, a token (packages cloudevents and appauth).
	// CloudEvents is CloudEventsBinary (requests carry CloudEvents 1.0
	// attributes as ce-* headers) or "" (off); Load lower-cases it.
	CloudEvents string `env:"COURIER_CLOUDEVENTS"`
	// SigningSecretsFile holds the Standard Webhooks secrets every request
	// to the app is signed with, one whsec_<base64> a line; "" = unsigned.
	// The path is no secret; the file's content is, and is never shown.
	SigningSecretsFile string `env:"COURIER_SIGNING_SECRETS_FILE"`
	// AppTokenFile holds the token sent as Authorization: Bearer to the
	// app (and asked of callers of the publish API); "" = none.
	AppTokenFile string `env:"COURIER_APP_TOKEN_FILE"`

	// Publishing through courier (package publish). PublishAddr is where the
	// publish API listens, as given ("" = off); PublishListenAddr fills
	// in the default host. PublishSubjects are those the app may publish
	// to, NATS wildcards allowed; required with PublishAddr.
	PublishAddr     string   `env:"COURIER_PUBLISH_ADDR"`
	PublishSubjects []string `env:"COURIER_PUBLISH_SUBJECTS"`
	// SchedulePrefix is where delayed publishes wait (package schedule):
	// <prefix>.<STREAM>.<token> in the target's stream. The publish API
	// stores them there, and the durables courier sets up leave them out.
	SchedulePrefix string `env:"COURIER_SCHEDULE_PREFIX" envDefault:"_sched"`

	// SubscriptionNames are COURIER_SUBSCRIPTIONS as listed: with them one
	// courier serves several durable consumers, each set by its
	// COURIER_SUB_<NAME>_<VAR> variables (see Subscriptions). None = one,
	// set by the plain variables, which are then what this Config holds.
	SubscriptionNames []string `env:"COURIER_SUBSCRIPTIONS"`

	// Operations.
	AdminAddr string `env:"COURIER_ADMIN_ADDR" envDefault:":7415"`
	LogLevel  string `env:"COURIER_LOG_LEVEL" envDefault:"info"`
	LogFormat string `env:"COURIER_LOG_FORMAT"` // "text" or "json"; empty = text on a terminal, else json
	// ShutdownGrace is the time in-flight requests get after SIGTERM; 0
	// means none: they are abandoned and their messages NAK'd at once.
	ShutdownGrace time.Duration `env:"COURIER_SHUTDOWN_GRACE" envDefault:"25s"`

	// Tracing (README, "Tracing"): OpenTelemetry's own variables, read as its
	// specification says. They are kept as given; the Traces* methods
	// resolve them (which of two variables wins, what a default is).
	OTLPEndpoint       string `env:"OTEL_EXPORTER_OTLP_ENDPOINT"`
	OTLPTracesEndpoint string `env:"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"`
	OTLPProtocol       string `env:"OTEL_EXPORTER_OTLP_PROTOCOL" envDefault:"http/protobuf"`
	OTLPTracesProtocol string `env:"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"`
	// OTLPHeaders and OTLPTracesHeaders are secrets (an API key, as a
	// rule): Redacted hides them.
	OTLPHeaders       string `env:"OTEL_EXPORTER_OTLP_HEADERS"`
	OTLPTracesHeaders string `env:"OTEL_EXPORTER_OTLP_TRACES_HEADERS"`
	OTLPInsecure      bool   `env:"OTEL_EXPORTER_OTLP_INSECURE" envDefault:"false"`
	// OTLPTracesInsecure is OTLPInsecure for spans; nil when unset.
	OTLPTracesInsecure *bool `env:"OTEL_EXPORTER_OTLP_TRACES_INSECURE"`
	// OTELServiceName is as given; TracesServiceName applies the default.
	OTELServiceName        string `env:"OTEL_SERVICE_NAME"`
	OTELResourceAttributes string `env:"OTEL_RESOURCE_ATTRIBUTES"`
	OTELTracesSampler      string `env:"OTEL_TRACES_SAMPLER" envDefault:"parentbased_always_on"`
	OTELTracesSamplerArg   string `env:"OTEL_TRACES_SAMPLER_ARG"`
	OTELSDKDisabled        bool   `env:"OTEL_SDK_DISABLED" envDefault:"false"`

	// subs are the subscriptions of COURIER_SUBSCRIPTIONS, as Load resolved
	// them; nil without it (Subscriptions returns this Config alone).
	subs []Subscription
	// source is where each per-subscription variable's value came from,
	// for the one subscription of the plain variables (Subscription.Source).
	source map[string]string
}

// StatusSet is a set of HTTP status codes, parsed from a comma-separated list
// of codes and inclusive ranges such as "408,429,500-599" (see
// ParseStatusSet). The zero value is the empty set. It is immutable once
// parsed, so safe for concurrent use.
type StatusSet struct {
	// ranges are inclusive [lo, hi] pairs, sorted, with overlapping and
	// adjacent ranges merged, so String is canonical.
	ranges [][2]int
}

// The values of COURIER_DEDUP_STORE.
const (
	// DedupBadger keeps keys in an embedded Badger store, this courier's
	// keys only.
	DedupBadger = "badger"
	// DedupShared shares keys between every courier of the durable
	// through a replicated JetStream key-value bucket.
	DedupShared = "shared"
)

// CloudEventsBinary is the value of COURIER_CLOUDEVENTS that turns the
// CloudEvents attributes on (the HTTP binding's binary mode).
const CloudEventsBinary = "binary"

// DefaultAdminAddr is COURIER_ADMIN_ADDR's default: a port no common
// neighbour in a pod uses (not 9464, OpenTelemetry's Prometheus exporter;
// outside the 9100-9999 exporter range, Istio's 15000-15090, Linkerd's
// 4191, Dapr's 3500, 3501, 9090 and 50001, NATS's 4222 and 8222).
const DefaultAdminAddr = ":7415"

// ConsumesStream reports whether courier consumes a stream: false when it
// only serves COURIER_REPLY_SUBJECTS (no COURIER_STREAM).
func (c Config) ConsumesStream() bool { return c.Stream != "" }

// ServesReplies reports whether courier answers requests on
// COURIER_REPLY_SUBJECTS.
func (c Config) ServesReplies() bool { return len(c.ReplySubjects) > 0 }

// DedupEnabled reports whether courier records idempotency keys at all:
// COURIER_DEDUP_TTL=0 turns dedup off.
func (c Config) DedupEnabled() bool { return c.DedupTTL > 0 }

// SlogLevel returns COURIER_LOG_LEVEL as a slog.Level. Load has already
// checked and lower-cased the name; anything else reads as info.
func (c Config) SlogLevel() slog.Level {
	switch c.LogLevel {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

// Error is the error Load returns for an invalid configuration. It holds
// every problem found, not just the first, so a user fixes them in one go.
type Error struct {
	// Problems are one line each, each naming the variable, its value (a
	// secret redacted) and what is expected, e.g.
	// COURIER_MAX_DELIVER="abc": not an integer. They are in the order of
	// the variables in the README's configuration table.
	Problems []string
}

// Error returns the problems, one per line.
func (e *Error) Error() string { return strings.Join(e.Problems, "\n") }

// Environ converts the "KEY=value" form of os.Environ into the map Load
// takes. Entries without a name are skipped, and the first of duplicate
// names wins, as it does for os.Getenv.
func Environ(kv []string) map[string]string {
	m := make(map[string]string, len(kv))
	for _, s := range kv {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" { // Windows' per-drive "=C:=C:\" entries have no name.
			continue
		}
		if _, dup := m[k]; dup {
			continue
		}
		m[k] = v
	}
	return m
}

// Load parses courier's configuration from environ (see Environ), applies
// the defaults of docs/configuration.md, fills in the derived ones
// (COURIER_DLQ_SUBJECT) and checks every value and the relations between
// them. With COURIER_SUBSCRIPTIONS it does so for each subscription, its
// COURIER_SUB_<NAME>_<VAR> in place of the plain COURIER_<VAR>
// (Subscriptions), and checks the names of those variables. It reads nothing but environ and, to check that they are readable,
// the files named by NATS_CREDS, NATS_NKEY, NATS_CA, NATS_CERT, NATS_KEY,
// COURIER_SIGNING_SECRETS_FILE and COURIER_APP_TOKEN_FILE (whose content
// the sidecar checks as it opens them: appauth).
//
// A variable set to the empty string counts as unset. Comma lists are
// trimmed and empty items dropped; COURIER_DELIVER_POLICY,
// COURIER_DEDUP_STORE, COURIER_CLOUDEVENTS, COURIER_LOG_LEVEL, COURIER_LOG_FORMAT, the OTLP
// protocols, OTEL_TRACES_SAMPLER and the auto of COURIER_MAX_INFLIGHT are
// case-insensitive and come back lower-cased (COURIER_DEDUP_STORE=kv comes
// back as DedupShared). COURIER_REPLY_URL is filled in from COURIER_APP_URL
// when COURIER_REPLY_SUBJECTS is set and it is not.
//
// If anything is wrong, the error is an *Error listing every problem. The
// Config is returned either way, holding what could be parsed, so that
// `courier config` can show it beside the problems; it must not be run with.
func Load(environ map[string]string) (Config, error) {
	cfg, c := load(environ)
	if p := c.sorted(); len(p) > 0 {
		return cfg, &Error{Problems: p}
	}
	return cfg, nil
}

// load is Load, returning the checker with every problem and what did not
// parse, for Inspect. Without COURIER_SUBSCRIPTIONS it checks the plain
// variables as one subscription; with it, the plain variables are checked
// for what the process has once, and each subscription on its own
// (subscriptions.go).
func load(environ map[string]string) (Config, *checker) {
	if environ == nil {
		// env falls back to the process environment when given none.
		environ = map[string]string{}
	}
	if strings.TrimSpace(environ[subscriptionsVar]) == "" {
		cfg, c := loadScope(environ, scopeAll, nil)
		cfg.source = plainSources(environ)
		c.checkSubVars(nil)
		return cfg, c
	}
	cfg, c := loadScope(environ, scopeProcess, nil)
	c.loadSubscriptions(&cfg, environ)
	return cfg, c
}

// loadScope parses environ into a Config and runs the checks of scope;
// sub names the subscription's variables in scopeSubscription.
func loadScope(environ map[string]string, scope scope, sub *subNames) (Config, *checker) {
	c := newChecker(environ)
	c.scope, c.sub = scope, sub

	var cfg Config
	err := env.ParseWithOptions(&cfg, env.Options{Environment: environ, FuncMap: parsers()})
	c.parseErrors(err)
	c.parseInflight(&cfg)

	cfg.DeliverPolicy = lower(cfg.DeliverPolicy)
	cfg.LogLevel = lower(cfg.LogLevel)
	cfg.LogFormat = lower(cfg.LogFormat)
	cfg.DedupStore = lower(cfg.DedupStore)
	cfg.CloudEvents = lower(cfg.CloudEvents)
	cfg.OTLPProtocol = lower(cfg.OTLPProtocol)
	cfg.OTLPTracesProtocol = lower(cfg.OTLPTracesProtocol)
	cfg.OTELTracesSampler = lower(cfg.OTELTracesSampler)
	cfg.OTLPEndpoint = strings.TrimSpace(cfg.OTLPEndpoint)
	cfg.OTLPTracesEndpoint = strings.TrimSpace(cfg.OTLPTracesEndpoint)
	cfg.OTELServiceName = strings.TrimSpace(cfg.OTELServiceName)

	c.check(&cfg)
	return cfg, c
}

func lower(s string) string { return strings.ToLower(strings.TrimSpace(s)) }

// parsers replaces env's own parsers for the types Config uses, so that
// every message says what is expected in the user's terms rather than
// strconv's.
func parsers() map[reflect.Type]env.ParserFunc {
	return map[reflect.Type]env.ParserFunc{
		reflect.TypeFor[int](): func(v string) (any, error) {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if errors.Is(err, strconv.ErrRange) {
				return nil, errors.New("integer out of range")
			}
			if err != nil {
				return nil, errors.New("not an integer")
			}
			return n, nil
		},
		reflect.TypeFor[float64](): func(v string) (any, error) {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return nil, errors.New("not a number")
			}
			if math.IsNaN(f) || math.IsInf(f, 0) {
				return nil, errors.New("not a finite number")
			}
			return f, nil
		},
		reflect.TypeFor[time.Duration](): func(v string) (any, error) {
			v = strings.TrimSpace(v)
			d, err := time.ParseDuration(v)
			if err == nil {
				return d, nil
			}
			if _, nerr := strconv.ParseFloat(v, 64); nerr == nil {
				return nil, fmt.Errorf("missing a unit: a duration in Go syntax, such as %ss", v)
			}
			return nil, errors.New("not a duration: Go syntax expected, such as 500ms, 30s, 10m or 1h30m")
		},
		reflect.TypeFor[bool](): func(v string) (any, error) {
			// OpenTelemetry's booleans: true or false, in any case.
			switch lower(v) {
			case "true":
				return true, nil
			case "false":
				return false, nil
			}
			return nil, errors.New("expected true or false")
		},
		reflect.TypeFor[[]string](): func(v string) (any, error) {
			return splitList(v), nil
		},
		reflect.TypeFor[StatusSet](): func(v string) (any, error) {
			return ParseStatusSet(v)
		},
		reflect.TypeFor[Routes](): func(v string) (any, error) {
			return ParseRoutes(v)
		},
	}
}

// splitList splits a comma list, trimming items and dropping empty ones.
func splitList(v string) []string {
	var out []string
	for item := range strings.SplitSeq(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// formatDuration is time.Duration.String without the trailing zero units
// ("10m", not "10m0s"), still valid Go syntax so that it reads back.
func formatDuration(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// ServesPublishes reports whether the app publishes through courier's HTTP
// API (COURIER_PUBLISH_ADDR is set).
func (c Config) ServesPublishes() bool { return c.PublishAddr != "" }

// DefaultPublishHost is the host the publish API binds when
// COURIER_PUBLISH_ADDR names only a port: loopback, so that only the app
// beside courier (its pod, its host) can publish. Name a host, such as
// 0.0.0.0, to listen beyond it.
const DefaultPublishHost = "127.0.0.1"

// PublishListenAddr is COURIER_PUBLISH_ADDR with DefaultPublishHost filled
// in when it names no host (":7416" is "127.0.0.1:7416"); "" when off.
func (c Config) PublishListenAddr() string {
	host, port, err := net.SplitHostPort(c.PublishAddr)
	if err != nil || host != "" {
		return c.PublishAddr
	}
	return net.JoinHostPort(DefaultPublishHost, port)
}

// EffectiveReplyMaxWaiting is ReplyMaxWaiting, or its default when unset:
// 64 waiting requests per MaxInflight slot.
func (c Config) EffectiveReplyMaxWaiting() int {
	if c.ReplyMaxWaiting > 0 {
		return c.ReplyMaxWaiting
	}
	return 64 * c.MaxInflight
}
