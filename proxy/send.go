package proxy

import (
	"context"
	"errors"
	"net/http"
	"time"

	"golang.org/x/time/rate"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/internal/subject"
	"github.com/courierhq/courier/proxy/limit"
)

// Sending: the one path of every request to the app, a message's and a
// batch's (batcher.go). In order: the grace period (a request is not
// started once it is over), the rate limit (Options.MaxRate), a slot of
// the in-flight limit (inflight.go, package limit): the waits; then the
// request's own checks (request.ready: the decider's mayGo), made after
// the last wait with nothing that can block between them and the write;
// then the request's timeout, the signature (Options.Stamp), the POST to
// the message's target (routes.go), and what came of it told to the limit.
// The sender knows nothing of deliveries, order or batches: it is given a
// request and returns its answer.

// errNotSent: the request was not sent (the grace period ended before it,
// or while it waited for the rate limit or a slot).
var errNotSent = errors.New("request not sent")

// errRefused: the request was not sent because its checks (request.ready)
// refused it once its waits were over; the caller knows why.
var errRefused = errors.New("request refused by its checks")

// sender sends requests to the app. Safe for concurrent use.
type sender struct {
	targets  []target       // AppURL's, then each route's (routes.go)
	routes   []Route        // Options.Routes
	rate     *rate.Limiter  // nil: no rate limit
	inflight *limit.Limiter // one slot per request at the app
	m        *metrics
	stamp    func(http.Header, []byte) // Options.Stamp; nil: none
	timeout  time.Duration             // Options.HTTPTimeout
}

func newSender(o Options, m *metrics) *sender {
	s := &sender{
		targets: newTargets(o), routes: o.Routes, inflight: newInflight(o), m: m,
		stamp: o.Stamp, timeout: o.HTTPTimeout,
	}
	if o.MaxRate > 0 {
		// Burst 1: the cap holds over any window, not just on average.
		s.rate = rate.NewLimiter(rate.Limit(o.MaxRate), 1)
	}
	return s
}

// request is one request to send.
type request struct {
	to     int          // its target (targetOf)
	reason limit.Reason // why it takes a slot
	keep   int64        // how much of a 2xx answer's body is kept
	h      http.Header
	body   []byte
	// ready, if not nil, is called once the request's waits are over (the
	// rate limit, its slot), right before it is written: it makes the
	// checks that may stop the request and returns errRefused if one does;
	// it may make h and body (a batch is put in order and encoded only
	// then). It must not block.
	ready func() (http.Header, []byte, error)
	// outcome, if not nil, says what a 2xx answer tells the limit (a
	// batch's entries may all have failed); nil: a success.
	outcome func(*apphttp.Answer) limit.Outcome
	// timer bounds the request by the HTTP timeout (the worker's lane's);
	// nil: one of its own.
	timer *requestTimer
}

// post sends req within the rate limit and the in-flight limit, bounded by
// its timeout and by requests (the grace period), and returns the answer
// and how long the request took. It returns errNotSent if the grace period
// ended before the request went, and ready's error if that refused it.
//
// Every wait comes first (the rate limit, the slot); then the checks
// (requests, req.ready); from them to the write nothing blocks:
// TestPostChecksAfterItsLastWait (send_test.go) keeps it so.
func (s *sender) post(requests context.Context, req request) (*apphttp.Answer, time.Duration, error) {
	if requests.Err() != nil {
		return nil, 0, errNotSent
	}
	if s.rate != nil {
		began := time.Now()
		if err := s.rate.Wait(requests); err != nil {
			return nil, 0, errNotSent
		}
		s.m.rateWait.Add(time.Since(began).Seconds())
	}
	// A slot of the one bound on requests at the app: the workers are
	// MaxInflight, but a delivery detached from its worker (detach) sends
	// beside them, and an automatic limit may be lower.
	slot, err := s.inflight.Acquire(requests, req.reason)
	if err != nil {
		return nil, 0, errNotSent
	}
	// The waits are over: the checks, and from here to the write nothing
	// that blocks.
	if requests.Err() != nil {
		slot.Release(limit.Dropped)
		return nil, 0, errNotSent
	}
	h, body := req.h, req.body
	if req.ready != nil {
		if h, body, err = req.ready(); err != nil {
			slot.Release(limit.Dropped)
			return nil, 0, err
		}
	}
	t := req.timer
	if t == nil {
		t = newRequestTimer(requests, s.timeout)
		defer t.close()
	}
	ctx := t.start()
	defer t.stop()
	s.m.inflight.Inc()
	defer s.m.inflight.Dec()
	began := time.Now()
	to := s.targets[req.to]
	if to.err != nil {
		slot.Release(limit.Dropped)
		return nil, time.Since(began), &apphttp.AppError{Kind: apphttp.KindTransport, Err: to.err}
	}
	if s.stamp != nil {
		s.stamp(h, body) // now, after the waits: a signature's time is when it is sent
	}
	a, err := to.ep.Post(ctx, h, body, req.keep)
	o := outcomeOf(requests, err)
	if err == nil && req.outcome != nil {
		o = req.outcome(a)
	}
	slot.Release(o)
	return a, time.Since(began), err
}

// targetOf is the index of the target of a message on subj: the first
// route whose pattern subj matches, else AppURL's.
func (s *sender) targetOf(subj string) int {
	for i, rt := range s.routes {
		if subject.Matches(rt.Pattern, subj) {
			return i + 1
		}
	}
	return 0
}

// outcomeOf is what a request's err tells the limiter: an answer's time
// is a sample only for a 2xx; 429 and 503 say the app is overloaded, a
// timeout that it could not keep up; an app that could not be reached, a
// connection lost, or a request abandoned at shutdown (requests ended)
// tell nothing of how long the app takes.
func outcomeOf(requests context.Context, err error) limit.Outcome {
	if err == nil {
		return limit.Success
	}
	if requests.Err() != nil {
		return limit.Dropped
	}
	var ae *apphttp.AppError
	if !errors.As(err, &ae) {
		return limit.Dropped
	}
	switch ae.Kind {
	case apphttp.KindStatus:
		if ae.Status == http.StatusTooManyRequests || ae.Status == http.StatusServiceUnavailable {
			return limit.Overload
		}
		return limit.Failed
	case apphttp.KindTimeout:
		return limit.Timeout
	}
	return limit.Dropped
}
