// Package connlimit bounds the connections an HTTP server holds, for
// courier's servers that any peer able to reach their port may connect to
// (the admin port, the publish API). A connection costs memory and a
// descriptor whether or not it sends anything, and a server's timeouts end
// one only after the time they allow: many peers opening connections at
// once would hold them all meanwhile. A Limiter keeps at most a set number
// open. Past it, it closes the connection that has waited longest without
// a request in progress (an idle keep-alive connection, which its client
// opens again when it needs one, or one that has not yet sent a whole
// request) to make room for the new one; only when every other
// connection is in the middle of a request is the new one closed. So a
// flood of connections that send nothing keeps turning over, and a client
// that sends its request at once (a probe, a scrape) is served.
package connlimit

import (
	"container/list"
	"net"
	"net/http"
	"sync"
)

// Limiter counts a server's connections through its ConnState hook. Set
// http.Server.ConnState to Limiter.ConnState before serving. It is safe
// for concurrent use; it holds no resources of its own.
type Limiter struct {
	max int

	mu      sync.Mutex
	conns   map[net.Conn]*entry
	waiting *list.List // of net.Conn without a request in progress, longest first
	open    int        // connections held, those this Limiter closed left out
}

type entry struct {
	waiting *list.Element // in Limiter.waiting while no request is in progress
	closing bool          // closed by this Limiter, not yet reported closed
}

// New returns a Limiter that holds at most limit connections (at least 1).
func New(limit int) *Limiter {
	return &Limiter{max: max(limit, 1), conns: map[net.Conn]*entry{}, waiting: list.New()}
}

// ConnState is the http.Server.ConnState hook that keeps the bound.
func (l *Limiter) ConnState(c net.Conn, state http.ConnState) {
	var victim net.Conn
	l.mu.Lock()
	e := l.conns[c]
	switch state {
	case http.StateNew:
		e = &entry{}
		l.conns[c] = e
		l.open++
		e.waiting = l.waiting.PushBack(c)
		if l.open > l.max {
			// The front is c itself only when every other connection
			// is in a request.
			victim = l.waiting.Front().Value.(net.Conn)
			l.closeLocked(l.conns[victim])
		}
	case http.StateActive:
		if e != nil && e.waiting != nil {
			l.waiting.Remove(e.waiting)
			e.waiting = nil
		}
	case http.StateIdle:
		if e != nil && !e.closing && e.waiting == nil {
			e.waiting = l.waiting.PushBack(c)
		}
	case http.StateHijacked, http.StateClosed:
		if e != nil {
			if e.waiting != nil {
				l.waiting.Remove(e.waiting)
			}
			if !e.closing {
				l.open--
			}
			delete(l.conns, c)
		}
	}
	l.mu.Unlock()
	if victim != nil {
		// The server notices on its next read, and reports it closed.
		_ = victim.Close()
	}
}

// closeLocked takes e's connection out of the count, to be closed by the
// caller.
func (l *Limiter) closeLocked(e *entry) {
	if e.waiting != nil {
		l.waiting.Remove(e.waiting)
		e.waiting = nil
	}
	e.closing = true
	l.open--
}

// Open returns the number of connections held: accepted, not yet closed,
// and not being closed by the Limiter.
func (l *Limiter) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}
