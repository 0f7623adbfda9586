package main

// What a rollout or a crash costs an ordered durable (docs/order.md,
// "Rollouts and crashes"): a courier stopped with SIGTERM hands its pin on
// at once; one killed with SIGKILL is noticed within seconds by the
// others, which take its keys; one paused past its membership's TTL finds
// it lost its keys and gives back what it held, never sending it beside
// the courier that took them. Each courier is a process of its own
// (startChild); the app checks every request as it comes (keyedApp).

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/partition"
)

// from accepts the requests of replica i.
func from(i int) func(appCall) bool {
	path := fmt.Sprint("/c", i)
	return func(c appCall) bool { return c.path == path }
}

// One courier active on a pinned durable, another standing by, messages
// published throughout: SIGTERM to the active one hands the pin on, and
// the other calls the app within a moment of the signal, not after the
// pin's TTL (7.5s with this ack wait). Every key in order, nothing lost,
// nothing sent twice.
func TestOrderStopHandsThePinOn(t *testing.T) {
	h := newHarness(t)
	a := newKeyedApp(t, 2*time.Millisecond)
	const keys = 20
	s := newReplicaSet(t, a.url, 2, func(url string, i int) []string {
		return orderEnv(h, url, i, "COURIER_ACK_WAIT=30s")
	})
	s.start(0)
	stop := publisher(t, h.js, keys, 300, 100*time.Millisecond)
	poll.Until(t, 30*time.Second, "replica 0 delivering", func() bool { return a.delivered() >= keys })
	s.start(1)
	at := a.delivered()
	poll.Until(t, 30*time.Second, "messages flowing with two replicas", func() bool { return a.delivered() >= at+2*keys })
	active := s.active(a)
	other := 1 - active
	signalled := time.Now()
	s.term(active)
	exited := time.Since(signalled)
	poll.Until(t, 20*time.Second, "the other replica calling the app", func() bool {
		_, ok := a.firstCall(signalled, from(other))
		return ok
	})
	c, _ := a.firstCall(signalled, from(other))
	took := c.at.Sub(signalled)
	t.Logf("SIGTERM to replica %d: it exited %s after it, replica %d called the app %s after it",
		active, exited.Round(time.Millisecond), other, took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("replica %d called the app %s after replica %d's SIGTERM, want within 2s (the pin's TTL is 7.5s)", other, took, active)
	}
	rounds := stop()
	a.settledInOrder(t, h, keys, rounds, true)
	if recs := logLines(s.cs[active].asCourier(), "pin given up for the next courier"); len(recs) != 1 || recs[0]["handed_on"] != true {
		t.Errorf("the stopped replica logged %v, want the pin given up with a clean record", recs)
	}
}

