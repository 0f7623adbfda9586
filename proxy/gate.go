package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courierhq/courier/internal/appurl"
	"github.com/courierhq/courier/internal/retry"
)

// gate is the one state machine that decides whether courier may send: it is
// open while no cause is held. Safe for concurrent use.
type gate struct {
	mu    sync.Mutex
	held  [nCauses]holdState
	nHeld int
	upCh  chan struct{} // closed while no cause is held
	// open is nHeld == 0, read on every message without the lock.
	open atomic.Bool
	now  func() time.Time
	// changed is called, outside the lock, once per transition of a cause.
	changed func(c cause, held bool, reason string, heldFor time.Duration)
	// prober holds and frees causeApp by the app's health (runProber);
	// set once, before runProber.
	prober *prober
	// detail, for a cause that has one, says what changes while it is
	// held (the breaker's next probe), added to its reason in /readyz and
	// the log line that it is held; "" adds nothing. Set once, before
	// the gate is used; called without the gate's lock.
	detail [nCauses]func() string
}

// runProber runs the gate's prober until ctx ends.
func (g *gate) runProber(ctx context.Context) { g.prober.run(ctx) }

type holdState struct {
	total  time.Duration // held before, in all
	on     bool
	reason string
	since  time.Time
	ch     chan struct{} // closed while this cause is held
}

// gateLog logs and counts each change of a cause that holds deliveries:
// one line when it starts, one when it ends.
type gateLog struct {
	m     *metrics
	log   *slog.Logger
	wasUp atomic.Bool // the app has been available at least once
}

// changed is the gate's changed.
func (l *gateLog) changed(c cause, held bool, reason string, heldFor time.Duration) {
	l.m.held.WithLabelValues(c.Label()).Set(b2f(held))
	if c == causeApp {
		l.m.appUp.Set(b2f(!held))
	}
	took := heldFor.Round(time.Millisecond).String()
	switch {
	case c == causeApp && held && !l.wasUp.Load():
		// Gated start-up: waiting, not an outage.
	case c == causeApp && held:
		l.log.Warn("app unavailable: holding messages and pausing fetching until it answers", "reason", reason)
	case c == causeApp && !l.wasUp.Swap(true):
		l.log.Info("app healthy: fetching", "waited", took)
	case c == causeApp:
		l.log.Info("app available again", "down_for", took)
	case held:
		l.log.Warn(c.stopLine(), "reason", reason)
	default:
		l.log.Info(c.resumeLine(), "held_for", took)
	}
}

func newGate(now func() time.Time, changed func(cause, bool, string, time.Duration)) *gate {
	g := &gate{upCh: make(chan struct{}), now: now, changed: changed}
	close(g.upCh)
	g.open.Store(true)
	for c := range g.held {
		g.held[c].ch = make(chan struct{})
	}
	return g
}

// Up returns a channel closed while no cause is held.
func (g *gate) Up() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.upCh
}

// Held returns a channel closed while c is held.
func (g *gate) Held(c cause) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held[c].ch
}

// firstHeld returns the first held cause and its reason, with its detail.
func (g *gate) firstHeld() (cause, string, bool) {
	g.mu.Lock()
	c, reason, held := cause(0), "", false
	for i, h := range g.held {
		if h.on {
			c, reason, held = cause(i), h.reason, true
			break
		}
	}
	g.mu.Unlock()
	if !held {
		return 0, "", false
	}
	return c, g.withDetail(c, reason), true
}

// withDetail is reason followed by c's detail, if it has one.
func (g *gate) withDetail(c cause, reason string) string {
	if g.detail[c] == nil {
		return reason
	}
	if d := g.detail[c](); d != "" {
		return reason + "; " + d
	}
	return reason
}

// onlyHeld reports whether c is held and no other cause is.
func (g *gate) onlyHeld(c cause) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held[c].on && g.nHeld == 1
}

// isHeld reports whether c is held.
func (g *gate) isHeld(c cause) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held[c].on
}

// hold holds c for reason (a no-op if it already is).
func (g *gate) hold(c cause, reason string) {
	g.mu.Lock()
	h := &g.held[c]
	if h.on {
		g.mu.Unlock()
		return
	}
	h.on, h.reason, h.since = true, reason, g.now()
	close(h.ch)
	if g.nHeld++; g.nHeld == 1 {
		g.upCh = make(chan struct{})
		g.open.Store(false)
	}
	g.mu.Unlock()
	g.changed(c, true, g.withDetail(c, reason), 0)
}

