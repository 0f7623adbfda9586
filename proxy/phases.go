package proxy

import "context"

// phases are the steps of a Runner's shutdown, in the order they begin. Each
// is a context that ends when its step begins, so code waits on the step it
// cares about by name.
//
//  1. stopping: Run's context ended. Fetching stops (the open pull runs to its
//     end) and nothing waits for the app any more.
//  2. noStart: workers start no new delivery. Ends with stopping, or when
//     fetching ended for any other reason (the consumer was deleted).
//  3. fetched: the last pull has ended, so nothing more arrives. Only now is a
//     message given back (NAK'd): before, it could come straight back to the
//     open pull and spend another delivery.
//  4. requests: the grace period is over; requests still running are
//     abandoned.
type phases struct {
	stopping context.Context
	noStart  context.Context
	fetched  context.Context
	requests context.Context

	endNoStart, endFetch, abandon context.CancelFunc
}

// lane is one worker's view of the steps its deliveries wait on: contexts
// that end with noStart and requests. Every attempt derives a context with a
// timeout (the dedup check, the request); derived from a lane it registers
// with that worker's context, not with the one every worker shares, so that
// starting and ending it takes no lock other workers contend for.
type lane struct {
	noStart, requests context.Context
	// timer bounds the worker's requests (derived from requests); nil in
	// the zero lane of a delivery only given back (keyer.message).
	timer *requestTimer
	// batchDone answers the worker's delivery in a batch (batcher.submit),
	// one at a time; nil in the zero lane.
	batchDone chan result
}

// lane returns a new lane; its owner calls stop when done with it.
func (p *phases) lane() (l lane, stop func()) {
	var c1, c2 context.CancelFunc
	l.noStart, c1 = context.WithCancel(p.noStart)
	l.requests, c2 = context.WithCancel(p.requests)
	return l, func() { c1(); c2() }
}

// newPhases derives the phases from Run's context. stop releases them all.
func newPhases(ctx context.Context) (p *phases, stop func()) {
	p = &phases{stopping: ctx}
	p.noStart, p.endNoStart = context.WithCancel(ctx)
	// The later steps outlive ctx: they end only when Run reaches them.
	p.fetched, p.endFetch = context.WithCancel(context.WithoutCancel(ctx))
	p.requests, p.abandon = context.WithCancel(context.WithoutCancel(ctx))
	return p, func() { p.endNoStart(); p.endFetch(); p.abandon() }
}
