// What the runner holds of a message, for the max-deliveries catch
// (package giveup), which must not dead-letter a message the delivery loop
// has not finished with on the word of an advisory anyone may publish
// (docs/threat-model.md#advisories).

package proxy

import (
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// Delivering reports whether the runner is still delivering the message at
// seq of its consumer's stream (with partitions, the work stream's): it has
// it in progress (fetched and not yet settled: queued, with a worker, held
// while the gate is closed, waiting behind its key, its dead letter being
// stored), it gave it back to be retried after a delay that, with an ack
// wait, has not run out, or, with order per key, its key's line awaits it
// (a head retried and due back, or one another courier held). JetStream gives up on a
// message when it would deliver it again after its last delivery: not while
// courier keeps it in progress, nor at a retry courier asked for (it never
// retries a last delivery). So an advisory naming such a message is not, or
// not yet, the server's: the max-deliveries catch handles it again later
// (giveup.Options.Delivering). Safe for concurrent use, also after Run has
// returned (nothing is in progress then).
func (r *Runner) Delivering(seq uint64) bool {
	// The tracker is copied under its lock, which every settling takes,
	// and read outside it: metadata is parsed anew at every call.
	r.track.mu.Lock()
	held := make([]jetstream.Msg, 0, len(r.track.msgs))
	for m := range r.track.msgs {
		held = append(held, m)
	}
	r.track.mu.Unlock()
	if r.track.isRetrying(seq) {
		return true
	}
	for _, m := range held {
		if meta, err := m.Metadata(); err == nil && streamSeq(m, meta) == seq {
			return true
		}
	}

	// A line names its head from when it is fetched until it is settled
	// for good, across retries: the settler tells the line before it
	// stops tracking the message.
	lines := []*orderer{r.src.order}
	if ps := r.src.parts; ps != nil {
		ps.mu.Lock()
		for _, s := range ps.sessions {
			lines = append(lines, s.order)
		}
		ps.mu.Unlock()
	}
	for _, o := range lines {
		if o == nil {
			continue
		}
		o.mu.Lock()
		for _, l := range o.lines {
			if l.head == seq || slices.Contains(l.retried, seq) || slices.Contains(l.out, seq) {
				o.mu.Unlock()
				return true
			}
		}
		o.mu.Unlock()
	}
	return false
}
