package proxy

import "github.com/nats-io/nats.go/jetstream"

// worker delivers queued messages until the fetcher closes the queue. While
// the gate is closed it holds the message it took (the tracker keeps it in
// progress) and waits; once courier is stopping it gives messages back
// instead of starting them.
func (r *Runner) worker() {
	defer r.workers.Done()
	for q := range r.fetch.queue {
		r.fetch.take(q)
		probe := false
		if r.ph.noStart.Err() == nil && !r.open() {
			r.hold(func() { probe = r.waitToSend(!lastDelivery(q.m, r.o.MaxDeliver)) })
		}
		if r.ph.noStart.Err() == nil {
			r.deliver(q, r.ph.noStart, probe)
			continue
		}
		// Stopping. A message on its last allowed delivery is sent within
		// the grace period rather than given back: a NAK would make
		// JetStream give up on it without the app having seen it.
		if r.open() && lastDelivery(q.m, r.o.MaxDeliver) {
			r.deliver(q, r.ph.requests, false)
			continue
		}
		r.giveBackMsg(q.m, "shutting down")
	}
}

// waitToSend waits until the gate opens or courier stops. While the breaker
// alone holds deliveries, a message that may be a probe (not on its last
// allowed delivery: a probe never spends that) goes when the breaker lets
// one through; waitToSend then reports true.
func (r *Runner) waitToSend(mayProbe bool) (probe bool) {
	var probes <-chan struct{}
	if mayProbe {
		probes = r.breaker.probes
	}
	for {
		select {
		case <-r.gate.Up():
			return false
		case <-r.ph.noStart.Done():
			return false
		case <-probes:
			if r.gate.onlyHeld(causeBreaker) {
				return true
			}
			r.breaker.retryProbe()
		}
	}
}

// lastDelivery reports whether m is on its last allowed delivery.
func lastDelivery(m jetstream.Msg, maxDeliver int) bool {
	meta, err := m.Metadata()
	return err == nil && int(meta.NumDelivered) >= maxDeliver
}

// open reports whether the gate lets deliveries go.
func (r *Runner) open() bool {
	up, _ := r.gate.State()
	return up
}

// hold runs wait counted among the held messages.
func (r *Runner) hold(wait func()) {
	r.parked.Add(1)
	defer r.parked.Add(-1)
	wait()
}

// heldMessages is what courier holds for the app: messages waiting in
// workers, and, while the gate is closed, those queued behind them.
func (r *Runner) heldMessages() float64 {
	n := r.parked.Load()
	if !r.open() {
		n += int64(len(r.fetch.queue))
	}
	return float64(n)
}
