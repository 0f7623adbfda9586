package tracing

import (
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
)

// ErrorHandler returns an OpenTelemetry error handler, for
// otel.SetErrorHandler, that logs what the SDK cannot do (an export the
// collector refused or did not answer) on log at warn, at most one line
// per every (default 1m) with the number of errors left out since: a
// collector that is down must not flood courier's logs, nor go unnoticed.
// Without it the SDK writes plain text to the standard log package. It is
// safe for concurrent use.
func ErrorHandler(log *slog.Logger, every time.Duration) otel.ErrorHandler {
	if every <= 0 {
		every = time.Minute
	}
	return &errorLog{log: log.With("component", "tracing"), every: every, now: time.Now}
}

type errorLog struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	last    time.Time // of the last line logged; zero before the first
	dropped int       // errors left out since
}

func (e *errorLog) Handle(err error) {
	e.mu.Lock()
	now := e.now()
	if !e.last.IsZero() && now.Sub(e.last) < e.every {
		e.dropped++
		e.mu.Unlock()
		return
	}
	dropped := e.dropped
	e.last, e.dropped = now, 0
	e.mu.Unlock()
	e.log.Warn("tracing: spans not exported", "error", err, "errors_not_logged", dropped)
}
