package main

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/courierhq/courier/publish"
)

// publishShutdownTimeout bounds the publish API's own shutdown once the
// grace period is over: an acknowledgement takes milliseconds, so a publish
// still waiting then is answered 503 (the app may send it again) rather
// than hold the pod past its termination grace period.
const publishShutdownTimeout = 2 * time.Second

// startPublish starts the publish API (README, "Publishing through
// courier") before courier connects to NATS, so that an app publishing while courier starts waits
// for the connection within its request's time (then gets 503 with
// Retry-After), never a refused connection; connect hands it the
// connection, before courier reports ready. The stop it returns is called
// by close, before the connection drains: after a stop signal it keeps the
// API up until COURIER_SHUTDOWN_GRACE has passed since the signal, so that
// an app finishing its last request can still publish its result, then
// shuts it down, letting the publishes in progress finish. Without a stop
// signal (start-up failed, the connection closed for good) it shuts down at
// once.
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
			if wait := time.Until(at.Add(cfg.ShutdownGrace)); wait > 0 {
				s.log.Info("publish API open until the grace period ends", "for", wait.Round(time.Millisecond).String())
				<-time.After(wait)
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

// connectPublish hands the publish API, if on, the NATS connection.
func (s *sidecar) connectPublish() {
	if s.publisher != nil {
		s.publisher.Connect(s.nc, s.js)
	}
}
