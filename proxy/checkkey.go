package proxy

// The dedup check of a delivery's key (deliver calls check): another
// delivery of the key in this process is waited for, the store asked
// (processed, new and now claimed, or claimed by another replica), and a
// store that cannot answer holds deliveries until it can. check returns the
// ending of a duplicate (acked) or of a delivery that cannot be checked
// before courier stops (given back); the settler carries it out.

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/courierhq/courier/internal/retry"
	"github.com/courierhq/courier/internal/verdict"
)

// checker checks deliveries' keys against the dedup store. Safe for
// concurrent use.
type checker struct {
	dd    Deduper
	quick bool        // dd is a quickChecker: its Check is given no timeout
	down  atomic.Bool // the dedup store failed its last check
	gate  *gate
	m     *metrics
	hold  *holder
	// flights are the deliveries of each key running in this process,
	// owned by the settler, which ends them.
	flights *flights
	breaker breakerTold
}

func newChecker(dd Deduper, g *gate, m *metrics, h *holder, fls *flights, b breakerTold) *checker {
	c := &checker{dd: dd, gate: g, m: m, hold: h, flights: fls, breaker: b}
	if qc, ok := dd.(quickChecker); ok {
		c.quick = qc.QuickCheck()
	}
	return c
}

// errClaimed: another replica's delivery of the key is under way.
var errClaimed = errors.New("key claimed by another replica")

// checkWait is the schedule of asking the store again while it cannot
// answer, or while another replica holds the key's claim.
var checkWait = retry.Policy{Initial: 50 * time.Millisecond, Max: 2 * time.Second}

// checkOnce asks the store once about skey. A store that cannot answer
// holds deliveries (causeStore) until one of its answers comes; a key another
// replica holds is errClaimed.
//
// The question outlives ctx (bounded by its own timeout): a claim the
// store took for a question courier stopped waiting for would hold the
// key, unreleased, for the claim's TTL, and a question cut short by the
// stop is no sign of an outage. The caller gives the delivery back if it
// is stopping once the answer is in (its claim then released).
func (c *checker) once(ctx context.Context, skey string) (verdict.Verdict, error) {
	ctx = context.WithoutCancel(ctx)
	if !c.quick {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	v, err := c.dd.Check(ctx, skey)
	if err != nil {
		c.m.dedupErrors.WithLabelValues("check").Inc()
		if c.down.CompareAndSwap(false, true) {
			c.gate.hold(causeStore, "dedup store check failed: "+err.Error())
		}
		return v, err
	}
	if c.down.Load() && c.down.CompareAndSwap(true, false) {
		c.gate.free(causeStore)
	}
	if v == verdict.Claimed {
		return v, errClaimed
	}
	return v, nil
}

// checkAgain holds d (in progress, spending nothing) and asks the store
// again with backoff until it answers, or d's wait ends.
func (c *checker) again(d *delivery) (v verdict.Verdict, err error) {
	c.hold.count(func() {
		err = retry.Do(d.wait, checkWait, func(ctx context.Context) error {
			var cerr error
			v, cerr = c.once(ctx, d.skey)
			return cerr
		}, func(err error, wait time.Duration) {
			d.log.Debug("asking the dedup store again", "error", err, "in", wait.Round(time.Millisecond).String())
		})
	})
	return v, err
}

// check returns no ending if the delivery goes on to the app; else the
// ending of a duplicate, or of a delivery given back because courier stopped
// while it waited. A delivery of the same key already running in this process is
// waited for, by its own key for a replay too: a delivery that began before
// the rewind and succeeded makes the rewind's copy a duplicate. So is
// another replica's claim. While the store cannot answer,
// the message is held (in progress, spending nothing) and the store asked
// again; the gate stays closed meanwhile, so nothing else is fetched.
func (c *checker) check(d *delivery) ending {
	fl, dup, err := c.flights.claim(d.wait, d.fkey, &d.own, func() { c.yieldProbe(d) })
	if err != nil {
		return giveBackEnding(giveBackLater, "shutting down while a delivery of the same key ran")
	}
	d.fl = fl
	if !dup {
		// The common case asks the store once; the retry loop (and its
		// closures) only when it could not answer.
		v, err := c.once(d.wait, d.skey)
		if err != nil {
			c.yieldProbe(d)
			v, err = c.again(d)
		}
		if err != nil {
			c.flights.finish(d.fkey, fl, false)
			return giveBackEnding(giveBackLater, "shutting down while the dedup store could not answer, or another replica held the key")
		}
		dup = v == verdict.Processed
		d.claimed = v == verdict.New
	}
	if dup {
		return ending{kind: endDuplicate}
	}
	if d.replay != "" {
		c.m.replayed.Inc()
	}
	return ending{}
}

// yieldProbe hands d's go-ahead as the breaker's probe on to another held
// message before d waits (for another delivery of its key, the store,
// another replica's claim): a probe that waits would stop the probing for as
// long, for good if what it waits for is itself held for a probe. d is then
// held again before it is sent, if the gate is still closed (attempt).
func (c *checker) yieldProbe(d *delivery) {
	if d.probe {
		d.probe = false
		c.breaker.handOn()
	}
}
