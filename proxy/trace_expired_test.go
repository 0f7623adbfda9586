package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// A message that outlives COURIER_MAX_AGE while the app is unavailable is
// dead-lettered by its attempt: the attempt's span says so, as every other
// dead letter's does.
func TestAttemptSpanOutcomeExpiredDuringOutage(t *testing.T) {
	e := setup(t)
	listen := appLater(t, e)

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	if _, err := e.js.PublishMsg(context.Background(), nats.NewMsg("s.x")); err != nil {
		t.Fatal(err)
	}
	_, _ = e.runWith(t, nil, proxy.Options{Tracer: tp.Tracer("test"), MaxAge: 300 * time.Millisecond,
		HealthInterval: 50 * time.Millisecond})
	time.Sleep(600 * time.Millisecond) // held past MaxAge
	listen(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))

	poll.Until(t, 10*time.Second, "the dead letter", func() bool { return e.deadLetters(t) == 1 && len(rec.Ended()) == 1 })
	for _, a := range rec.Ended()[0].Attributes() {
		if a.Key == "courier.outcome" {
			if got := a.Value.AsString(); got != "dead_lettered" {
				t.Errorf("outcome %q, want dead_lettered", got)
			}
			return
		}
	}
	t.Errorf("span without courier.outcome: %v", rec.Ended()[0].Attributes())
}
