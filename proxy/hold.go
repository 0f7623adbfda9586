package proxy

import (
	"context"
	"sync/atomic"
)

// Holding: while something holds deliveries (the gate is closed: the app
// or the dedup store unavailable, the breaker open, the consumer paused), a
// worker holds the message it took, in progress (tracker.go), spending
// nothing, until the gate opens or the breaker picks the message as its
// probe (breaker.go).

// holder counts the messages held and waits with them. Safe for concurrent
// use.
type holder struct {
	gate    *gate
	breaker *breaker
	parked  atomic.Int64 // messages held by workers (courier_held_messages)
	// fresh: those of them waiting for the gate on their first delivery,
	// the probes that tell a healthy app (breaker.go, noProbe).
	fresh atomic.Int64
}

// open reports whether the gate lets deliveries go.
func (h *holder) open() bool { return h.gate.open.Load() }

// count runs wait counted among the held messages.
func (h *holder) count(wait func()) {
	h.parked.Add(1)
	defer h.parked.Add(-1)
	wait()
}

// hold holds a message until the gate opens or stop ends, counted among
// the held messages. While the breaker alone holds deliveries, the message
// goes as a probe when the breaker picks it (fresh: on its first delivery,
// which it picks first); hold then reports true. Any message may be a
// probe: a failed probe on a message's last allowed delivery is held again
// rather than dead-lettered (decide.go, decide), so a probe never spends
// that delivery, and a breaker whose workers all hold such messages still
// probes.
func (h *holder) hold(stop context.Context, fresh bool) (probe bool) {
	h.parked.Add(1)
	defer h.parked.Add(-1)
	if fresh {
		h.fresh.Add(1)
		defer h.fresh.Add(-1)
	}
	for {
		t := h.breaker.enlist(fresh)
		select {
		case <-h.gate.Up():
			h.breaker.leave(t)
			return false
		case <-stop.Done():
			h.breaker.leave(t)
			return false
		case <-t.ahead:
			if h.gate.onlyHeld(causeBreaker) {
				return true
			}
			h.breaker.retryProbe()
		}
	}
}

// noProbe reports that the breaker alone holds deliveries and no fresh
// message is held: the fetcher then pulls one, as retries make poor probes
// (breaker.go, proxy.go's detach).
func (h *holder) noProbe() bool { return h.gate.onlyHeld(causeBreaker) && h.fresh.Load() == 0 }