// Two couriers, in both modes of order; the one that called last is killed
// (SIGKILL) while messages are published: the other notices within
// seconds, not after the pin's TTL or the membership's (6s each before),
// and gives its pins up to take them (`the courier holding the pin is
// gone`). Keys of which the killed one had nothing out are called again
// at once; the others at once too, not after their messages' ack wait (the
// consumers deliver again what was out, from their ack floors). Every
// key in order, nothing lost, duplicates within what the killed one had
// at the app or answered and not yet recorded.
func TestOrderKillNoticedWithinSeconds(t *testing.T) {
	for _, mode := range []struct {
		name  string
		parts int
	}{
		{"single active", 0},
		{"partitions", 4},
	} {
		t.Run(mode.name, func(t *testing.T) {
			h := newHarness(t)
			// Requests take a while: the killed courier has some out.
			a := newKeyedApp(t, 30*time.Millisecond)
			const keys, inflight = 10, 4
			env := []string{"COURIER_ACK_WAIT=24s", fmt.Sprint("COURIER_MAX_INFLIGHT=", inflight)}
			if mode.parts > 0 {
				env = append(env, fmt.Sprint("COURIER_ORDER_PARTITIONS=", mode.parts))
			}
			s := newReplicaSet(t, a.url, 2, func(url string, i int) []string { return orderEnv(h, url, i, env...) })
			s.start(0)
			s.start(1)
			stop := publisher(t, h.js, keys, 400, 100*time.Millisecond)
			poll.Until(t, 30*time.Second, "messages flowing", func() bool { return a.delivered() >= 3*keys })
			// At rest: each courier's heartbeats name the pins it holds,
			// held long enough (10s) for what the killed one has out to be
			// delivered again at once.
			time.Sleep(10 * time.Second)
			victim := s.active(a)
			survivor := 1 - victim
			killed := time.Now()
			s.cs[victim].kill(t)
			var noticed time.Time
			poll.Until(t, 20*time.Second, "the survivor giving up the killed courier's pins", func() bool {
				for _, l := range logLines(s.cs[survivor].asCourier(), "the courier holding the pin is gone") {
					at, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(l["time"]))
					if at.After(killed) {
						noticed = at
						return true
					}
				}
				return false
			})
			d := noticed.Sub(killed)
			poll.Until(t, 40*time.Second, "the survivor calling the app", func() bool {
				_, ok := a.firstCall(noticed, from(survivor))
				return ok
			})
			c, _ := a.firstCall(noticed, from(survivor))
			t.Logf("replica %d killed; replica %d gave its pins up %s after, and called the app %s after that",
				victim, survivor, d.Round(time.Millisecond), c.at.Sub(noticed).Round(time.Millisecond))
			if d > 4*time.Second {
				t.Errorf("the survivor gave up the killed courier's pins %s after the kill, want within 4s (the pin's and the membership's TTLs were 6s)", d)
			}
			{
				// What the killed courier had out is delivered again at
				// once (the consumers it was pinned to reset to their ack
				// floors), not after its 24s ack wait: every key is called
				// again well before that.
				var slowest time.Duration
				for k := range keys {
					key := fmt.Sprint("k", k)
					again := func(c appCall) bool { return c.key == key && from(survivor)(c) }
					poll.Until(t, 40*time.Second, key+" called again after the kill", func() bool {
						_, ok := a.firstCall(killed, again)
						return ok
					})
					c, _ := a.firstCall(killed, again)
					slowest = max(slowest, c.at.Sub(killed))
				}
				t.Logf("every key called again within %s of the kill", slowest.Round(time.Millisecond))
				if slowest > 16*time.Second {
					t.Errorf("a key was called again %s after the kill, want well within the 24s ack wait (what the killed courier had out delivered again at once)", slowest.Round(time.Millisecond))
				}
				if len(logLines(s.cs[survivor].asCourier(), "what the courier that is gone had out is delivered again now")) == 0 {
					t.Error("the survivor did not log delivering again what the killed courier had out")
				}
			}
			rounds := stop()
			a.waitAllDelivered(t, 60*time.Second, keys, rounds, func() bool { return allSettled(h, mode.parts) },
				func() *jetstream.ConsumerInfo { return h.consumerInfo("courier") })
			a.check(t, keys, rounds)
			if dls := h.deadLetters("dlq.ORDERS.courier"); len(dls) > 0 {
				t.Errorf("%d dead letters, want none", len(dls))
			}
			// A slot is free once the app answers; the key is recorded
			// and the message acked after.
			if a.dups > 2*inflight {
				t.Errorf("%d duplicate requests, want at most %d (what the killed courier had at the app, or answered)", a.dups, 2*inflight)
			}
		})
	}
}

