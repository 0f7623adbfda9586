package apphttp

import "time"

// The idle pool of h1Transport: connections kept alive between requests, at
// most maxIdle of them, each closed once idle for idleTime, and checked
// before reuse (connAlive: h1_unix.go).

// take returns an idle connection to addr that the app has not closed, how
// long it was idle, or nil.
func (t *h1Transport) take(addr string) (*h1Conn, bool, time.Duration) {
	now := time.Now()
	for {
		t.mu.Lock()
		var pc *h1Conn
		for i := len(t.idle) - 1; i >= 0; i-- {
			if t.idle[i].addr == addr {
				pc = t.idle[i]
				t.idle = append(t.idle[:i], t.idle[i+1:]...)
				break
			}
		}
		t.mu.Unlock()
		if pc == nil {
			return nil, false, 0
		}
		idle := now.Sub(pc.idleSince)
		if idle < t.idleTime && pc.br.Buffered() == 0 && connAlive(pc.c) {
			return pc, true, idle
		}
		// Closed by the app while idle (its keep-alive timeout, a
		// restart), or idle too long: never written to.
		pc.c.Close()
	}
}

// done ends a request on pc: its context no longer watched, and pc back in
// the idle pool if its answer was read whole and the connection may be
// reused.
func (pc *h1Conn) done(stop func() bool, reuse bool) {
	if !stop() {
		reuse = false // the context ended: the deadline is in the past
	}
	if !reuse {
		pc.close()
		return
	}
	_ = pc.c.SetDeadline(time.Time{})
	pc.t.put(pc)
}

func (pc *h1Conn) close() { _ = pc.c.Close() }

func (t *h1Transport) put(pc *h1Conn) {
	pc.idleSince = time.Now()
	t.mu.Lock()
	if len(t.idle) >= t.maxIdle {
		t.mu.Unlock()
		pc.close()
		return
	}
	t.idle = append(t.idle, pc)
	if t.sweep == nil {
		t.sweep = time.AfterFunc(t.idleTime, t.closeStale)
	}
	t.mu.Unlock()
}

// closeStale closes the connections idle for IdleTimeout, and comes back
// while any is left.
func (t *h1Transport) closeStale() {
	now := time.Now()
	t.mu.Lock()
	keep := t.idle[:0]
	var stale []*h1Conn
	oldest := now
	for _, pc := range t.idle {
		if now.Sub(pc.idleSince) >= t.idleTime {
			stale = append(stale, pc)
			continue
		}
		keep = append(keep, pc)
		if pc.idleSince.Before(oldest) {
			oldest = pc.idleSince
		}
	}
	clear(t.idle[len(keep):])
	t.idle = keep
	t.sweep = nil
	if len(keep) > 0 {
		t.sweep = time.AfterFunc(t.idleTime-now.Sub(oldest), t.closeStale)
	}
	t.mu.Unlock()
	for _, pc := range stale {
		pc.close()
	}
}

// CloseIdleConnections closes the idle connections, as
// http.Transport.CloseIdleConnections does (http.Client calls it).
func (t *h1Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	if t.sweep != nil {
		t.sweep.Stop()
		t.sweep = nil
	}
	t.mu.Unlock()
	for _, pc := range idle {
		pc.close()
	}
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
