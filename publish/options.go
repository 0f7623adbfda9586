package publish

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/courierhq/courier/internal/subject"
	"github.com/courierhq/courier/schedule"
)

// Options tunes a Server. Subjects is required; every other zero value means
// the default stated on the field.
type Options struct {
	// Subjects are those the app may publish to, NATS wildcards allowed
	// (COURIER_PUBLISH_SUBJECTS). A subject no entry matches is refused 403.
	Subjects []string
	// Token returns the bearer token callers must send as
	// "Authorization: Bearer <token>"; "" asks for none. It is called on
	// every request, so a token re-read from a file takes effect at once;
	// it must be fast and safe for concurrent use. Nil asks for none.
	// Without a token, a request must come from this host (a loopback
	// address, or the address it reached: a client in the same pod) and
	// name courier in its Host by a loopback name or the listen address
	// (so that a browser page cannot reach it by DNS rebinding); with
	// one, from any peer by any name. A browser's cross-site request is
	// refused either way.
	Token func() string
	// Timeout bounds one publish, from its arrival to the stream's
	// acknowledgement, courier's own retries included; past it the caller
	// gets 503 with Retry-After. The sidecar passes COURIER_HTTP_TIMEOUT.
	// Default 10s.
	Timeout time.Duration
	// MaxConcurrent bounds the publishes in progress at once, a batch's
	// entries each counting; a single publish beyond it is answered 503
	// busy at once (with Retry-After), and a batch waits for its share
	// within its time, so that memory stays bounded however many requests
	// arrive. Default 256.
	MaxConcurrent int
	// MaxConns bounds the connections the API holds at once; past it the
	// one longest without a request in progress (idle, or not yet sent
	// its request) is closed to make room (internal/connlimit). Default
	// twice what may be in progress: MaxConcurrent publishes and the
	// batch requests (64).
	MaxConns int
	// IdleTimeout closes a keep-alive connection after this long without
	// a request, and ReadHeaderTimeout one that has not sent a request's
	// headers after this long. Defaults 1m and 5s.
	IdleTimeout, ReadHeaderTimeout time.Duration
	// MaxBatchBytes bounds the body of a batch request (BatchPath); a
	// larger one is refused 413 before it is read. Default 8 MiB.
	MaxBatchBytes int64
	// RetryAfter is what a 503 tells the caller to wait, rounded up to
	// whole seconds. Default 1s.
	RetryAfter time.Duration
	// Tracer, when set, makes a producer span of each publish whose parent
	// is the request's traceparent and whose context the message carries.
	// Nil: no spans, and traceparent passes as any other header.
	Tracer trace.Tracer
	// Propagator reads the request's trace context and writes the
	// message's. Default W3C Trace Context.
	Propagator propagation.TextMapPropagator
	// SchedulePrefix is where delayed publishes wait
	// (COURIER_SCHEDULE_PREFIX): a message published with Courier-Delay or
	// Courier-Deliver-At is stored as a schedule on
	// <SchedulePrefix>.<STREAM>.<token> in its subject's stream (package
	// schedule), and nothing may be published there directly. Default
	// schedule.DefaultPrefix (_sched).
	SchedulePrefix string
	// DurableDescription is the description of the durable consumers
	// courier sets up ("courier sidecar"). A delayed publish to a stream
	// is refused (409) while one of them would be handed the schedules
	// themselves (set up before the stream captured them; it leaves them
	// out from its next start). "": no consumer is told for courier's.
	DurableDescription string
	// Logger receives logs, narrowed with component=publish; default
	// discards. Publishes are logged at debug only.
	Logger *slog.Logger
	// Registerer receives the metrics; default a private registry.
	Registerer prometheus.Registerer
}

// maxHeaderBytes bounds a request's header block: JetStream refuses a
// message whose headers exceed 64 KiB (JSStreamHeaderExceedsMaximumErr in
// nats-server's server/errors.json), so a larger block could never be
// published. net/http answers 431 beyond it.
const maxHeaderBytes = 64 << 10

func (o *Options) defaults() error {
	if len(o.Subjects) == 0 {
		return errors.New("publish: Subjects are required")
	}
	for _, s := range o.Subjects {
		if err := subject.Check(s); err != nil {
			return fmt.Errorf("publish: subject %w", err)
		}
	}
	if o.SchedulePrefix == "" {
		o.SchedulePrefix = schedule.DefaultPrefix
	}
	if err := subject.CheckLiteral(o.SchedulePrefix); err != nil {
		return fmt.Errorf("publish: schedule prefix %w", err)
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = 256
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 2 * (o.MaxConcurrent + maxBatches)
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = time.Minute
	}
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = 5 * time.Second
	}
	if o.MaxBatchBytes <= 0 {
		o.MaxBatchBytes = 8 << 20
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = time.Second
	}
	if o.Propagator == nil {
		o.Propagator = propagation.TraceContext{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	return nil
}
