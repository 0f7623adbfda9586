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
// the in-flight limit (inflight.go, package limit), the request's timeout,
// the signature (Options.Stamp), the POST to the message's target
// (routes.go), and what came of it told to the limit. The sender knows
// nothing of deliveries, order or batches: it is given a request and
// returns its answer.

// errNotSent: the request was not sent (the grace period ended before it,
// or while it waited for the rate limit or a slot).
var errNotSent = errors.New("request not sent")

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
	// prepare, if not nil, makes h and body once the request holds its
	// slot: a batch is put in order, encoded and its span started only
	// then.
	prepare func() (http.Header, []byte)
	// timer bounds the request by the HTTP timeout (the worker's lane's);
	// nil: one of its own.
	timer *requestTimer
}

// post sends req within the rate limit and the in-flight limit, bounded by
// its timeout and by requests (the grace period), and returns the answer
// and how long the request took. It returns errNotSent if the grace period
// ended before the request went.
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
	h, body := req.h, req.body
	if req.prepare != nil {
		h, body = req.prepare()
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
		s.stamp(h, body) // now, after the rate limit's wait: a signature's time is when it is sent
	}
	a, err := to.ep.Post(ctx, h, body, req.keep)
	slot.Release(outcomeOf(requests, err))
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
