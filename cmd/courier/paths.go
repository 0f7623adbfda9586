package main

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/ordermark"
	"github.com/courierhq/courier/partition"
	"github.com/courierhq/courier/proxy"
	"github.com/courierhq/courier/rewind"
	"github.com/courierhq/courier/schedule"
)

// A path is one subscription's delivery path (COURIER_SUBSCRIPTIONS;
// docs/configuration.md): its durable consumer, dead letters, order marks,
// partitions, delivery loop and max-deliveries catch. Without
// COURIER_SUBSCRIPTIONS there is one, named "", set by the plain
// variables. What the process has once (the NATS connection, the dedup
// store, the admin server, the publish API, request/reply, signing,
// tracing, the logs) is the sidecar's, which a path embeds.
type path struct {
	*sidecar
	name string        // "" without COURIER_SUBSCRIPTIONS
	cfg  config.Config // the subscription's settings
	// deliverPolicyGiven: the subscription's COURIER_DELIVER_POLICY (or
	// the plain one it falls back to) was set.
	deliverPolicyGiven bool
	log                *slog.Logger
	// reg is the sidecar's registry, whose metrics carry a subscription
	// label when the path is named.
	reg prometheus.Registerer

	stream jetstream.Stream
	cons   jetstream.Consumer
	dd     proxy.Deduper    // nil: dedup off
	marks  *ordermark.Store // nil: no order per key
	parts  *partitions      // nil unless COURIER_ORDER_PARTITIONS splits the durable
	// rewinds are the durable's rewinds (courier rewind); nil: none known.
	rewinds *rewind.View
	// members is the durable's membership (partitions', or the pin
	// holders' with order per key); nil: none.
	members *partition.Members
	// runner, once made, tells the membership the pins it holds.
	runner atomic.Pointer[proxy.Runner]
	// deadLetters counts the path's dead letters by reason, whoever stores
	// them.
	deadLetters *prometheus.CounterVec
	// late counts how late the delayed messages reach the app.
	late *schedule.Lateness

	// What undoes the path's steps; nil until the step ran.
	stopGiveup, stopMembers, stopRewinds func()
}

// newPaths makes the paths of cfg's subscriptions that consume a stream
// (none for a courier that only answers requests).
func newPaths(s *sidecar, cfg config.Config) []*path {
	var out []*path
	for _, sub := range cfg.Subscriptions() {
		if !sub.Config.ConsumesStream() {
			continue
		}
		p := &path{sidecar: s, name: sub.Name, cfg: sub.Config, log: s.log, reg: s.reg,
			deliverPolicyGiven: given(sub.Source["COURIER_DELIVER_POLICY"]),
			deadLetters:        proxy.NewDeadLetterCounter()}
		if sub.Name != "" {
			p.log = s.log.With("subscription", sub.Name)
			p.reg = prometheus.WrapRegistererWith(prometheus.Labels{"subscription": sub.Name}, s.reg)
		}
		p.reg.MustRegister(p.deadLetters) // courier_dead_letters_total
		late, err := schedule.NewLateness(p.reg, nil)
		if err != nil {
			panic(err) // a name registered twice: a bug, as MustRegister says
		}
		p.late = late
		out = append(out, p)
	}
	return out
}

// given reports whether a variable's source (config.Subscription.Source)
// is a variable that was set.
func given(source string) bool { return source != "" && source != config.SourceDefault }

// pathsLoop is the paths' delivery loops as health sees them: ready when
// every one is, naming each that is not.
type pathsLoop []*path

func (ps pathsLoop) Ready() error { return ps.each((*proxy.Runner).Ready) }
func (ps pathsLoop) Alive() error { return ps.each((*proxy.Runner).Alive) }

func (ps pathsLoop) each(check func(*proxy.Runner) error) error {
	var errs []error
	for _, p := range ps {
		r := p.runner.Load()
		if r == nil {
			continue
		}
		if err := check(r); err != nil {
			if p.name != "" {
				err = fmt.Errorf("subscription %s: %w", p.name, err)
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// released is how many messages the paths gave back at shutdown.
func (s *sidecar) released() int64 {
	var n int64
	for _, p := range s.paths {
		if r := p.runner.Load(); r != nil {
			n += r.Released()
		}
	}
	return n
}

// stopGiveups stops every path's rewinds watch and max-deliveries catch; stopMemberships
// leaves every path's membership.
func (s *sidecar) stopGiveups() {
	for _, p := range s.paths {
		if p.stopRewinds != nil {
			p.stopRewinds()
		}
		if p.stopGiveup != nil {
			p.stopGiveup()
		}
	}
}

func (s *sidecar) stopMemberships() {
	for _, p := range s.paths {
		if p.stopMembers != nil {
			p.stopMembers()
		}
	}
}
