package proxy

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// gate tracks whether the app is available. While it is down the runner
// fetches nothing and holds what it has. Safe for concurrent use.
type gate struct {
	mu     sync.Mutex
	up     bool
	upCh   chan struct{} // closed while up
	downCh chan struct{} // closed while down
	since  time.Time     // when it last went down
	reason string
	now    func() time.Time
	// changed is called, outside the lock, once per transition.
	changed func(up bool, reason string, downFor time.Duration)
}

func newGate(up bool, reason string, now func() time.Time, changed func(bool, string, time.Duration)) *gate {
	g := &gate{upCh: make(chan struct{}), downCh: make(chan struct{}), now: now, changed: changed}
	g.up = up
	if up {
		close(g.upCh)
	} else {
		close(g.downCh)
		g.since, g.reason = now(), reason
	}
	return g
}

// Up returns a channel closed while the app is available.
func (g *gate) Up() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.upCh
}

// Down returns a channel closed while the app is unavailable.
func (g *gate) Down() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.downCh
}

// State reports availability and, when down, why.
func (g *gate) State() (bool, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.up, g.reason
}

func (g *gate) setDown(reason string) {
	g.mu.Lock()
	if !g.up {
		g.mu.Unlock()
		return
	}
	g.up, g.reason, g.since = false, reason, g.now()
	g.upCh = make(chan struct{})
	close(g.downCh)
	g.mu.Unlock()
	g.changed(false, reason, 0)
}

func (g *gate) setUp() {
	g.mu.Lock()
	if g.up {
		g.mu.Unlock()
		return
	}
	downFor := g.now().Sub(g.since)
	g.up, g.reason = true, ""
	g.downCh = make(chan struct{})
	close(g.upCh)
	g.mu.Unlock()
	g.changed(true, "", downFor)
}

// waitUp blocks until the app is available or ctx ends.
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
	gate      *gate
	client    *http.Client
	healthURL string
	appAddr   string // host:port of the app, dialled when there is no health URL
	interval  time.Duration
	minWait   time.Duration
	maxWait   time.Duration
}

func newProber(g *gate, client *http.Client, appURL, healthURL string, interval time.Duration) *prober {
	return &prober{
		gate: g, client: client, healthURL: healthURL, appAddr: hostPort(appURL),
		interval: interval, minWait: 100 * time.Millisecond, maxWait: 5 * time.Second,
	}
}

func hostPort(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return net.JoinHostPort(u.Hostname(), "80")
}

// run probes until ctx ends.
func (p *prober) run(ctx context.Context) {
	wait := p.minWait
	for {
		up, _ := p.gate.State()
		if up && p.healthURL == "" {
			// Without a health URL the requests themselves are the probe.
			select {
			case <-ctx.Done():
				return
			case <-p.gate.Down():
				continue
			}
		}
		ok, reason := p.probe(ctx)
		switch {
		case ok:
			p.gate.setUp()
			wait = p.minWait
		case up:
			p.gate.setDown(reason)
		}
		next := p.interval
		if !ok {
			next = wait
			wait = min(wait*2, p.maxWait)
		}
		// While up, a request that finds the app unreachable closes the
		// gate: probe at once rather than at the next interval.
		var wake <-chan struct{}
		if ok {
			wake = p.gate.Down()
		}
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-wake:
			t.Stop()
		case <-t.C:
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
	c, err := d.DialContext(ctx, "tcp", p.appAddr)
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
