// What a Runner knows of its own delivery path, for an operator: the
// admin server's /v1/state, which `courier status` shows beside the
// server's view of the consumer.

package proxy

import (
	"time"

	"github.com/courierhq/courier/proxy/limit"
)

// State is a Runner's delivery path at one instant. Its JSON is what the
// admin server's /v1/state answers for each subscription.
type State struct {
	// Stream and Consumer name the durable.
	Stream   string `json:"stream"`
	Consumer string `json:"consumer"`
	// Ready is "" while the runner is ready (Runner.Ready), else why not.
	Ready string `json:"ready,omitempty"`
	// Bound: pulls reach the consumer (with partitions: every partition
	// this courier pulls from).
	Bound bool `json:"bound"`
	// Holds are the causes holding deliveries now, in the order of
	// /readyz; none while deliveries go.
	Holds []Hold `json:"holds,omitempty"`
	// AppAvailable: the app is not known to be unavailable (a connection
	// to it was refused, its health URL failed); see the app_unavailable
	// hold for why and since when.
	AppAvailable bool `json:"app_available"`
	// Breaker is the breaker's state.
	Breaker BreakerState `json:"breaker"`
	// Held is how many messages courier holds in progress while
	// deliveries are held (courier_held_messages).
	Held int `json:"held"`
	// InFlight is how many requests are at the app, and Limit how many
	// may be at once (courier_inflight_limit): found from the app's
	// answers, at most LimitMax, when LimitAuto; else fixed.
	InFlight  int  `json:"in_flight"`
	Limit     int  `json:"limit"`
	LimitAuto bool `json:"limit_auto"`
	LimitMax  int  `json:"limit_max"`
}

// Hold is one cause holding deliveries.
type Hold struct {
	// Cause is its name in the metrics (courier_delivery_held{cause}):
	// app_unavailable, store_unavailable, breaker_open, paused.
	Cause string `json:"cause"`
	// Reason is what /readyz says of it.
	Reason string `json:"reason"`
	// Since is when it began.
	Since time.Time `json:"since"`
	// Until is when it is next looked at again, when known: the breaker's
	// next probe, the end of a pause.
	Until *time.Time `json:"until,omitempty"`
}

// BreakerState is the breaker's part of State.
type BreakerState struct {
	// Open: courier stopped sending and probes with one message at a time.
	Open bool `json:"open"`
	// NextProbe is when the next probe goes; nil while closed, or while
	// a probe is under way or waits for a message to carry it.
	NextProbe *time.Time `json:"next_probe,omitempty"`
	// ProbeWait is the wait between probes now, as a Go duration ("5s"),
	// and ProbeMax its cap: the wait doubles up to it while probes fail
	// (the app's Retry-After wins). "" while closed.
	ProbeWait string `json:"probe_wait,omitempty"`
	ProbeMax  string `json:"probe_max,omitempty"`
}

// State returns the runner's state now. Safe for concurrent use, before,
// during and after Run.
func (r *Runner) State() State {
	st := State{Stream: r.o.Stream, Consumer: r.o.Consumer, AppAvailable: true, Held: int(r.heldMessages())}
	if err := r.Ready(); err != nil {
		st.Ready = err.Error()
	}
	st.Bound = r.src.ready() == nil
	open, next, wait, most := r.breaker.probeState()
	st.Breaker.Open = open
	if open {
		st.Breaker.ProbeWait, st.Breaker.ProbeMax = wait.String(), most.String()
		if !next.IsZero() {
			st.Breaker.NextProbe = &next
		}
	}
	for _, h := range r.gate.holds() {
		hold := Hold{Cause: h.cause.Label(), Reason: r.gate.withDetail(h.cause, h.reason), Since: h.since}
		switch h.cause {
		case causeApp:
			st.AppAvailable = false
		case causeBreaker:
			hold.Until = st.Breaker.NextProbe
		case causePaused:
			if r.src.fetch != nil {
				if until := r.src.fetch.pausedUntil(); !until.IsZero() {
					hold.Until = &until
				}
			}
		}
		st.Holds = append(st.Holds, hold)
	}
	if l := r.limiter(); l != nil {
		s := l.Stats()
		st.InFlight, st.Limit, st.LimitAuto, st.LimitMax = s.InFlight, s.Limit, s.Auto, s.Max
	}
	return st
}

// limiter is the one bound on requests at the app, which the way of
// sending holds (send.go).
func (r *Runner) limiter() *limit.Limiter {
	switch w := r.decide.way.(type) {
	case alone:
		return w.s.inflight
	case *batcher:
		return w.s.inflight
	}
	return nil
}

// heldNow is one cause held, as holds returns it.
type heldNow struct {
	cause  cause
	reason string
	since  time.Time
}

// holds returns the causes held now, in their order.
func (g *gate) holds() []heldNow {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []heldNow
	for c, h := range g.held {
		if h.on {
			out = append(out, heldNow{cause: cause(c), reason: h.reason, since: h.since})
		}
	}
	return out
}
