// Package reply answers NATS requests through the app: each request on the
// configured subjects is POSTed to the app and the app's answer is the reply
// (README, "Results out"). It is a NATS micro service, so `nats micro ls`, and the
// $SRV.PING, $SRV.INFO and $SRV.STATS subjects, see it.
//
// Nothing here retries, dedups or dead-letters: as in any synchronous call,
// the caller owns retries. Every request gets a reply, an error reply when the
// app gave no usable answer (docs/behaviour.md#requestreply).
package reply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/courierhq/courier/apphttp"
)

// Service answers requests on Options.Subjects through the app. Create it with
// New, call Start once and Stop when done; its methods are safe for
// concurrent use.
type Service struct {
	nc  *nats.Conn
	o   Options
	log *slog.Logger
	m   *metrics
	app *apphttp.Endpoint // Options.URL, sent to by Options.Client

	abort  context.Context
	cancel context.CancelFunc // ends requests still running after the grace period

	mu      sync.Mutex
	svc     micro.Service // nil until Start
	started bool          // Start was called
	closed  bool          // set by Stop; no request starts after it
	running sync.WaitGroup
	stop    sync.Once
	// Requests at the app (at most MaxConcurrent, each on a goroutine of
	// its own), those waiting for one of them to end (first in, first
	// out) and the bytes they hold; busyNow: the last request that came
	// found no room to wait.
	atApp        int
	waiting      []waiter
	waitingBytes int64
	busyNow      bool
	// lateNow: the last request taken from the waiting ones had waited
	// longer than Options.Timeout.
	lateNow bool

	endpoints map[string]*endpoint // by subject, fixed after Start
	appDown   appState
}

// New returns a Service that answers on nc once started. It registers the
// metrics on opts.Registerer; nothing is subscribed before Start. nc stays the
// caller's to drain and close, after Stop.
func New(nc *nats.Conn, opts Options) (*Service, error) {
	if nc == nil {
		return nil, errors.New("reply: a NATS connection is required")
	}
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	app, err := apphttp.NewEndpoint(opts.Client, opts.URL, false)
	if err != nil {
		return nil, fmt.Errorf("reply: URL %q: %w", redact(opts.URL), err)
	}
	abort, cancel := context.WithCancel(context.Background())
	return &Service{
		nc:     nc,
		o:      opts,
		log:    opts.Logger.With("component", "reply"),
		m:      m,
		app:    app,
		abort:  abort,
		cancel: cancel,
	}, nil
}

// Start registers the micro service, one endpoint per subject in the queue
// group, and returns once the server has its subscriptions (or ctx ends;
// 10s when ctx has no deadline). It may be called once; a Service stopped
// before Start does not start.
func (s *Service) Start(ctx context.Context) error {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return errors.New("reply: service stopped")
	case s.started:
		s.mu.Unlock()
		return errors.New("reply: service already started")
	}
	s.started = true
	s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}

	// The endpoints' own counts exist before micro can ask for them.
	s.endpoints = make(map[string]*endpoint, len(s.o.Subjects))
	for _, subj := range s.o.Subjects {
		s.endpoints[subj] = &endpoint{subject: subj}
	}
	version, metadata := microVersion(s.o.Version)
	svc, err := micro.AddService(s.nc, micro.Config{
		Name:        s.o.Name,
		Version:     version,
		Description: "courier: each request is POSTed to the app and its answer is the reply",
		Metadata:    metadata,
		QueueGroup:  s.o.QueueGroup,
		// Requests are answered from goroutines of this package, after
		// micro's handler has returned, so micro's own counts see neither
		// their time nor their errors: each endpoint's stats data has them.
		StatsHandler: s.endpointStats,
		ErrorHandler: func(_ micro.Service, err *micro.NATSError) {
			s.log.Warn("NATS error on a reply subscription", "error", err)
		},
	})
	if err != nil {
		return fmt.Errorf("reply: adding micro service %q: %w", s.o.Name, err)
	}
	names := endpointNames(s.o.Subjects)
	for i, subj := range s.o.Subjects {
		ep := s.endpoints[subj]
		err := svc.AddEndpoint(names[i], micro.HandlerFunc(func(r micro.Request) { s.dispatch(ep, r) }),
			micro.WithEndpointSubject(subj))
		if err != nil {
			_ = svc.Stop()
			return fmt.Errorf("reply: adding endpoint for %q: %w", subj, err)
		}
	}
	s.mu.Lock()
	if s.closed {
		// Stop ran meanwhile and found nothing to stop.
		s.mu.Unlock()
		_ = svc.Stop()
		return errors.New("reply: service stopped")
	}
	s.svc = svc
	s.mu.Unlock()
	// Once the server has the subscriptions, a request sent after Start
	// returns reaches this service.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	if err := s.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("reply: confirming subscriptions: %w", err)
	}
	s.log.Info("answering requests", "subjects", strings.Join(s.o.Subjects, ","), "url", redact(s.o.URL),
		"queue_group", s.o.QueueGroup, "max_concurrent", s.o.MaxConcurrent, "timeout", s.o.Timeout.String())
	return nil
}

