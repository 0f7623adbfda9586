package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/internal/orderkey"
)

// Options configures a Runner. A zero value takes the documented default;
// a value no default can stand for (negative, a multiplier below 1) is
// rejected by New with an error naming it.
type Options struct {
	// AppURL receives each message as a POST. Required.
	AppURL string
	// AppHealthURL, when set, must answer 2xx before courier fetches, and is
	// polled every HealthInterval to notice the app going away.
	AppHealthURL string
	// HealthInterval is how often a healthy app's health URL is polled.
	// Default 5s.
	HealthInterval time.Duration
	// Stream and Consumer name where messages come from. Required.
	Stream, Consumer string
	// StreamCreated is the stream's creation time, part of derived keys.
	StreamCreated time.Time
	// MaxDeliver is the consumer's delivery budget. Default 5.
	MaxDeliver int
	// AckWait is the consumer's ack wait as courier configured it. Default
	// 30s. The in-progress signals follow the consumer's ack wait as the
	// server reports it, re-read every InfoInterval.
	AckWait time.Duration
	// InfoInterval is how often the consumer's settings are re-read from
	// the server (ack wait, pull limits). Default 10s.
	InfoInterval time.Duration
	// Routes send the messages whose subject matches a route's pattern to
	// its URL, the first that matches, and the rest to AppURL (routes.go).
	Routes []Route
	// MaxInflight bounds concurrent requests to the app. Default 8. With
	// InflightAuto it is the ceiling of a limit found from the app's
	// answers (inflight.go).
	MaxInflight int
	// InflightAuto: the limit on requests at the app is found from its
	// answers (package limit), between 1 and MaxInflight.
	InflightAuto bool
	// HTTPTimeout bounds one request. Default 30s.
	HTTPTimeout time.Duration
	// BatchMax is how many messages one request carries (batcher.go): 1,
	// the default, sends each alone. BatchBytes bounds a batch's message
	// data (default 1 MiB; a larger message goes alone), and a batch goes
	// BatchWait after its first entry if it is not full by then (0 sends
	// each entry at once, alone; the configuration refuses it).
	BatchMax   int
	BatchBytes int
	BatchWait  time.Duration
	// OrderKey, when set, orders the messages of each key (order.go): one
	// at a time, in stream order, each after the one before is settled.
	// Messages it gives no key to are not ordered.
	OrderKey orderkey.Key
	// OrderMarks, with OrderKey, keeps each busy key's first unsettled
	// message for a courier that comes after this one (a restart, another
	// replica); nil: order holds within this process's life only.
	OrderMarks OrderMarks
	// Rewinds, when set, says which messages a rewind of the durable
	// delivers again (package rewind): they reach the app although their
	// keys were recorded, once each per rewind, carrying HeaderReplay.
	// nil: none is known, and a message delivered again after a consumer
	// reset is a duplicate like any other.
	Rewinds Rewinds
	// PriorityGroup, when set, is the consumer's priority group every
	// pull names (the durable's PriorityPolicy pinned: one replica at a
	// time receives its messages). With OrderKey, a pull that finds the
	// pin moved to this courier raises the barrier as a restart does.
	PriorityGroup string
	// Partitions, when set, is the durable split into partitions by key
	// (partition.go): New is given no consumer, and the runner pulls from
	// the partitions assigned to it. Needs OrderKey and PriorityGroup.
	Partitions *Partitions
	// Handover, with OrderKey and PriorityGroup and no partitions, hands
	// the durable's pin on (i 0): given up once this courier stopped and
	// gave back what it held, and found clean by the courier it goes to.
	Handover Handover
	// Membership, with PriorityGroup, is this courier's standing among the
	// couriers of its durable: a pin whose courier is gone is given up
	// (Handover.Unpin, Partitions' for a partition) within seconds, not
	// after the consumer's PinnedTTL, and this courier sends nothing of a
	// pinned group once its own membership lapsed. Nil: neither.
	Membership Membership
	// BackoffInitial, BackoffMax and BackoffMultiplier shape the retry
	// schedule before jitter. Defaults 1s, 10m, 2 (a multiplier, if set,
	// must be at least 1).
	BackoffInitial, BackoffMax time.Duration
	BackoffMultiplier          float64
	// RetryAfterMax caps an app's Retry-After. Default 10m.
	RetryAfterMax time.Duration
	// Retryable reports whether a status is transient. Default: 408, 409,
	// 425, 429, 500 and 502-599.
	Retryable func(status int) bool
	// MaxAge dead-letters messages older than this instead of sending
	// them; 0 means never.
	MaxAge time.Duration
	// IdempotencyHeader names the header carrying the dedup key. Default
	// Idempotency-Key.
	IdempotencyHeader string
	// ShutdownGrace is how long in-flight requests may finish after the
	// run context ends; 0 means none (they are abandoned at once).
	ShutdownGrace time.Duration
	// Client sends requests to the app; default apphttp.NewClient sized to
	// MaxInflight.
	Client *http.Client
	// Logger receives logs; default discards.
	Logger *slog.Logger
	// Registerer receives the metrics; default a private registry.
	Registerer prometheus.Registerer
	// DeadLetterCounter, when set, is the registered
	// courier_dead_letters_total vector (NewDeadLetterCounter) to count
	// dead letters on, shared with other components; default one of the
	// runner's own.
	DeadLetterCounter *prometheus.CounterVec
	// MaxPayload is the largest message the server accepts
	// (nats.Conn.MaxPayload). It sizes the byte budget of the fetch queue so
	// that any message fits. Default 1 MiB, NATS's own default.
	MaxPayload int64
	// BreakerFailures is how many transient failures in a row, from more
	// than one message, stop sending until a probe succeeds; 0 means never.
	BreakerFailures int
	// BreakerProbe is the wait before the first probe while stopped (the
	// app's Retry-After wins; it doubles per failed probe up to
	// BreakerProbeMax). Default 5s.
	BreakerProbe time.Duration
	// BreakerProbeMax is the longest wait between two probes (the app's
	// Retry-After wins); never below BreakerProbe. Default 30s, or
	// BackoffMax if that is shorter.
	BreakerProbeMax time.Duration
	// MaxRate caps requests per second to the app, all workers, retries
	// and probes together; 0 means no limit.
	MaxRate float64
	// SummaryInterval is how often a summary of counts is logged (when
	// there was traffic); no line is logged per successful message at info.
	// Default 1m.
	SummaryInterval time.Duration
	// Success, when set, stores the app's answer to each 2xx as a success
	// record (COURIER_SUCCESS_SUBJECT) before the original is acked.
	Success SuccessPublisher
	// TermKeepsMessage says that terminating a message leaves it in its
	// stream (limits retention). When false (work-queue or interest
	// retention), the original of a dead letter stored without its body is
	// not terminated, so that it is kept.
	TermKeepsMessage bool
	// Connected, when set, reports whether the NATS connection is up
	// (nats.Conn.IsConnected); courier sends no pull while it is not. A pull
	// request that cannot be sent leaks its subscription in nats.go's Fetch.
	Connected func() bool
	// Reconnects, when set, counts the NATS connection's reconnections
	// (nats.Conn.Stats().Reconnects). With order per key, the messages a
	// pull had on their way when the connection broke are lost, and
	// delivered again only after their ack wait: the first message after
	// a reconnection makes the keys of what is out and not here wait for
	// it (fetcher.checkReconnect).
	Reconnects func() uint64
	// Tracer, when set, makes each delivery attempt a span (README, "Tracing")
	// whose parent is the message's trace context, carried on to the app;
	// nil means tracing off: no spans, and traceparent passes through
	// unchanged at no cost.
	Tracer trace.Tracer
	// Propagator reads the trace context of a message's headers and writes
	// the span's into the request to the app; default W3C Trace Context
	// (traceparent, tracestate). Unused while Tracer is nil.
	Propagator propagation.TextMapPropagator
	// Stamp, when set, completes every request to the app (each delivery
	// attempt, each health-URL probe) once its headers are final and its
	// body known, just before it is sent: it may add headers (CloudEvents
	// attributes, a Standard Webhooks signature over exactly body, a bearer
	// token: see cloudevents and appauth). It must be safe for concurrent
	// use; nil adds nothing.
	Stamp func(h http.Header, body []byte)
	// Now is the clock; default time.Now.
	Now func() time.Time

	// ownClient: Client is the one apphttp.NewClient made by default, whose
	// requests go straight to its transport (apphttp.NewEndpoint's own).
	ownClient bool
}

