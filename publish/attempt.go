package publish

// A publish's way to JetStream: the first attempt, the retries within the
// request's time while the server cannot acknowledge, and what the answer
// then says.

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natshdr"
	"github.com/courierhq/courier/internal/retry"
)

// publishMsg publishes m, retrying until the deadline, and returns the
// answer; reqCtx tells whether the caller went away.
func (s *Server) publishMsg(reqCtx context.Context, deadline time.Time, m *nats.Msg, generated bool, maxPayload int64) result {
	if size := int64(len(m.Data) + natshdr.Size(m.Header)); size > maxPayload {
		return fail(refuse(http.StatusRequestEntityTooLarge, outcomeTooLarge,
			"the message is %d bytes with its headers, more than the server's max_payload (%d bytes)", size, maxPayload))
	}
	var maybeStored bool // an earlier attempt may have been stored
	// The first attempt goes without a retry schedule or a context of
	// the request's time: most publishes need neither.
	ack, err := s.attempt(reqCtx, deadline, m, &maybeStored)
	return s.settle(reqCtx, deadline, m, generated, ack, err, maybeStored)
}

// settle is the answer to a publish whose first attempt ended with ack or
// err (a *refusal or a *transient, as judge leaves it): acknowledged, or
// refused, or retried until deadline when another attempt may fix it.
func (s *Server) settle(reqCtx context.Context, deadline time.Time, m *nats.Msg, generated bool, ack *jetstream.PubAck, err error, maybeStored bool) result {
	if err == nil {
		return acknowledged(ack, generated, maybeStored)
	}
	var tr *transient
	if errors.As(err, &tr) {
		ack, err = s.retry(reqCtx, deadline, m, tr, &maybeStored)
	}
	switch {
	case err == nil:
		return acknowledged(ack, generated, maybeStored)
	case errors.As(err, &tr):
		return s.timedOut(reqCtx, tr)
	}
	res := fail(err)
	res.maybeStored = maybeStored
	return res
}

// acknowledged is the answer to a publish the stream acknowledged with ack.
func acknowledged(ack *jetstream.PubAck, generated, maybeStored bool) result {
	res := result{status: http.StatusOK, outcome: outcomeStored, ack: ack}
	// A duplicate of courier's own id, or of an attempt of this very
	// request, is this request's message: not a duplicate to the app.
	if ack.Duplicate && !generated && !maybeStored {
		res.outcome, res.dup = outcomeDuplicate, true
	}
	return res
}

// retry makes the attempts after a first one that failed with first,
// spaced by retryPolicy, until one is acknowledged or refused for good, or
// the deadline passes. It returns the ack, the refusal, or the last
// attempt's *transient error once time is up (or the caller went away).
func (s *Server) retry(reqCtx context.Context, deadline time.Time, m *nats.Msg, first *transient, maybeStored *bool) (*jetstream.PubAck, error) {
	ctx, cancel := context.WithDeadline(reqCtx, deadline)
	defer cancel()
	var ack *jetstream.PubAck
	last := first
	made := true // the first attempt is made: its error starts the schedule
	err := retry.Do(ctx, retryPolicy, func(ctx context.Context) error {
		if made {
			made = false
			return last
		}
		a, err := s.attempt(ctx, deadline, m, maybeStored)
		if err == nil {
			ack = a
			return nil
		}
		if !errors.As(err, &last) {
			return retry.Permanent(err)
		}
		return err
	}, func(error, time.Duration) { s.m.retries.Inc() })
	if err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return nil, last
	}
	return ack, err
}

// attempt publishes m once, within attemptTimeout and the deadline, and
// returns the ack, a *refusal, or a *transient error another attempt may
// fix; it sets *maybeStored when the attempt may have been stored all the
// same.
func (s *Server) attempt(parent context.Context, deadline time.Time, m *nats.Msg, maybeStored *bool) (*jetstream.PubAck, error) {
	if !s.nc.IsConnected() {
		return nil, &transient{errNotConnected}
	}
	if d := time.Now().Add(attemptTimeout); d.Before(deadline) {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(parent, deadline)
	defer cancel()
	a, err := s.js.PublishMsg(ctx, m, s.pubOpts...)
	if err == nil {
		return a, nil
	}
	return nil, s.judge(ctx, m, err, maybeStored)
}

// judge decides what an attempt's error means (classify): a *refusal, or a
// *transient another attempt may fix, setting *maybeStored when the
// attempt may have been stored all the same.
func (s *Server) judge(ctx context.Context, m *nats.Msg, err error, maybeStored *bool) error {
	err = classify(ctx, err, func(ctx context.Context) (bool, error) {
		_, err := s.js.StreamNameBySubject(ctx, m.Subject)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return true, nil
		}
		return false, err
	})
	var tr *transient
	if !errors.As(err, &tr) {
		return err
	}
	// A request that timed out may have been stored; one no stream
	// answered, or that the server turned down, was not.
	var apiErr *jetstream.APIError
	if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.As(err, &apiErr) {
		*maybeStored = true
	}
	return tr
}

// timedOut is the answer when the request's time ran out (or the caller
// went away) before an acknowledgement; last is the last attempt's error.
func (s *Server) timedOut(reqCtx context.Context, last error) result {
	if reqCtx.Err() != nil {
		return result{status: http.StatusServiceUnavailable, outcome: outcomeCanceled, msg: "the request ended before an acknowledgement"}
	}
	why := "no acknowledgement within " + s.o.Timeout.String()
	if last != nil {
		why += ": " + last.Error()
	}
	return result{status: http.StatusServiceUnavailable, outcome: outcomeUnavailable, msg: why}
}
