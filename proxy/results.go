package proxy

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/success"
)

// succeeded settles a 2xx: the success record (if configured) is stored
// before the key is recorded and the message acked (recorder.go). If the
// record cannot be stored yet, the message is held in progress and the
// record retried in the background, so that a success stream that refuses
// records does not take the worker; the app is not called again for it. If courier stops before it is stored, the message
// is given back without its key recorded: the record is not lost, the app
// sees the message again (with the same Idempotency-Key).
func (s *settler) succeeded(d *delivery, a *apphttp.Answer, took time.Duration) {
	if s.o.Success == nil {
		s.recs <- recJob{d: d, took: took}
		return
	}
	then := func() { s.recs <- recJob{d: d, took: took} }
	rec := success.Record{
		Subject: d.m.Subject(), Stream: d.meta.Stream, Consumer: s.o.Consumer,
		Sequence: d.meta.Sequence.Stream, Attempt: d.attempt, Key: d.key,
	}
	if a != nil {
		rec.Status, rec.Header, rec.Body, rec.BodyCut, rec.BodySize = a.Status, a.Header, a.Body, a.Cut, a.Size
	}
	rec.Trace = recordTrace(d, a, s.o.Tracer != nil)
	once := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err := s.o.Success.Publish(ctx, rec)
		if err != nil {
			s.m.successErrors.Inc()
			s.successErr.Store(&err)
			d.log.Error("cannot store the success record; message held and tried again", "error", err)
			return err
		}
		s.m.successRecords.Inc()
		return nil
	}
	if once(context.WithoutCancel(s.ph.requests)) == nil {
		then()
		return
	}
	s.inBackground(&s.pendingSuccess, once, then, func() {
		s.unclaim(d)
		s.giveBack(d, nakNow, "shutting down before its success record could be stored")
	})
}

// recordTrace is the trace context a success record keeps, as a dead letter
// keeps the message's (README, "Tracing"): with tracing on, the attempt
// span's, which attempt put on the answer's headers (inject); with tracing
// off, the message's own traceparent and tracestate, under the names the
// publisher gave them. Nil when there is none.
func recordTrace(d *delivery, a *apphttp.Answer, traced bool) nats.Header {
	src := map[string][]string(d.m.Headers())
	if traced {
		if a == nil {
			return nil
		}
		src = a.Header
	}
	var tc nats.Header
	for name, vs := range src {
		if len(vs) > 0 && (strings.EqualFold(name, "traceparent") || strings.EqualFold(name, "tracestate")) {
			if tc == nil {
				tc = make(nats.Header, 2)
			}
			tc[name] = vs
		}
	}
	return tc
}