// Ready reports why the service cannot answer now, or nil while it can:
// started, not stopped, connected to NATS.
func (s *Service) Ready() error {
	s.mu.Lock()
	svc, closed := s.svc, s.closed
	s.mu.Unlock()
	switch {
	case closed:
		return errors.New("reply service stopped")
	case svc == nil:
		return errors.New("reply service not started")
	case svc.Stopped():
		// micro stops a service whose connection closed.
		return errors.New("reply service stopped: NATS connection closed")
	case !s.nc.IsConnected():
		return fmt.Errorf("reply service not connected to NATS (%s)", s.nc.Status())
	}
	return nil
}

// Stop unsubscribes (the queue group's other members take the requests from
// then on), answers 503 to requests received but not begun, lets requests in
// flight finish within Options.ShutdownGrace, then cancels the rest (answered
// 503), and returns once every request of this service is answered. It is
// idempotent; a second call waits for the first to finish.
func (s *Service) Stop() {
	s.stop.Do(func() {
		s.mu.Lock()
		svc := s.svc
		s.mu.Unlock()
		if svc != nil {
			if err := svc.Stop(); err != nil {
				s.log.Warn("stopping micro service", "error", err)
			}
		}
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.refuseWaiting()

		done := make(chan struct{})
		go func() { s.running.Wait(); close(done) }()
		t := time.NewTimer(s.o.ShutdownGrace)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			s.log.Warn("shutdown grace period over; cancelling reply requests still running",
				"grace", s.o.ShutdownGrace.String())
			s.cancel()
			<-done
		}
		s.cancel()
		if svc != nil {
			s.log.Info("reply service stopped")
		}
	})
}

// dispatch runs on the endpoint's subscription goroutine and never blocks
// it: a request that finds fewer than MaxConcurrent at the app goes to the
// app at once, on a goroutine of its own; one that does not waits in
// courier, first in, first out, if fewer than Options.MaxWaiting requests
// (and maxWaitingBytes of data) are waiting already, and is answered 503
// "busy" at once otherwise. A subscription left blocked would pile requests
// up in the client's buffer until the client dropped them unanswered, each
// caller learning nothing until its own timeout.
func (s *Service) dispatch(ep *endpoint, req micro.Request) {
	if req.Reply() == "" {
		// A publish, not a request: nobody waits for an answer, and calling
		// the app for it would act on something no caller can see the end of.
		s.m.outcome(outcomeNoReply)
		s.log.Debug("ignored a message without a reply subject", "subject", req.Subject())
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.refuse(req)
		return
	}
	if s.atApp < s.o.MaxConcurrent {
		s.atApp++
		s.overloaded(false)
		s.running.Add(1)
		s.mu.Unlock()
		go s.work(waiter{ep: ep, req: req})
		return
	}
	w := waiter{ep: ep, req: req, size: int64(len(req.Data()) + len(req.Subject()) + len(req.Reply())), since: time.Now()}
	if len(s.waiting) >= s.o.MaxWaiting || s.waitingBytes+w.size > maxWaitingBytes {
		n := len(s.waiting)
		s.mu.Unlock()
		s.busy(req, n)
		return
	}
	s.waiting = append(s.waiting, w)
	s.waitingBytes += w.size
	s.overloaded(false)
	s.mu.Unlock()
	s.m.waiting.Inc()
}

// waiter is a request waiting for its turn at the app, with its size as
// counted against maxWaitingBytes and when it began to wait.
type waiter struct {
	ep    *endpoint
	req   micro.Request
	size  int64
	since time.Time
}

// work serves w, then the requests waiting, one after another, the oldest
// first, until none is left or the service stops. A request that waited
// longer than Options.Timeout is answered 503 busy instead of being sent:
// its caller, who allowed about that long, has most likely given up and
// may have tried again, and the app would act on it unseen.
func (s *Service) work(w waiter) {
	defer s.running.Done()
	for {
		s.serve(w.ep, w.req)
		var late []waiter
		s.mu.Lock()
		for {
			if len(s.waiting) == 0 || s.closed {
				s.atApp--
				s.mu.Unlock()
				s.m.waiting.Sub(float64(len(late)))
				s.tooLate(late)
				return
			}
			w = s.waiting[0]
			s.waiting[0] = waiter{}
			s.waiting = s.waiting[1:]
			s.waitingBytes -= w.size
			waited := time.Since(w.since)
			if waited <= s.o.Timeout {
				s.waitedTooLong(false, waited)
				break
			}
			s.waitedTooLong(true, waited)
			late = append(late, w)
		}
		s.mu.Unlock()
		s.m.waiting.Sub(float64(len(late) + 1))
		s.tooLate(late)
	}
}

// tooLate answers the requests that waited longer than Options.Timeout for
// a slot, taken from the waiting ones.
func (s *Service) tooLate(ws []waiter) {
	for _, w := range ws {
		a := s.respond(w.req, lateAnswer(time.Since(w.since), s.o.Timeout))
		s.m.outcome(a.outcome)
	}
}

