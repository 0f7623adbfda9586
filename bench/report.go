package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
)

// report gathers the measurements and prints them.
type report struct {
	o        options
	machine  []string
	idle     []idleResult
	drains   []drainResult
	latency  []latencyResult
	replicas []replicasResult
}

// drainRow is every drain of one variant at one in-flight limit.
type drainRow struct {
	v        variant
	inflight int
	runs     []drainResult
}

// median of f over the row's drains.
func (r drainRow) median(f func(drainResult) float64) float64 {
	vs := make([]float64, len(r.runs))
	for i, d := range r.runs {
		vs[i] = f(d)
	}
	slices.Sort(vs)
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

// maximum of f over the row's drains.
func (r drainRow) maximum(f func(drainResult) float64) float64 {
	m := math.Inf(-1)
	for _, d := range r.runs {
		m = max(m, f(d))
	}
	return m
}

func (r drainRow) rate() float64       { return r.median(drainResult.rate) }
func (r drainRow) steadyRate() float64 { return r.median(drainResult.steadyRate) }

// rows groups the drains by variant and in-flight limit, in the order run.
func (rep *report) rows() []drainRow {
	var rows []drainRow
	for _, d := range rep.drains {
		i := slices.IndexFunc(rows, func(r drainRow) bool { return r.v == d.v && r.inflight == d.inflight })
		if i < 0 {
			rows = append(rows, drainRow{v: d.v, inflight: d.inflight})
			i = len(rows) - 1
		}
		rows[i].runs = append(rows[i].runs, d)
	}
	return rows
}

// find returns the row of v at inflight.
func find(rows []drainRow, v variant, inflight int) (drainRow, bool) {
	i := slices.IndexFunc(rows, func(r drainRow) bool { return r.v == v && r.inflight == inflight })
	if i < 0 {
		return drainRow{}, false
	}
	return rows[i], true
}

func mib(b float64) string { return fmt.Sprintf("%.1f", b/(1<<20)) }

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func perMsg(d time.Duration, n int64) float64 {
	if n == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(n)
}

// print writes the report.
func (rep *report) print(w io.Writer) {
	o := rep.o
	fmt.Fprintln(w, "courier benchmark")
	for _, l := range rep.machine {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintf(w, "setup:    nats-server %s embedded (file storage) and the instant app both run inside the bench\n", server.VERSION)
	fmt.Fprintln(w, "          process, sharing the CPUs with the process under test; every measurement on a fresh stream")
	fmt.Fprintln(w, "logs:     courier at COURIER_LOG_LEVEL=warn, i.e. without its per-message \"delivered\" info line,")
	fmt.Fprintln(w, "          except \"info logs\": the default level, JSON to /dev/null")
	if o.repeat > 1 {
		fmt.Fprintf(w, "repeat:   %d drains per row, median shown (peak RSS: the largest)\n", o.repeat)
	}

	fmt.Fprintln(w, "\nIdle memory (empty stream, 1s after the consumer exists, 16 in flight)")
	var t table
	t.add("variant", "RSS MiB", "start-up VmHWM MiB", "")
	for _, r := range rep.idle {
		t.add(r.v.String(), mib(float64(r.rss)), mib(float64(r.hwm)), noteIf(r.err))
	}
	t.write(w)

	rows := rep.rows()
	fmt.Fprintf(w, "\nDrain of %d preloaded messages of %d B to an instant app\n", o.n, o.size)
	fmt.Fprintln(w, "  msgs/s: from process start until every message is received and acked (NumAckPending 0)")
	fmt.Fprintln(w, "  steady: from the first message received to the last; start-up: process start to first message")
	fmt.Fprintln(w, "  CPU/msg: the process's CPU time (start-up included) / messages; server+app: the bench process's meanwhile")
	fmt.Fprintln(w, "  peak RSS: sampled every 50ms; VmHWM: the kernel's peak; anon+file: RssAnon + RssFile (mapped files) at the end")
	t = table{}
	t.add("variant", "in flight", "msgs/s", "×base", "steady msgs/s", "×base", "start-up ms",
		"CPU µs/msg", "server+app µs/msg", "peak RSS MiB", "VmHWM MiB", "anon+file MiB")
	for _, r := range rows {
		base, _ := find(rows, baseline, r.inflight)
		t.add(r.v.String(), fmt.Sprint(r.inflight),
			fmt.Sprintf("%.0f", r.rate()), ratio(r.rate(), base.rate()),
			fmt.Sprintf("%.0f", r.steadyRate()), ratio(r.steadyRate(), base.steadyRate()),
			fmt.Sprintf("%.0f", r.median(func(d drainResult) float64 { return float64(d.startup.Milliseconds()) })),
			fmt.Sprintf("%.1f", r.median(func(d drainResult) float64 { return perMsg(d.cpu, d.distinct) })),
			fmt.Sprintf("%.1f", r.median(func(d drainResult) float64 { return perMsg(d.hostCPU, d.distinct) })),
			mib(r.maximum(func(d drainResult) float64 { return float64(d.peakRSS) })),
			mib(r.maximum(func(d drainResult) float64 { return float64(d.hwm) })),
			mib(r.median(func(d drainResult) float64 { return float64(d.rssAnon) }))+"+"+
				mib(r.median(func(d drainResult) float64 { return float64(d.rssFile) })))
	}
	t.write(w)
	if o.repeat > 1 {
		fmt.Fprintln(w, "\nEvery drain, msgs/s (steady)")
		for _, r := range rows {
			var runs []string
			for _, d := range r.runs {
				runs = append(runs, fmt.Sprintf("%.0f (%.0f)", d.rate(), d.steadyRate()))
			}
			fmt.Fprintf(w, "  %-30s %3d: %s\n", r.v, r.inflight, strings.Join(runs, ", "))
		}
	}

	fmt.Fprintln(w)
	on, okOn := find(rows, dedupOn, focusInflight)
	off, okOff := find(rows, dedupOff, focusInflight)
	if okOn && okOff {
		cpu := func(r drainRow) float64 {
			return r.median(func(d drainResult) float64 { return perMsg(d.cpu, d.distinct) })
		}
		fmt.Fprintf(w, "dedup on / dedup off at %d in flight: %s (steady %s); target >= 0.90\n",
			focusInflight, ratio(on.rate(), off.rate()), ratio(on.steadyRate(), off.steadyRate()))
		fmt.Fprintf(w, "  CPU per message, dedup off / dedup on: %s (%.1f vs %.1f µs): the ratio to expect where CPU is the limit\n",
			ratio(cpu(off), cpu(on)), cpu(off), cpu(on))
	}
	if sh, ok := find(rows, dedupShared, focusInflight); ok && okOn {
		fmt.Fprintf(w, "dedup shared / dedup on (embedded) at %d in flight: %s (steady %s): the cost of sharing keys between pods\n",
			focusInflight, ratio(sh.rate(), on.rate()), ratio(sh.steadyRate(), on.steadyRate()))
	}
	if info, ok := find(rows, dedupOnInfo, focusInflight); ok && okOn {
		fmt.Fprintf(w, "info logs / warn logs (dedup on) at %d in flight: %s (steady %s): the cost of one log line per message\n",
			focusInflight, ratio(info.rate(), on.rate()), ratio(info.steadyRate(), on.steadyRate()))
	}

	rep.printReplicas(w)

	if len(rep.latency) > 0 {
		fmt.Fprintf(w, "\nLatency, publish to app, paced at %.0f msgs/s (%d messages after %d of warm-up)\n",
			o.rate, o.latencyN, latencyWarmup)
		t = table{}
		t.add("variant", "in flight", "achieved msgs/s", "received", "p50", "p90", "p99", "max", "")
		for _, r := range rep.latency {
			t.add(r.v.String(), fmt.Sprint(r.inflight), fmt.Sprintf("%.0f", r.achieved), fmt.Sprint(len(r.lat)),
				fmtDur(r.pct(0.50)), fmtDur(r.pct(0.90)), fmtDur(r.pct(0.99)), fmtDur(r.pct(1)), noteIf(r.err))
		}
		t.write(w)
		if len(rep.latency) == 2 {
			b, c := rep.latency[0], rep.latency[1]
			fmt.Fprintf(w, "added latency (%s − %s): p50 %s, p99 %s\n", c.v, b.v,
				fmtDelta(c.pct(0.50)-b.pct(0.50)), fmtDelta(c.pct(0.99)-b.pct(0.99)))
		}
	}

	fmt.Fprintln(w, "\nAnomalies")
	n := 0
	for _, d := range rep.drains {
		var notes []string
		if d.err != nil {
			notes = append(notes, d.err.Error())
		}
		if dups := d.requests - d.strays - d.distinct; dups > 0 {
			notes = append(notes, fmt.Sprintf("%d duplicate requests", dups))
		}
		if d.strays > 0 {
			notes = append(notes, fmt.Sprintf("%d requests with a body not from this drain", d.strays))
		}
		if d.logLines > 0 {
			notes = append(notes, fmt.Sprintf("%d warn/error log lines, first: %s", d.logLines, strings.Join(d.logHead, " | ")))
		}
		if len(notes) > 0 {
			n++
			fmt.Fprintf(w, "  drain %s at %d in flight: %s\n", d.v, d.inflight, strings.Join(notes, "; "))
		}
	}
	n += rep.replicasAnomalies(w)
	for _, r := range rep.latency {
		if r.err != nil {
			n++
			fmt.Fprintf(w, "  latency %s: %v\n", r.v, r.err)
		}
	}
	if n == 0 {
		fmt.Fprintln(w, "  none: every run delivered every message once, settled, logged no warning and exited 0")
	}
}

// percentile is the q-quantile of sorted (nearest rank); 0 if empty.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func fmtDur(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

func fmtDelta(d time.Duration) string {
	return fmt.Sprintf("%+.2f ms", float64(d)/float64(time.Millisecond))
}

// table lays out rows of cells: the first column left-aligned, the others
// right-aligned, two spaces apart.
type table struct{ rows [][]string }

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer) {
	var width []int
	for _, r := range t.rows {
		for i, c := range r {
			if i == len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for _, r := range t.rows {
		var b strings.Builder
		b.WriteString("  ")
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i == 0 {
				b.WriteString(c + pad)
			} else {
				b.WriteString("  " + pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}
