package main

// The rounds run calls in turn: idle memory, the drains interleaved round by
// round, replicas, publishing, latency. Each phase measures with
// measure.go's, replicas.go's or publish.go's functions and adds what they
// return to the report (report.go), printing a line per measurement as it
// goes.

import (
	"context"
	"fmt"
	"io"
	"slices"
)

// idlePhase measures idle memory: each variant started against an empty
// stream.
func (b *bench) idlePhase(ctx context.Context, rep *report, _ io.Writer) error {
	for _, v := range slices.DeleteFunc([]variant{baseline, dedupOff, dedupOn}, b.o.skip) {
		r, err := b.idle(ctx, v)
		if err != nil {
			return err
		}
		rep.idle = append(rep.idle, r)
	}
	return nil
}

// drainPhase runs the drains, interleaved round by round, each round
// starting with the next variant, so that drift of the machine and any
// effect of what ran just before spread over every variant.
func (b *bench) drainPhase(ctx context.Context, rep *report, stderr io.Writer) error {
	o := b.o
	variants := func(inflight int) []variant {
		vs := []variant{baseline, dedupOff, dedupOn}
		if inflight == focusInflight {
			vs = append(vs, dedupOnInfo, dedupShared, dedupSocket, dedupBatch, dedupBatchJSON)
			vs = append(vs, orderVariants...)
		}
		return slices.DeleteFunc(vs, o.skip)
	}
	total := 0
	for _, inflight := range o.inflight {
		total += o.repeat * len(variants(inflight))
	}
	for round := range o.repeat {
		for _, inflight := range o.inflight {
			vs := variants(inflight)
			if len(vs) == 0 {
				continue
			}
			k := round % len(vs)
			vs = slices.Concat(vs[k:], vs[:k])
			for _, v := range vs {
				r, err := b.drain(ctx, v, inflight)
				if err != nil {
					return err
				}
				rep.drains = append(rep.drains, r)
				fmt.Fprintf(stderr, "bench: drain %d/%d: %-30s %3d in flight: %8.0f msgs/s%s\n",
					len(rep.drains), total, v, inflight, r.rate(), noteIf(r.err))
			}
		}
	}
	return nil
}

// replicasPhase drains with one and three couriers on one durable,
// alternately (replicas.go).
func (b *bench) replicasPhase(ctx context.Context, rep *report, stderr io.Writer) error {
	if b.o.replicasN == 0 {
		return nil
	}
	for round := range b.o.repeat {
		for _, ordered := range []bool{false, true} {
			name := map[bool]string{false: replicasName, true: replicasOrderedName}[ordered]
			if b.o.only != nil && !b.o.only.MatchString(name) {
				continue
			}
			for _, k := range replicaCounts(round) {
				r, err := b.drainReplicas(ctx, k, ordered)
				if err != nil {
					return err
				}
				rep.replicas = append(rep.replicas, r)
				fmt.Fprintf(stderr, "bench: %s: %d × courier, app %s a request: %8.0f msgs/s (steady %.0f)%s\n",
					name, k, replicasAppDelay, r.rate(), r.steadyRate(), noteIf(r.err))
			}
		}
	}
	return nil
}

// publishPhase publishes through courier's HTTP API, through a minimal
// HTTP forwarder and with nats.go directly, alternately (publish.go).
func (b *bench) publishPhase(ctx context.Context, rep *report, stderr io.Writer) error {
	if b.o.publishN == 0 {
		return nil
	}
	for round := range b.o.repeat {
		rs, err := b.publishRound(ctx, round)
		if err != nil {
			return err
		}
		for _, r := range rs {
			rep.publishes = append(rep.publishes, r)
			fmt.Fprintf(stderr, "bench: %-30s %d callers: %8.0f msgs/s%s\n", r.name, publishConcurrency, r.rate(), noteIf(r.err))
		}
	}
	return nil
}

// latencyPhase measures the latency added at a paced rate well below
// capacity.
func (b *bench) latencyPhase(ctx context.Context, rep *report, stderr io.Writer) error {
	for _, v := range slices.DeleteFunc([]variant{baseline, dedupOn, dedupBatch}, b.o.skip) {
		r, err := b.latency(ctx, v, focusInflight)
		if err != nil {
			return err
		}
		rep.latency = append(rep.latency, r)
		fmt.Fprintf(stderr, "bench: latency: %-30s p50 %s p99 %s%s\n", v, r.pct(0.50), r.pct(0.99), noteIf(r.err))
	}
	return nil
}
