package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/courierhq/courier/partition"
)

// The replicas scenario: scale-out is for apps whose requests wait on
// something else (a database, a remote call), where one courier's in-flight
// limit, not the CPU, bounds the drain rate. Each courier runs with the
// shared store (as replicas are deployed) and replicasInflight requests in
// flight; the app answers each after replicasAppDelay. Its ordered variant
// ("replicas ordered") keeps the order of replicasKeys keys, the key in the
// subject, the durable split into replicasPartitions partitions that the
// couriers share out (COURIER_ORDER_PARTITIONS).
const (
	replicasAppDelay = 20 * time.Millisecond
	replicasInflight = 8
	// replicasTarget is what three replicas should reach over one: the
	// ideal is 3, and a little goes to start-up and to sharing the CPUs.
	replicasTarget = 2.4
	// replicasKeys and replicasPartitions shape the ordered variant.
	replicasKeys       = 1000
	replicasPartitions = 12
)

// Names of the replicas scenario's variants, as -only matches them.
const (
	replicasName        = "replicas"
	replicasOrderedName = "replicas ordered"
)

// replicaCounts is the order of one round: one and three, the first
// alternating from round to round.
func replicaCounts(round int) []int {
	if round%2 == 0 {
		return []int{1, 3}
	}
	return []int{3, 1}
}

// replicasResult is one drain of the latency-bound app by k couriers.
type replicasResult struct {
	ordered  bool // keys in order, the durable in partitions
	k        int
	n        int
	elapsed  time.Duration // first process start → every message received and acked
	steady   time.Duration // first → last message received
	requests int64
	distinct int64
	strays   int64
	logLines int
	logHead  []string
	err      error
}

func (r replicasResult) rate() float64 { return float64(r.distinct) / r.elapsed.Seconds() }

func (r replicasResult) steadyRate() float64 {
	if r.steady <= 0 {
		return 0
	}
	return float64(r.distinct-1) / r.steady.Seconds()
}

// drainReplicas preloads o.replicasN messages, starts k couriers on one
// durable, and measures how long they take to deliver and ack them all;
// ordered, the messages spread over replicasKeys keys in their subjects,
// kept in order across the couriers by partitions.
func (b *bench) drainReplicas(ctx context.Context, k int, ordered bool) (replicasResult, error) {
	r := replicasResult{k: k, n: b.o.replicasN, ordered: ordered}
	run, stream, subject := b.next()
	pctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()
	var extra []string
	captured, keys := subject, 0
	if ordered {
		// Message i on bench.<run>.<i % replicasKeys> (preload).
		captured, keys = subject+".*", replicasKeys
		extra = []string{"COURIER_ORDER_KEY=subject:3", fmt.Sprintf("COURIER_ORDER_PARTITIONS=%d", replicasPartitions)}
	}
	if err := b.broker.createStream(pctx, stream, captured); err != nil {
		return r, err
	}
	if err := b.broker.preload(pctx, stream, subject, keys, run, r.n, b.o.size); err != nil {
		return r, err
	}
	t := newTally(run, r.n)
	b.app.measure(t)
	b.app.answerAfter(replicasAppDelay)
	defer b.app.answerAfter(0)

	cs := make([]*child, 0, k)
	logs := make([]string, 0, k)
	defer func() {
		for _, c := range cs {
			c.stop(stopGrace) // on every path; a no-op after finish
		}
	}()
	for i := range k {
		c, logPath, err := b.launchReplica(dedupShared, run, stream, replicasInflight, i, extra...)
		if err != nil {
			return r, err
		}
		cs, logs = append(cs, c), append(logs, logPath)
	}
	rctx, cancelRun := context.WithTimeout(ctx, b.o.timeout)
	defer cancelRun()
	r.err = b.awaitDrain(rctx, t, r.n, anyExited(pctx, cs), func() error { return errors.New("a courier exited before draining") },
		func(ctx context.Context) error {
			if ordered {
				return b.broker.waitPartitionsSettled(ctx, partition.StreamName(stream, consumerName))
			}
			return b.broker.waitSettled(ctx, stream, consumerName)
		})
	r.elapsed = time.Since(cs[0].started)
	r.requests, r.distinct, r.strays = t.requests.Load(), t.distinct.Load(), t.strays.Load()
	if first := t.first.Load(); first != 0 {
		if last := t.last.Load(); last != 0 {
			r.steady = time.Duration(last - first)
		}
	}
	r.logLines, r.logHead, r.err = b.finishAll(ctx, cs, run, logs, r.err)
	return r, ctx.Err()
}

// printReplicas writes the replicas scenario's figures.
func (rep *report) printReplicas(w io.Writer) {
	if len(rep.replicas) == 0 {
		return
	}
	fmt.Fprintf(w, "\nReplicas: drain of %d preloaded messages by couriers on one durable (shared store, %d in flight each)\n",
		rep.o.replicasN, replicasInflight)
	fmt.Fprintf(w, "  to an app answering each request after %s: latency-bound, not CPU-bound; ordered: %d keys in order,\n", replicasAppDelay, replicasKeys)
	fmt.Fprintf(w, "  the key a subject token, the durable in %d partitions shared out (COURIER_ORDER_PARTITIONS)\n", replicasPartitions)
	for _, ordered := range []bool{false, true} {
		rep.printReplicasOf(w, ordered)
	}
}

// printReplicasOf writes the figures of the ordered or the unordered
// variant, if it ran.
func (rep *report) printReplicasOf(w io.Writer, ordered bool) {
	name := replicasName
	if ordered {
		name = replicasOrderedName
	}
	var t table
	t.add(name, "msgs/s", "steady msgs/s", "ideal msgs/s", "every drain: msgs/s (steady)")
	med := map[int][2]float64{}
	for _, k := range []int{1, 3} {
		var rates, steadies []float64
		var runs []string
		for _, r := range rep.replicas {
			if r.k == k && r.ordered == ordered {
				rates, steadies = append(rates, r.rate()), append(steadies, r.steadyRate())
				runs = append(runs, fmt.Sprintf("%.0f (%.0f)", r.rate(), r.steadyRate()))
			}
		}
		if len(rates) == 0 {
			continue
		}
		med[k] = [2]float64{median(rates), median(steadies)}
		ideal := float64(k*replicasInflight) / replicasAppDelay.Seconds()
		t.add(fmt.Sprintf("%d couriers", k), fmt.Sprintf("%.0f", med[k][0]), fmt.Sprintf("%.0f", med[k][1]),
			fmt.Sprintf("%.0f", ideal), strings.Join(runs, ", "))
	}
	if len(med) == 0 {
		return
	}
	t.write(w)
	one, okOne := med[1]
	three, okThree := med[3]
	if okOne && okThree {
		fmt.Fprintf(w, "three replicas / one: %s (steady %s); target >= %.1f\n",
			ratio(three[0], one[0]), ratio(three[1], one[1]), replicasTarget)
	}
}

// replicasAnomalies writes what went wrong in the replicas scenario, and
// returns how many drains had something to say.
func (rep *report) replicasAnomalies(w io.Writer) int {
	n := 0
	for _, r := range rep.replicas {
		notes := drainNotes(r.err, r.requests, r.strays, r.distinct, r.logLines, r.logHead)
		if len(notes) > 0 {
			n++
			name := replicasName
			if r.ordered {
				name = replicasOrderedName
			}
			fmt.Fprintf(w, "  %s: %d couriers: %s\n", name, r.k, strings.Join(notes, "; "))
		}
	}
	return n
}
