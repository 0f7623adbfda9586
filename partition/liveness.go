package partition

import (
	"slices"
	"time"
)

// Liveness, from the membership's heartbeats: a courier that dies
// (SIGKILL, its node lost) keeps the pins the server gave it until their
// PinnedTTL runs out, which an ack wait sets (the pinned courier must not
// lose its pin while it holds a key's message); its key in the bucket goes
// within the bucket's TTL, seconds. So the others give its pins up
// (jetstream.Stream.UnpinConsumer) as soon as its key is gone: Orphaned
// says which pins those are. A courier whose own key may have gone (a
// pause past the TTL: a long GC, SIGSTOP) must no longer send what it
// holds, for another may have its pins: Term says when that is.

// live is what Members keeps for liveness, under its mu.
type live struct {
	pins    map[string]map[int]string // member → the pins its key names now
	gone    map[string]time.Time      // pin → when the member naming it left or lapsed
	unknown map[string]time.Time      // pin → when first asked of while no member named it
	// sent is when the last heartbeat stored was sent; term counts this
	// courier's terms, begun when its first heartbeat was sent, lapsed
	// that the current one ended.
	sent, begun time.Time
	term        uint64
	lapsed      bool
}

func newLive() live {
	return live{pins: map[string]map[int]string{}, gone: map[string]time.Time{}, unknown: map[string]time.Time{}}
}

// Term returns this courier's term in the membership and whether it is
// live now. It is live while its last heartbeat was stored, and sent less
// than the TTL ago: the bucket, which counts the TTL from when it stored
// the key, removes it no sooner, so no other courier has taken its pins
// for a dead courier's meanwhile. A term ends when the TTL runs out, and
// the next heartbeat stored begins another, also when nothing asked in
// between: a courier paused past its TTL finds, whatever runs first when
// it resumes, either that it is not live or that its term changed.
func (m *Members) Term() (term uint64, live bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.lapsed && m.o.Now().Sub(m.sent) >= m.o.TTL {
		m.lapsed = true
	}
	return m.term, !m.lapsed
}

// renewed notes a heartbeat stored that was sent at sent. Called with mu
// held.
func (m *Members) renewed(sent time.Time) {
	if m.term == 0 || m.lapsed || sent.Sub(m.sent) >= m.o.TTL {
		m.term++
		m.lapsed, m.begun = false, sent
	}
	m.sent = sent
}

// Orphaned reports whether pin, the client the server has pinned to
// partition i (0: the durable, with no partitions), is no live courier's,
// and this courier is the one to give it up (i is among its partitions,
// so that one courier does): the member that named it left or lapsed, or
// no member has named it in the TTL since this courier first asked (a
// courier puts its pins with every heartbeat, so one that holds a pin
// names it within an interval; one that died before it could is found
// so). Only once this courier's own term has lasted the TTL: a courier
// that could not store its heartbeats for a while (the bucket's leader
// moving, its node cut off) was likely not alone, and the others, alive,
// are given the TTL to put theirs again. Safe for concurrent use.
func (m *Members) Orphaned(i int, pin string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.o.Now()
	if pin == "" || !slices.Contains(m.assigned, i) || m.lapsed || m.term == 0 || now.Sub(m.sent) >= m.o.TTL || now.Sub(m.begun) < m.o.TTL {
		return false
	}
	m.forget(now)
	if _, ok := m.gone[pin]; ok {
		return true
	}
	for _, ps := range m.pins {
		for _, p := range ps {
			if p == pin {
				delete(m.unknown, pin)
				return false
			}
		}
	}
	first, asked := m.unknown[pin]
	if !asked {
		m.unknown[pin] = now
		return false
	}
	return now.Sub(first) >= m.o.TTL
}

// named notes the pins member id names now: live, whatever was thought of
// them before. Called with mu held.
func (m *Members) named(id string, pins map[int]string) {
	for _, p := range pins {
		delete(m.gone, p)
		delete(m.unknown, p)
	}
	if len(pins) == 0 {
		delete(m.pins, id)
		return
	}
	m.pins[id] = pins
}

// left notes that member id left or lapsed at now: the pins it named are
// no live courier's. Called with mu held.
func (m *Members) left(id string, now time.Time) {
	for _, p := range m.pins[id] {
		m.gone[p] = now
	}
	delete(m.pins, id)
}

// forget drops what is known of pins gone or unknown for long: a pin id
// is given once, and whoever gives it up does so within seconds. Called
// with mu held.
func (m *Members) forget(now time.Time) {
	keep := 100 * m.o.TTL
	for p, at := range m.gone {
		if now.Sub(at) > keep {
			delete(m.gone, p)
		}
	}
	for p, at := range m.unknown {
		if now.Sub(at) > keep {
			delete(m.unknown, p)
		}
	}
}
