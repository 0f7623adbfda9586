package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The adaptive scenario: courier's automatic in-flight limit
// (COURIER_MAX_INFLIGHT=auto, docs/adaptive-concurrency.md) against fixed
// numbers, each draining a preloaded backlog to three apps in the bench
// process: one with a pool of 8 workers taking 10 ms a request (the rest
// wait inside it, so a limit above 8 only builds a queue there), an
// instant one, and one taking 20 ms a request with no bound on how many
// at once. Courier runs at its defaults (dedup on) but the limit. The
// figures: the drain rate, and the requests inside the app (served or
// waiting), weighed by how long each count lasted; for auto also the limit
// courier settled on and the answer time it takes as unloaded, read from
// its /metrics.

// Targets, from the automatic limit's issue: against the worker pool, auto
// drains at adaptivePoolTarget× a fixed limit of its workers with at most
// adaptivePoolInside requests inside it on average; against the other two,
// at adaptiveDefaultTarget× today's default. auto becomes the default only
// at adaptiveDefaultTarget× the best fixed number on all three.
const (
	adaptivePoolTarget    = 0.9
	adaptivePoolInside    = 12
	adaptiveDefaultTarget = 0.95
	// adaptiveDefault is COURIER_MAX_INFLIGHT's default.
	adaptiveDefault = "8"
	// adaptiveAuto is the value under test (a ceiling of 64).
	adaptiveAuto = "auto"
	// adaptiveScrapeEvery is how often courier's limit is read while an
	// auto drain runs: often enough to see it move, rarely enough to cost
	// courier nothing that shows (a scrape is a fraction of a millisecond).
	adaptiveScrapeEvery = 100 * time.Millisecond
)

// adaptiveApp is one app of the scenario.
type adaptiveApp struct {
	name    string
	workers int           // served at once; 0: any number
	delay   time.Duration // per request
	// scale multiplies -adaptive-n: the instant app, and the 20 ms one at
	// 64, drain so fast that -adaptive-n messages would measure little
	// more than the automatic limit's climb.
	scale  int
	limits []string // COURIER_MAX_INFLIGHT values, auto first
}

var adaptiveApps = []adaptiveApp{
	{name: "8 workers × 10 ms", workers: 8, delay: 10 * time.Millisecond, scale: 1, limits: []string{adaptiveAuto, "8", "64"}},
	{name: "instant", scale: 5, limits: []string{adaptiveAuto, "8", "16", "64"}},
	{name: "20 ms, any number at once", delay: 20 * time.Millisecond, scale: 2, limits: []string{adaptiveAuto, "8", "64"}},
}

// variantName is how -only matches one drain of the scenario.
func (a adaptiveApp) variantName(limit string) string {
	return "adaptive: " + a.name + ", " + limit
}

// limitReading is what courier's /metrics said of its in-flight limit.
type limitReading struct {
	limit   float64            // courier_inflight_limit
	minRTT  time.Duration      // courier_inflight_limit_min_rtt_seconds
	changes map[string]float64 // courier_inflight_limit_changes_total by cause
}

// limitSample is courier's limit at one moment of a drain.
type limitSample struct {
	at    time.Time
	limit float64
}

// adaptiveResult is one drain of one app at one limit.
type adaptiveResult struct {
	app     int // index in adaptiveApps
	limit   string
	n       int
	round   int
	elapsed time.Duration // first message at the app → every message acked
	// second is the drain's second half: its (n/2)-th message at the app →
	// every message acked. It leaves out how an automatic limit climbs
	// from its first value.
	second time.Duration
	// inside is the requests inside the app over the drain: its
	// time-weighted mean and 90th percentile.
	insideMean, insideP90 float64
	requests              int64
	distinct              int64
	strays                int64
	// final is courier's limit at the end of the drain (auto only), read
	// before it is stopped; trace is the limit read every
	// adaptiveScrapeEvery from the first message on.
	final *limitReading
	trace []limitSample
	logs  logCount
	err   error
}

// rate is messages per second from the first message at the app until every
// message is acked: courier's start-up, the same whatever the limit, is left
// out; the automatic limit's climb from its first value is in.
func (r *adaptiveResult) rate() float64 {
	if r.elapsed <= 0 {
		return math.NaN()
	}
	return float64(r.distinct) / r.elapsed.Seconds()
}

// secondRate is messages per second over the drain's second half.
func (r *adaptiveResult) secondRate() float64 {
	if r.second <= 0 {
		return math.NaN()
	}
	return float64(r.n-r.n/2) / r.second.Seconds()
}

