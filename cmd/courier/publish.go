package main

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/publish"
)

// publishShutdownTimeout bounds the publish API's own shutdown once the
// grace period is over: an acknowledgement takes milliseconds, so a publish
// still waiting then is answered 503 (the app may send it again) rather
// than hold the pod past its termination grace period.
const publishShutdownTimeout = 2 * time.Second

// publishQuiet is how long the publish API stays open, once courier is
// stopping and the delivery loop has stopped, after the last publish the
// app made: an app that has just answered its last request may still
// publish its result.
const publishQuiet = time.Second

// startPublish starts the publish API (README, "Publishing through
// courier") before courier connects to NATS, so that an app publishing while courier starts waits
// for the connection within its request's time (then gets 503 with
// Retry-After), never a refused connection; connect hands it the
// connection, before courier reports ready. The stop it returns is called
// by close, before the connection drains, once the delivery loop has
// stopped: after a stop signal it keeps the API up while the app publishes
// (until publishQuiet has passed without a publish in progress or begun),
// for at most COURIER_SHUTDOWN_GRACE since the signal, then shuts it down,
// letting the publishes in progress finish. An app that publishes nothing
// then does not hold courier for the grace period. Without a stop signal
// (start-up failed, the connection closed for good) it shuts down at once.
func (s *sidecar) startPublish(ctx context.Context) (func(), error) {
	cfg := s.cfg
	srv, err := publish.Listen(cfg.PublishListenAddr(), publish.Options{
		Subjects:   cfg.PublishSubjects,
		Timeout:    cfg.HTTPTimeout,
		Tracer:     s.tracing.Tracer(),     // nil: tracing off
		Propagator: s.tracing.Propagator(), // W3C Trace Context
		Logger:     s.log,
		Registerer: s.reg,
		// COURIER_APP_TOKEN_FILE's token, as last read ("" = none asked).
		Token: s.auth.Token,
		// Delayed publishes wait there; a stream where one of courier's
		// durables would be handed them refuses them.
		SchedulePrefix:     cfg.SchedulePrefix,
		DurableDescription: consumerDescription,
	})
	if err != nil {
		return nil, err
	}
	srv.Start() // logs "publish API listening" with the address
	s.publisher = srv
	var signalled atomic.Pointer[time.Time]
	fired := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		defer close(fired)
		if !errors.Is(context.Cause(ctx), errConnClosed) {
			now := time.Now()
			signalled.Store(&now)
		}
	})
	return func() {
		if !stopWatch() {
			<-fired
		}
		// Kept open only by a courier that reached NATS: one stopped
		// while connecting has nothing to publish with.
		if at := signalled.Load(); at != nil && s.nc != nil {
			end := at.Add(cfg.ShutdownGrace)
			if wait := time.Until(end); wait > 0 {
				s.log.Info("publish API open while the app publishes", "quiet", publishQuiet.String(),
					"at_most", wait.Round(time.Millisecond).String())
				if awaitPublishQuiet(s.reg, publishQuiet, end, time.Now) {
					s.log.Info("publish API: no publish for a while; closing it before the grace period ends")
				}
			}
		}
		sctx, cancel := context.WithTimeout(context.Background(), publishShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			s.log.Warn("publish API: publishes still waiting for an acknowledgement were answered 503", "error", err)
		}
		s.log.Info("publish API stopped")
	}, nil
}

// schedulesReportTimeout bounds the start-up report of where delayed
// publishes wait: a few stream reads.
const schedulesReportTimeout = 5 * time.Second

// connectPublish hands the publish API, if on, the NATS connection.
func (s *sidecar) connectPublish() {
	if s.publisher != nil {
		s.publisher.Connect(s.nc, s.js)
	}
}

// logSchedules logs, if the publish API is on, for each stream it
// publishes to whether delayed publishing is on and where the schedules
// wait, or why it is off and what fixes it. Called once the durables are
// set up: a durable's filter, which start updates to leave the schedules
// out, is one of the reasons.
func (s *sidecar) logSchedules(ctx context.Context) {
	if s.publisher == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, schedulesReportTimeout)
	defer cancel()
	s.publisher.LogSchedules(ctx)
}

// awaitPublishQuiet waits until no publish has been in progress or begun
// for quiet, or until end; it reports whether the API fell quiet. It reads
// the publish API's own metrics (courier_publish_inflight_requests and
// courier_publish_requests_total) from g, polled.
func awaitPublishQuiet(g prometheus.Gatherer, quiet time.Duration, end time.Time, now func() time.Time) bool {
	tick := time.NewTicker(quiet / 10)
	defer tick.Stop()
	lastInflight, lastTotal := publishActivity(g)
	lastChange := now()
	for {
		t := now()
		if !t.Before(end) {
			return false
		}
		inflight, total := publishActivity(g)
		if inflight > 0 || total != lastTotal || inflight != lastInflight {
			lastInflight, lastTotal, lastChange = inflight, total, t
		} else if t.Sub(lastChange) >= quiet {
			return true
		}
		<-tick.C
	}
}

// publishActivity reads the publishes in progress and the publishes
// answered so far from the publish API's metrics.
func publishActivity(g prometheus.Gatherer) (inflight, total float64) {
	families, _ := g.Gather() // a partial result is still a result
	for _, f := range families {
		switch f.GetName() {
		case "courier_publish_inflight_requests":
			for _, m := range f.GetMetric() {
				inflight += m.GetGauge().GetValue()
			}
		case "courier_publish_requests_total":
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return inflight, total
}