// waitedTooLong logs when requests taken from the waiting ones start having
// waited longer than Options.Timeout, and when one has not: one line per
// change, not one per request. s.mu is held.
func (s *Service) waitedTooLong(now bool, waited time.Duration) {
	if s.lateNow == now {
		return
	}
	s.lateNow = now
	if now {
		s.log.Warn("reply requests waited longer than the timeout for a slot; answering them 503 busy, not sending them to the app",
			"waited", waited.Round(time.Millisecond).String(), "timeout", s.o.Timeout.String(), "max_concurrent", s.o.MaxConcurrent)
	} else {
		s.log.Info("reply requests reach the app within the timeout again")
	}
}

// refuseWaiting answers 503 every request still waiting, once the service
// is closed (no request joins them then).
func (s *Service) refuseWaiting() {
	s.mu.Lock()
	ws := s.waiting
	s.waiting, s.waitingBytes = nil, 0
	s.mu.Unlock()
	for _, w := range ws {
		s.m.waiting.Dec()
		s.refuse(w.req)
	}
}

// busy answers a request that found every slot taken and no room to wait:
// 503 at once, so that its caller can try again, on another member of the
// queue group if there is one.
// The change to busy is logged first, so that whoever sees the answer or
// its count finds the line too.
func (s *Service) busy(req micro.Request, waiting int) {
	s.mu.Lock()
	s.overloaded(true)
	s.mu.Unlock()
	a := s.respond(req, busyAnswer(s.o.MaxConcurrent, waiting))
	s.m.outcome(a.outcome)
}

// overloaded logs when requests start being refused as busy and when one
// may wait again: one line per change, not one per request. s.mu is held.
func (s *Service) overloaded(now bool) {
	if s.busyNow == now {
		return
	}
	s.busyNow = now
	if now {
		s.log.Warn("reply requests beyond capacity; answering 503 busy to those that cannot wait",
			"max_concurrent", s.o.MaxConcurrent, "max_waiting", s.o.MaxWaiting)
	} else {
		s.log.Info("reply requests within capacity again")
	}
}

// refuse answers a request that arrived as the service stops: the caller
// can retry at once on another member of the queue group.
func (s *Service) refuse(req micro.Request) {
	a := s.respond(req, stoppingAnswer())
	s.m.outcome(a.outcome)
}

// serve calls the app for one request and replies with its answer.
func (s *Service) serve(ep *endpoint, req micro.Request) {
	h := s.requestHeaders(req)
	ctx, cancel := context.WithTimeout(s.abort, s.o.Timeout)
	defer cancel()
	if s.o.Stamp != nil {
		s.o.Stamp(h, req.Data())
	}
	began := time.Now()
	s.m.inflight.Inc()
	a := call(ctx, s.app, h, req.Data(), s.nc.MaxPayload(), s.o.Timeout)
	s.m.inflight.Dec()
	took := time.Since(began)
	if a.err != nil && s.abort.Err() != nil {
		a = stoppingAnswer()
	}
	s.noteApp(a)
	a = s.respond(req, a)
	s.m.request(a.outcome, took.Seconds())
	ep.record(took, a)
	if a.err != nil && a.outcome != outcomeUnavailable && a.outcome != outcomeStopping {
		s.log.Warn("request answered with an error", "subject", req.Subject(), "outcome", a.outcome,
			"code", a.code, "error", a.err, "took", took.String())
		return
	}
	s.log.Debug("request answered", "subject", req.Subject(), "status", a.status, "outcome", a.outcome,
		"bytes", len(a.body), "took", took.String())
}

// respond publishes the reply and returns the answer sent: one too large to
// publish becomes an error reply saying so, never silence.
func (s *Service) respond(req micro.Request, a answer) answer {
	err := s.nc.PublishMsg(a.message(req.Reply()))
	if errors.Is(err, nats.ErrMaxPayload) {
		// The body fitted max_payload; with the app's headers it did not.
		a = tooLargeAnswer(a.status, s.nc.MaxPayload())
		err = s.nc.PublishMsg(a.message(req.Reply()))
	}
	if err != nil {
		s.m.replyErrors.Inc()
		s.log.Warn("cannot send reply; the caller will time out", "subject", req.Subject(), "error", err)
	}
	return a
}

// endpointStats is micro's StatsHandler: each endpoint's own counts.
func (s *Service) endpointStats(e *micro.Endpoint) any {
	if ep, ok := s.endpoints[e.Subject]; ok {
		return ep.stats()
	}
	return nil
}

// noteApp logs when the app becomes unreachable and when it answers again:
// one line per change, not one per request.
func (s *Service) noteApp(a answer) {
	switch {
	case a.outcome == outcomeUnavailable:
		if s.appDown.set(true) {
			s.log.Warn("app unreachable; answering reply requests 503 until it answers", "url", redact(s.o.URL), "error", a.err)
		}
	case a.status != 0:
		if s.appDown.set(false) {
			s.log.Info("app answering reply requests again", "url", redact(s.o.URL))
		}
	}
}

// appState is whether the app was last found unreachable.
type appState struct {
	mu   sync.Mutex
	down bool
}

// set records down and reports whether it changed.
func (a *appState) set(down bool) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	changed := a.down != down
	a.down = down
	return changed
}