// free ends c's hold (a no-op if it is not held).
func (g *gate) free(c cause) {
	g.mu.Lock()
	h := &g.held[c]
	if !h.on {
		g.mu.Unlock()
		return
	}
	heldFor := g.now().Sub(h.since)
	h.total += heldFor
	h.on, h.reason = false, ""
	h.ch = make(chan struct{})
	if g.nHeld--; g.nHeld == 0 {
		close(g.upCh)
		g.open.Store(true)
	}
	g.mu.Unlock()
	g.changed(c, false, "", heldFor)
}

// heldSeconds is how long c has been held in all, the current hold
// included.
func (g *gate) heldSeconds(c cause) float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	h := g.held[c]
	d := h.total
	if h.on {
		d += g.now().Sub(h.since)
	}
	return d.Seconds()
}

// waitUp blocks until no cause is held or ctx ends.
func (g *gate) waitUp(ctx context.Context) error {
	select {
	case <-g.Up():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// prober decides when an unavailable app is back, and with a health URL also
// notices when an available one goes away.
type prober struct {
	gate       *gate
	client     *http.Client
	healthURL  string // as requested: a socket's stands for it (appurl)
	healthHost string // the health request's Host header
	// appNet and appAddr are where the app accepts connections: tcp and
	// its host:port, or unix and its socket.
	appNet, appAddr string
	interval        time.Duration
	minWait         time.Duration
	maxWait         time.Duration
	stamp           func(http.Header, []byte) // Options.Stamp
}

func newProber(g *gate, client *http.Client, appURL, healthURL string, interval time.Duration) *prober {
	p := &prober{
		gate: g, client: client, healthURL: healthURL,
		interval: interval, minWait: 100 * time.Millisecond, maxWait: 5 * time.Second,
	}
	if t, err := appurl.Parse(appURL); err == nil {
		p.appNet, p.appAddr = t.Addr()
	}
	if t, err := appurl.Parse(healthURL); err == nil {
		p.healthURL, p.healthHost = t.URL.String(), t.Host
	}
	return p
}

// run probes until ctx ends: while the app is unavailable, with backoff (the
// one retry loop) until it answers; while it is available, by watching.
func (p *prober) run(ctx context.Context) {
	for ctx.Err() == nil {
		if !p.gate.isHeld(causeApp) {
			p.watch(ctx)
			continue
		}
		err := retry.Do(ctx, retry.Policy{Initial: p.minWait, Max: p.maxWait}, func(ctx context.Context) error {
			if ok, reason := p.probe(ctx); !ok {
				return errors.New(reason)
			}
			return nil
		}, nil)
		if err == nil {
			p.gate.free(causeApp)
		}
	}
}

// watch returns once the app is found unavailable (or ctx ends). Without a
// health URL the requests themselves are the probe: a request that finds the
// app unreachable holds the gate. With one, it is polled every interval too.
func (p *prober) watch(ctx context.Context) {
	var tick <-chan time.Time
	if p.healthURL != "" {
		t := time.NewTicker(p.interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.gate.Held(causeApp):
			return
		case <-tick:
			if ok, reason := p.probe(ctx); !ok && ctx.Err() == nil {
				p.gate.hold(causeApp, reason)
				return
			}
		}
	}
}

// probe asks the health URL for a 2xx, or else checks that the app accepts a
// connection.
func (p *prober) probe(ctx context.Context) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// The app's own address must accept connections even when a health
	// URL answers: a health endpoint served elsewhere (another port, another
	// process) cannot vouch for the app.
	var d net.Dialer
	c, err := d.DialContext(ctx, p.appNet, p.appAddr)
	if err != nil {
		return false, "app not accepting connections: " + err.Error()
	}
	_ = c.Close()
	if p.healthURL == "" {
		return true, ""
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.healthURL, nil)
	if err != nil {
		return false, err.Error()
	}
	req.Host = p.healthHost
	if p.stamp != nil {
		p.stamp(req.Header, nil)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return false, "app health check failed: " + err.Error()
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return false, "app health check answered " + resp.Status
	}
	return true, ""
}