// drainAdaptive preloads the app's share of o.adaptiveN messages, starts
// courier with COURIER_MAX_INFLIGHT=limit, and measures the drain.
func (b *bench) drainAdaptive(ctx context.Context, appIdx int, limit string, round int) (*adaptiveResult, error) {
	a := adaptiveApps[appIdx]
	r := &adaptiveResult{app: appIdx, limit: limit, n: a.scale * b.o.adaptiveN, round: round}
	run, stream, subject := b.next()
	pctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()
	if err := b.broker.createStream(pctx, stream, subject); err != nil {
		return r, err
	}
	if err := b.broker.preload(pctx, stream, subject, 0, run, r.n, b.o.size); err != nil {
		return r, err
	}
	t := newTally(run, r.n)
	occ := &occupancy{}
	b.app.measure(t)
	b.app.answerAfter(a.delay)
	b.app.withWorkers(a.workers)
	b.app.recordInside(occ)
	defer func() {
		b.app.recordInside(nil)
		b.app.withWorkers(0)
		b.app.answerAfter(0)
	}()

	// Courier at its defaults but the limit: the later value of a variable
	// wins (os/exec keeps the last of duplicates), so "auto" replaces the
	// number launch sets.
	c, logPath, err := b.launchReplica(dedupOn, run, stream, 8, 0, "COURIER_MAX_INFLIGHT="+limit)
	if err != nil {
		return r, err
	}
	defer c.stop(stopGrace) // on every path; a no-op after finish
	var admin string
	scraped := make(chan struct{})
	quitScrape := make(chan struct{})
	if limit == adaptiveAuto {
		go func() {
			defer close(scraped)
			var err error
			if admin, err = logAddr(pctx, logPath, c, "courier starting", "admin"); err != nil {
				return
			}
			tick := time.NewTicker(adaptiveScrapeEvery)
			defer tick.Stop()
			for {
				select {
				case <-quitScrape:
					return
				case <-tick.C:
				}
				if t.first.Load() == 0 {
					continue
				}
				// Read by this goroutine's owner once scraped is closed.
				if rd, err := scrapeLimit(pctx, admin); err == nil {
					r.trace = append(r.trace, limitSample{at: time.Now(), limit: rd.limit})
				}
			}
		}()
	} else {
		close(scraped)
	}

	rctx, cancelRun := context.WithTimeout(ctx, b.o.timeout)
	defer cancelRun()
	r.err = b.awaitDrain(rctx, t, r.n, c.Exited(), func() error { return fmt.Errorf("exited before draining: %v", c.err) },
		func(ctx context.Context) error { return b.broker.waitSettled(ctx, stream, consumerName) })
	settled := time.Now()
	occ.stop(settled)
	close(quitScrape)
	<-scraped
	if limit == adaptiveAuto {
		if admin == "" {
			r.err = errors.Join(r.err, errors.New("courier's admin address was not found in its log"))
		} else if rd, err := scrapeLimit(rctx, admin); err != nil {
			r.err = errors.Join(r.err, fmt.Errorf("reading courier's limit: %w", err))
		} else {
			r.final = &rd
		}
	}
	if first, half := t.first.Load(), t.half.Load(); first != 0 && half != 0 && r.err == nil {
		r.elapsed = settled.Sub(time.Unix(0, first))
		r.second = settled.Sub(time.Unix(0, half))
	}
	r.insideMean, r.insideP90 = occ.mean(), occ.quantile(0.9)
	r.requests, r.distinct, r.strays = t.requests.Load(), t.distinct.Load(), t.strays.Load()
	logs, stopErr := b.finish(ctx, c, run, logPath)
	r.err = errors.Join(r.err, stopErr)
	r.logs = logs
	return r, ctx.Err()
}

