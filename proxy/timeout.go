package proxy

import (
	"context"
	"time"
)

// requestTimer bounds one worker's requests by the HTTP timeout.
// context.WithTimeout for every request costs a context, a timer, a done
// channel and the transport's child registered in a map of its own: five
// allocations a message. A worker sends one request at a time, so it keeps
// one context and one timer, armed for each request and disarmed after it,
// and makes them again only once a request has timed out. A request that
// times out ends as one under context.WithTimeout does: the transport
// reports the context's cause, context.DeadlineExceeded.
//
// A requestTimer is used by one goroutine.
type requestTimer struct {
	parent  context.Context // the worker's lane: ends with the grace period
	timeout time.Duration
	ctx     context.Context // nil: made at the next start
	cancel  context.CancelCauseFunc
	timer   *time.Timer
}

func newRequestTimer(parent context.Context, timeout time.Duration) *requestTimer {
	return &requestTimer{parent: parent, timeout: timeout}
}

// start arms the timer and returns the context for one request. The caller
// calls stop once the request, its answer read, is over.
func (t *requestTimer) start() context.Context {
	if t.ctx != nil {
		t.timer.Reset(t.timeout)
		return t.ctx
	}
	ctx, cancel := context.WithCancelCause(t.parent)
	t.ctx, t.cancel = ctx, cancel
	t.timer = time.AfterFunc(t.timeout, func() { cancel(context.DeadlineExceeded) })
	return ctx
}

// stop disarms the timer. If it fired, or is firing, the context is done
// (or about to be) and is dropped for a new one.
func (t *requestTimer) stop() {
	if t.timer.Stop() {
		return
	}
	t.cancel(context.DeadlineExceeded)
	t.ctx = nil
}

// close releases the context; the timer is no longer needed.
func (t *requestTimer) close() {
	if t.ctx != nil {
		t.timer.Stop()
		t.cancel(context.Canceled)
		t.ctx = nil
	}
}