// With partitions, a courier killed moments after it took its pins (as in
// a crash loop, where each courier dies of a message it took) does not
// have what it held delivered again at once: that would count each such
// message from its first delivery again, crash after crash, never
// reaching the delivery limit. The survivor says so and what was out comes
// back after its ack wait, counted. Every key in order, nothing lost.
func TestOrderKillSoonAfterTakingThePinsWaitsTheAckWait(t *testing.T) {
	h := newHarness(t)
	a := newKeyedApp(t, 30*time.Millisecond)
	const keys = 10
	env := []string{"COURIER_ACK_WAIT=5s", "COURIER_MAX_INFLIGHT=4", "COURIER_ORDER_PARTITIONS=4"}
	s := newReplicaSet(t, a.url, 2, func(url string, i int) []string { return orderEnv(h, url, i, env...) })
	s.start(0)
	s.start(1)
	stop := publisher(t, h.js, keys, 100, 100*time.Millisecond)
	poll.Until(t, 30*time.Second, "messages flowing", func() bool { return a.delivered() >= keys })
	victim := s.active(a)
	survivor := 1 - victim
	s.cs[victim].kill(t)
	poll.Until(t, 20*time.Second, "the survivor giving up the killed courier's pins", func() bool {
		return len(logLines(s.cs[survivor].asCourier(), "the courier holding the pin is gone")) > 0
	})
	rounds := stop()
	a.waitAllDelivered(t, 60*time.Second, keys, rounds, func() bool { return allSettled(h, 4) },
		func() *jetstream.ConsumerInfo { return h.consumerInfo("courier") })
	a.check(t, keys, rounds)
	if len(logLines(s.cs[survivor].asCourier(), "the courier that is gone held the pin only a moment")) == 0 {
		t.Error("the survivor did not say that the killed courier held its pins only a moment")
	}
	if l := logLines(s.cs[survivor].asCourier(), "what the courier that is gone had out is delivered again now"); len(l) > 0 {
		t.Errorf("the survivor delivered again at once what a courier killed moments after taking its pins had out: %v", l)
	}
}

// allSettled reports whether the durable on h, or its parts partitions,
// have nothing left to deliver and nothing waiting for an ack.
func allSettled(h *harness, parts int) bool {
	if parts == 0 {
		return allAcked(h)
	}
	for i := range parts {
		info := h.consumerInfoOn(partition.StreamName("ORDERS", "courier"), partition.ConsumerName("courier", i))
		if info == nil || info.NumPending != 0 || info.NumAckPending != 0 {
			return false
		}
	}
	return true
}

// The active courier paused (SIGSTOP) past its membership's TTL and the
// pin's, with messages held behind their keys, and resumed: the other took
// its keys meanwhile, and the paused one, finding its membership lapsed,
// gives back what it held rather than send it beside the other (what it
// held has come to the other by now, and gone to the app). Every key in
// order, nothing lost.
func TestOrderPausedCourierGivesBack(t *testing.T) {
	h := newHarness(t)
	a := newKeyedApp(t, 20*time.Millisecond) // keys have messages waiting behind them
	const keys = 10
	s := newReplicaSet(t, a.url, 2, func(url string, i int) []string { return orderEnv(h, url, i) })
	s.start(0)
	stop := publisher(t, h.js, keys, 2000, 50*time.Millisecond)
	poll.Until(t, 30*time.Second, "replica 0 delivering", func() bool { return a.delivered() >= keys })
	s.start(1)
	active := s.active(a)
	waitingIn(t, s.cs[active])
	paused := time.Now()
	if err := s.cs[active].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Longer than the pin's TTL (5s) and the wait of a courier that takes
	// over (4s): the other has sent the paused one's keys on by now.
	poll.Until(t, 30*time.Second, "the other replica taking the keys over", func() bool {
		_, ok := a.firstCall(paused, from(1-active))
		return ok
	})
	time.Sleep(10 * time.Second)
	if err := s.cs[active].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	// What it held would be sent within a moment of the resume.
	time.Sleep(3 * time.Second)
	if c, ok := a.firstCall(resumed, from(active)); ok {
		t.Errorf("the paused replica sent %s %s after it resumed, while the other held the pin", c.key, c.at.Sub(resumed).Round(time.Millisecond))
	}
	rounds := stop()
	a.settledInOrder(t, h, keys, rounds, false)
	if len(logLines(s.cs[active].asCourier(), "this courier's membership lapsed")) == 0 {
		t.Error("the paused replica did not log that its membership lapsed")
	}
}
