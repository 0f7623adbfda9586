package main

import (
	"github.com/courierhq/courier/proxy"
)

// What the admin server's /v1/state answers: the running courier's own
// view of each subscription's delivery path (proxy.State), which `courier
// status` shows beside the server's view of the consumer (status.go).

// ownState is the JSON of /v1/state.
type ownState struct {
	// Version is the courier's (courier version).
	Version string `json:"version"`
	// Ready is "" while /readyz answers 200, else what it says.
	Ready string `json:"ready,omitempty"`
	// Subscriptions are the delivery paths, one without
	// COURIER_SUBSCRIPTIONS.
	Subscriptions []pathState `json:"subscriptions"`
}

// pathState is one subscription's delivery path.
type pathState struct {
	// Name is the subscription's ("" without COURIER_SUBSCRIPTIONS).
	Name string `json:"name,omitempty"`
	// Starting, until the path's delivery loop is made, is the start-up
	// step courier is at; the rest of the state is then empty.
	Starting string `json:"starting,omitempty"`
	proxy.State
}

// state is /v1/state: safe for concurrent use, at any step of start-up or
// shutdown.
func (s *sidecar) state() any {
	st := ownState{Version: readBuild().version, Subscriptions: []pathState{}}
	if err := s.health.Ready(); err != nil {
		st.Ready = err.Error()
	}
	step, _, _ := s.health.state()
	for _, p := range s.paths {
		ps := pathState{Name: p.name}
		if r := p.runner.Load(); r != nil {
			ps.State = r.State()
		} else {
			ps.Stream, ps.Consumer, ps.Starting = p.cfg.Stream, p.cfg.Consumer, step
			if ps.Starting == "" {
				ps.Starting = "starting"
			}
		}
		st.Subscriptions = append(st.Subscriptions, ps)
	}
	return st
}