// scrapeLimit reads courier's in-flight limit from its /metrics at admin.
func scrapeLimit(ctx context.Context, admin string) (limitReading, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	if err != nil {
		return limitReading{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return limitReading{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return limitReading{}, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return parseLimit(resp.Body)
}

// parseLimit reads the in-flight limit's metrics from Prometheus' text
// format. The bench runs one unnamed subscription, whose metrics carry no
// subscription label; a labelled line is read alike.
func parseLimit(r io.Reader) (limitReading, error) {
	rd := limitReading{limit: math.NaN(), changes: map[string]float64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	seen := 0
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "courier_inflight_limit") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name, labels, _ := strings.Cut(line[:i], "{")
		switch name {
		case "courier_inflight_limit":
			rd.limit = v
			seen++
		case "courier_inflight_limit_min_rtt_seconds":
			rd.minRTT = time.Duration(v * float64(time.Second))
		case "courier_inflight_limit_changes_total":
			if _, rest, ok := strings.Cut(labels, `cause="`); ok {
				cause, _, _ := strings.Cut(rest, `"`)
				rd.changes[cause] = v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return rd, err
	}
	if seen == 0 {
		return rd, errors.New("no courier_inflight_limit in /metrics")
	}
	return rd, nil
}

// adaptivePhase runs the scenario round by round, each app's limits in
// turn, each round starting with the next limit, so that drift of the
// machine spreads over every limit.
func (b *bench) adaptivePhase(ctx context.Context, rep *report, stderr io.Writer) error {
	if b.o.adaptiveN == 0 {
		return nil
	}
	for round := range b.o.repeat {
		for i, a := range adaptiveApps {
			limits := slices.DeleteFunc(slices.Clone(a.limits), func(l string) bool {
				return b.o.only != nil && !b.o.only.MatchString(a.variantName(l))
			})
			if len(limits) == 0 {
				continue
			}
			k := round % len(limits)
			for _, limit := range slices.Concat(limits[k:], limits[:k]) {
				r, err := b.drainAdaptive(ctx, i, limit, round)
				if err != nil {
					return err
				}
				rep.adaptive = append(rep.adaptive, r)
				fmt.Fprintf(stderr, "bench: %-45s %8.0f msgs/s, %5.1f inside (p90 %.0f)%s%s\n",
					a.variantName(limit), r.rate(), r.insideMean, r.insideP90, r.finalNote(), noteIf(r.err))
			}
		}
	}
	return nil
}

// finalNote says where an automatic limit ended.
func (r *adaptiveResult) finalNote() string {
	if r.final == nil {
		return ""
	}
	return fmt.Sprintf(", limit %.0f, min RTT %s", r.final.limit, fmtDur(r.final.minRTT))
}

// traceSummary is the automatic limit over the drain: its least and most,
// and the values read, at most max of them (evenly picked).
func (r *adaptiveResult) traceSummary(maxShown int) string {
	if len(r.trace) == 0 {
		return "-"
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range r.trace {
		lo, hi = min(lo, s.limit), max(hi, s.limit)
	}
	var shown []string
	step := max(1, (len(r.trace)+maxShown-1)/maxShown)
	for i := 0; i < len(r.trace); i += step {
		shown = append(shown, strconv.FormatFloat(r.trace[i].limit, 'f', 0, 64))
	}
	return fmt.Sprintf("%.0f–%.0f over %d readings every %s: %s", lo, hi, len(r.trace),
		adaptiveScrapeEvery*time.Duration(step), strings.Join(shown, " "))
}

// adaptiveOf returns the drains of app i at limit, in the order run.
func (rep *report) adaptiveOf(i int, limit string) []*adaptiveResult {
	var rs []*adaptiveResult
	for _, r := range rep.adaptive {
		if r.app == i && r.limit == limit {
			rs = append(rs, r)
		}
	}
	return rs
}

// adaptiveRatios are f of each drain of a over f of b's drain of the same
// round.
func adaptiveRatios(a, b []*adaptiveResult, f func(*adaptiveResult) float64) []float64 {
	var vs []float64
	for _, x := range a {
		for _, y := range b {
			if x.round == y.round {
				if p, q := f(x), f(y); q != 0 && !math.IsNaN(p) && !math.IsNaN(q) {
					vs = append(vs, p/q)
				}
			}
		}
	}
	return vs
}

func adaptiveValues(rs []*adaptiveResult, f func(*adaptiveResult) float64) []float64 {
	vs := make([]float64, len(rs))
	for i, r := range rs {
		vs[i] = f(r)
	}
	return vs
}

// printAdaptive writes the adaptive scenario's figures.
func (rep *report) printAdaptive(w io.Writer) {
	if len(rep.adaptive) == 0 {
		return
	}
	fmt.Fprintf(w, "\nAdaptive in-flight limit: COURIER_MAX_INFLIGHT=auto against numbers (today's default %s), draining\n", adaptiveDefault)
	fmt.Fprintf(w, "  preloaded messages of %d B (how many: beside each app) to apps in the bench process; courier at its defaults\n",
		rep.o.size)
	fmt.Fprintln(w, "  msgs/s: from the first message at the app until every message is acked (start-up left out);")
	fmt.Fprintln(w, "  2nd half: from the middle message on (auto's climb from its first limit left out)")
	fmt.Fprintln(w, "  ×default: the ratio to the same round's drain at today's default; inside: requests in the app,")
	fmt.Fprintln(w, "  served or waiting for a worker, time-weighted over the drain (mean, and the count not exceeded 90% of")
	fmt.Fprintln(w, "  the time); auto: courier's courier_inflight_limit and _min_rtt_seconds at the end of the drain, and")
	fmt.Fprintf(w, "  the limit read every %s while draining\n", adaptiveScrapeEvery)
	verdicts := map[int]float64{} // app → median ratio of auto to the best number
	for i, a := range adaptiveApps {
		def := rep.adaptiveOf(i, adaptiveDefault)
		var t table
		t.add(fmt.Sprintf("%s, %d msgs", a.name, a.scale*rep.o.adaptiveN), "msgs/s", "×default", "2nd half msgs/s", "×default", "mean inside", "p90 inside", "limit at end", "min RTT at end")
		ran := false
		best, bestRate := "", math.Inf(-1)
		for _, l := range a.limits {
			rs := rep.adaptiveOf(i, l)
			if len(rs) == 0 {
				continue
			}
			ran = true
			if l != adaptiveAuto {
				if m := median(adaptiveValues(rs, (*adaptiveResult).rate)); m > bestRate {
					best, bestRate = l, m
				}
			}
			end, rtt := "-", "-"
			if l == adaptiveAuto {
				end = spread(adaptiveValues(rs, func(r *adaptiveResult) float64 {
					if r.final == nil {
						return math.NaN()
					}
					return r.final.limit
				}), "%.0f")
				rtt = spread(adaptiveValues(rs, func(r *adaptiveResult) float64 {
					if r.final == nil {
						return math.NaN()
					}
					return float64(r.final.minRTT) / float64(time.Millisecond)
				}), "%.2f") + " ms"
			}
			t.add(l, spread(adaptiveValues(rs, (*adaptiveResult).rate), "%.0f"),
				spread(adaptiveRatios(rs, def, (*adaptiveResult).rate), "%.2f"),
				spread(adaptiveValues(rs, (*adaptiveResult).secondRate), "%.0f"),
				spread(adaptiveRatios(rs, def, (*adaptiveResult).secondRate), "%.2f"),
				spread(adaptiveValues(rs, func(r *adaptiveResult) float64 { return r.insideMean }), "%.1f"),
				spread(adaptiveValues(rs, func(r *adaptiveResult) float64 { return r.insideP90 }), "%.0f"),
				end, rtt)
		}
		if !ran {
			continue
		}
		fmt.Fprintln(w)
		t.write(w)
		auto := rep.adaptiveOf(i, adaptiveAuto)
		if len(auto) == 0 {
			continue
		}
		for _, r := range auto {
			fmt.Fprintf(w, "  auto, round %d:", r.round+1)
			if r.final != nil {
				fmt.Fprintf(w, " at the end limit %.0f, min RTT %s;", r.final.limit, fmtDur(r.final.minRTT))
			}
			fmt.Fprintf(w, " limit %s", r.traceSummary(24))
			if r.final != nil {
				var cs []string
				for _, c := range []string{"rise", "queueing", "overload", "timeout", "minrtt-probe"} {
					cs = append(cs, fmt.Sprintf("%s %.0f", c, r.final.changes[c]))
				}
				fmt.Fprintf(w, "; changes: %s", strings.Join(cs, ", "))
			}
			fmt.Fprintln(w)
		}
		if len(def) > 0 {
			want := adaptiveDefaultTarget
			if a.workers > 0 {
				want = adaptivePoolTarget
			}
			fmt.Fprintf(w, "  auto / %s (today's default): %s× (target >= %.2f), 2nd half %s×", adaptiveDefault,
				spread(adaptiveRatios(auto, def, (*adaptiveResult).rate), "%.2f"), want,
				spread(adaptiveRatios(auto, def, (*adaptiveResult).secondRate), "%.2f"))
			if a.workers > 0 {
				fmt.Fprintf(w, ", mean inside %s (target <= %d)",
					spread(adaptiveValues(auto, func(r *adaptiveResult) float64 { return r.insideMean }), "%.1f"), adaptivePoolInside)
			}
			fmt.Fprintln(w)
		}
		if best != "" {
			rs := adaptiveRatios(auto, rep.adaptiveOf(i, best), (*adaptiveResult).rate)
			fmt.Fprintf(w, "  auto / the best number here (%s): %s×, 2nd half %s×\n", best, spread(rs, "%.2f"),
				spread(adaptiveRatios(auto, rep.adaptiveOf(i, best), (*adaptiveResult).secondRate), "%.2f"))
			verdicts[i] = median(rs)
		}
	}
	if len(verdicts) == len(adaptiveApps) {
		ok := true
		for _, v := range verdicts {
			ok = ok && v >= adaptiveDefaultTarget
		}
		fmt.Fprintf(w, "auto at >= %.2f× the best number on all three apps (median of the per-round ratios): %v\n",
			adaptiveDefaultTarget, map[bool]string{true: "yes", false: "no"}[ok])
	}
}

// adaptiveAnomalies writes what went wrong in the adaptive scenario, and
// returns how many drains had something to say.
func (rep *report) adaptiveAnomalies(w io.Writer) int {
	n := 0
	for _, r := range rep.adaptive {
		notes := drainNotes(r.err, r.requests, r.strays, r.distinct, r.logs.warns, r.logs.head)
		if len(notes) > 0 {
			n++
			fmt.Fprintf(w, "  %s, round %d: %s\n", adaptiveApps[r.app].variantName(r.limit), r.round+1, strings.Join(notes, "; "))
		}
	}
	return n
}