// DefaultRetryable is the default set of transient statuses: 408, 409 (the
// Idempotency-Key draft's answer to a concurrent request with the same key),
// 425, 429, 500 and 502-599.
func DefaultRetryable(s int) bool {
	return s == 408 || s == 409 || s == 425 || s == 429 || s == 500 || (s >= 502 && s <= 599)
}

// withDefaults returns o with defaults filled in, or every invalid value.
func (o Options) withDefaults() (Options, error) {
	if err := o.validate(); err != nil {
		return o, fmt.Errorf("proxy: invalid options: %w", err)
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if o.MaxDeliver == 0 {
		o.MaxDeliver = 5
	}
	if o.MaxInflight == 0 {
		o.MaxInflight = 8
	}
	if o.BatchMax == 0 {
		o.BatchMax = 1
	}
	if o.BatchBytes == 0 {
		o.BatchBytes = 1 << 20
	}
	if o.MaxPayload == 0 {
		o.MaxPayload = 1 << 20
	}
	def(&o.AckWait, 30*time.Second)
	def(&o.InfoInterval, 10*time.Second)
	def(&o.HTTPTimeout, 30*time.Second)
	def(&o.BackoffInitial, time.Second)
	def(&o.BackoffMax, max(10*time.Minute, o.BackoffInitial))
	def(&o.RetryAfterMax, 10*time.Minute)
	def(&o.HealthInterval, 5*time.Second)
	def(&o.SummaryInterval, time.Minute)
	def(&o.BreakerProbe, 5*time.Second)
	def(&o.BreakerProbeMax, min(30*time.Second, o.BackoffMax))
	o.BreakerProbeMax = max(o.BreakerProbeMax, o.BreakerProbe)
	if o.BackoffMultiplier == 0 {
		o.BackoffMultiplier = 2
	}
	if o.Retryable == nil {
		o.Retryable = DefaultRetryable
	}
	if o.IdempotencyHeader == "" {
		o.IdempotencyHeader = apphttp.HeaderIdempotencyKey
	}
	if o.Client == nil {
		o.Client = apphttp.NewClient(apphttp.ClientOptions{MaxConns: o.MaxInflight})
		o.ownClient = true
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o, nil
}

// validate returns every invalid value of o, joined; nil when none is.
func (o Options) validate() error {
	var errs []error
	if o.AppURL == "" || o.Stream == "" || o.Consumer == "" {
		errs = append(errs, errors.New("AppURL, Stream and Consumer are required"))
	}
	if p := o.Partitions; p != nil && (o.OrderKey == nil || o.PriorityGroup == "" || len(p.Consumers) == 0 || p.Assignment == nil) {
		errs = append(errs, errors.New("Partitions needs OrderKey, PriorityGroup, its Consumers and an Assignment"))
	}
	negative := func(name string, v int64) {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative (got %d)", name, v))
		}
	}
	negative("MaxDeliver", int64(o.MaxDeliver))
	negative("MaxInflight", int64(o.MaxInflight))
	negative("MaxPayload", o.MaxPayload)
	negative("BreakerFailures", int64(o.BreakerFailures))
	if o.MaxRate < 0 {
		errs = append(errs, fmt.Errorf("MaxRate must not be negative (got %g)", o.MaxRate))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"AckWait", o.AckWait}, {"InfoInterval", o.InfoInterval}, {"HTTPTimeout", o.HTTPTimeout},
		{"BackoffInitial", o.BackoffInitial}, {"BackoffMax", o.BackoffMax},
		{"RetryAfterMax", o.RetryAfterMax}, {"MaxAge", o.MaxAge}, {"ShutdownGrace", o.ShutdownGrace},
		{"HealthInterval", o.HealthInterval}, {"SummaryInterval", o.SummaryInterval},
		{"BreakerProbe", o.BreakerProbe}, {"BreakerProbeMax", o.BreakerProbeMax},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative (got %s)", d.name, d.v))
		}
	}
	if o.BackoffMultiplier != 0 && o.BackoffMultiplier < 1 {
		errs = append(errs, fmt.Errorf("BackoffMultiplier must be at least 1 (got %g)", o.BackoffMultiplier))
	}
	if o.BackoffInitial > 0 && o.BackoffMax > 0 && o.BackoffMax < o.BackoffInitial {
		errs = append(errs, fmt.Errorf("BackoffMax %s is below BackoffInitial %s", o.BackoffMax, o.BackoffInitial))
	}
	return errors.Join(errs...)
}

// Route sends the messages whose subject matches Pattern (a NATS subject
// pattern, wildcards allowed) to URL (an app URL as AppURL takes it).
type Route struct {
	Pattern string
	URL     string
}
