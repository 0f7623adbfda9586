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
	o         options
	machine   []string
	idle      []idleResult
	drains    []drainResult
	latency   []latencyResult
	replicas  []replicasResult
	subs      []subsResult
	publishes []publishResult
	adaptive  []*adaptiveResult
	rollouts  []rolloutResult
	loadStart string // the load average when measuring began
}

// drainRow is every drain of one variant at one in-flight limit.
type drainRow struct {
	v        variant
	inflight int
	runs     []drainResult
}

// values of f over the row's drains, in the order run.
func (r drainRow) values(f func(drainResult) float64) []float64 {
	vs := make([]float64, len(r.runs))
	for i, d := range r.runs {
		vs[i] = f(d)
	}
	return vs
}

// median of f over the row's drains.
func (r drainRow) median(f func(drainResult) float64) float64 { return median(r.values(f)) }

// ratios are f of each drain of r over f of base's drain of the same round
// (rounds run every variant once, so drain i of each row shares a round).
func ratios(r, base drainRow, f func(drainResult) float64) []float64 {
	var vs []float64
	for i := range min(len(r.runs), len(base.runs)) {
		if a, b := f(r.runs[i]), f(base.runs[i]); b != 0 && !math.IsNaN(a) && !math.IsNaN(b) {
			vs = append(vs, a/b)
		}
	}
	return vs
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	vs = slices.Sorted(slices.Values(vs))
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

// spread formats the median of vs with their range: "m (lo–hi)", or just
// the value when there is one.
func spread(vs []float64, format string) string {
	vs = slices.DeleteFunc(slices.Clone(vs), math.IsNaN) // not measured
	switch len(vs) {
	case 0:
		return "-"
	case 1:
		return fmt.Sprintf(format, vs[0])
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", median(vs), slices.Min(vs), slices.Max(vs))
}

// spreadMiB is spread for byte counts, in MiB.
func spreadMiB(vs []float64) string {
	m := make([]float64, len(vs))
	for i, v := range vs {
		m[i] = v / (1 << 20)
	}
	return spread(m, "%.1f")
}

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
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
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

func cpuPerMsg(d drainResult) float64  { return perMsg(d.cpu, d.distinct) }
func hostPerMsg(d drainResult) float64 { return perMsg(d.hostCPU, d.distinct) }

// allPerMsg is the CPU per message of the machine's whole work: the process
// under test, and the server and app it keeps busy. The machine's cores are
// shared, so a drain's rate follows it.
func allPerMsg(d drainResult) float64 { return perMsg(d.cpu+d.hostCPU, d.distinct) }

// steadyCPUPerMsg is cpuPerMsg without start-up: the CPU used from the
// first message's arrival at the app to the end, over the messages after
// it. NaN when the first reading is missing.
func steadyCPUPerMsg(d drainResult) float64 {
	if d.cpuFirst < 0 || d.distinct < 2 {
		return math.NaN()
	}
	return perMsg(d.cpu-d.cpuFirst, d.distinct-1)
}

// steadyAllPerMsg is allPerMsg without start-up, as steadyCPUPerMsg.
func steadyAllPerMsg(d drainResult) float64 {
	if d.cpuFirst < 0 || d.hostCPUFirst < 0 || d.distinct < 2 {
		return math.NaN()
	}
	return perMsg(d.cpu-d.cpuFirst+d.hostCPU-d.hostCPUFirst, d.distinct-1)
}

// print writes the report.
func (rep *report) print(w io.Writer) {
	o := rep.o
	fmt.Fprintln(w, "courier benchmark")
	for _, l := range rep.machine {
		fmt.Fprintln(w, l)
	}
	if rep.loadStart != "" {
		fmt.Fprintf(w, "load:     %s at the start, %s at the end (1, 5, 15 min averages, /proc/loadavg)\n", rep.loadStart, loadAvg())
	}
	fmt.Fprintf(w, "setup:    nats-server %s embedded (file storage) and the instant app both run inside the bench\n", server.VERSION)
	fmt.Fprintln(w, "          process, sharing the CPUs with the process under test; every measurement on a fresh stream")
	fmt.Fprintln(w, "courier:  every setting at its default (logs at info, dedup on with the embedded store) but those")
	fmt.Fprintln(w, "          naming the set-up (NATS, stream, consumer, app, in flight, admin address, dedup directory)")
	fmt.Fprintln(w, "          and the variant's own: dedup off is COURIER_DEDUP_TTL=0, debug logs (a line per message)")
	fmt.Fprintln(w, "          go to /dev/null")
	if o.repeat > 1 {
		fmt.Fprintf(w, "repeat:   %d drains per row, interleaved round by round: median (min–max)\n", o.repeat)
	}

	if len(rep.idle) > 0 {
		fmt.Fprintln(w, "\nIdle memory (empty stream, 1s after the consumer exists, 16 in flight), MiB")
		var t table
		t.add("variant", "RSS", "anon", "file", "start-up VmHWM", "")
		for _, r := range rep.idle {
			t.add(r.v.String(), mib(float64(r.mem.rss)), mib(float64(r.mem.anon)), mib(float64(r.mem.file)),
				mib(float64(r.hwm)), noteIf(r.err))
		}
		t.write(w)
	}

	rows := rep.rows()
	fmt.Fprintf(w, "\nDrain of %d preloaded messages of %d B to an instant app\n", o.n, o.size)
	fmt.Fprintln(w, "  msgs/s: from process start until every message is received and acked (NumAckPending 0)")
	fmt.Fprintln(w, "  ×base: the ratio to the forwarder's drain of the same round; steady: first to last message received")
	fmt.Fprintln(w, "  CPU/msg: the process's CPU time (start-up included) / messages; server+app: the bench process's meanwhile")
	fmt.Fprintln(w, "  after start-up: the process's CPU from the first message's arrival at the app on, / the messages after it")
	fmt.Fprintln(w, "  log lines: everything the process logged over the drain, start-up and shutdown included")
	var t table
	t.add("variant", "in flight", "msgs/s", "×base", "steady ×base", "CPU µs/msg", "CPU ×base",
		"after start-up µs/msg", "×base", "server+app µs/msg", "start-up ms", "log lines")
	for _, r := range rows {
		base, _ := find(rows, baseline, r.inflight)
		t.add(r.v.String(), fmt.Sprint(r.inflight),
			spread(r.values(drainResult.rate), "%.0f"),
			spread(ratios(r, base, drainResult.rate), "%.2f"),
			spread(ratios(r, base, drainResult.steadyRate), "%.2f"),
			spread(r.values(cpuPerMsg), "%.1f"),
			spread(ratios(r, base, cpuPerMsg), "%.2f"),
			spread(r.values(steadyCPUPerMsg), "%.1f"),
			spread(ratios(r, base, steadyCPUPerMsg), "%.2f"),
			spread(r.values(hostPerMsg), "%.1f"),
			fmt.Sprintf("%.0f", r.median(func(d drainResult) float64 { return float64(d.startup.Milliseconds()) })),
			spread(r.values(func(d drainResult) float64 { return float64(d.logs.lines) }), "%.0f"))
	}
	t.write(w)

	fmt.Fprintf(w, "\nMemory over the drains, MiB\n")
	fmt.Fprintln(w, "  peak: sampled every 50ms from /proc/PID/status, each part its own peak: RSS, RssAnon (heap, stacks,")
	fmt.Fprintln(w, "  Badger's memtables), RssFile (the binary, Badger's mapped tables: pages the kernel can reclaim);")
	fmt.Fprintln(w, "  VmHWM: the kernel's peak RSS; end: once every message is acked, its keys held")
	t = table{}
	t.add("variant", "in flight", "peak RSS", "VmHWM", "peak anon", "peak file", "end anon", "end file")
	for _, r := range rows {
		t.add(r.v.String(), fmt.Sprint(r.inflight),
			spreadMiB(r.values(func(d drainResult) float64 { return float64(d.peak.rss) })),
			spreadMiB(r.values(func(d drainResult) float64 { return float64(d.hwm) })),
			spreadMiB(r.values(func(d drainResult) float64 { return float64(d.peak.anon) })),
			spreadMiB(r.values(func(d drainResult) float64 { return float64(d.peak.file) })),
			spreadMiB(r.values(func(d drainResult) float64 { return float64(d.end.anon) })),
			spreadMiB(r.values(func(d drainResult) float64 { return float64(d.end.file) })))
	}
	t.write(w)
	if o.repeat > 1 {
		fmt.Fprintln(w, "\nEvery drain in the order run, msgs/s (CPU µs/msg)")
		for _, r := range rows {
			var runs []string
			for _, d := range r.runs {
				runs = append(runs, fmt.Sprintf("%.0f (%.1f)", d.rate(), cpuPerMsg(d)))
			}
			fmt.Fprintf(w, "  %-30s %3d: %s\n", r.v, r.inflight, strings.Join(runs, ", "))
		}
	}

	fmt.Fprintln(w, "\nTargets, courier at its defaults (dedup on) against the forwarder, per-round ratios")
	for _, inflight := range o.inflight {
		on, okOn := find(rows, dedupOn, inflight)
		base, okBase := find(rows, baseline, inflight)
		if !okOn || !okBase {
			continue
		}
		want := 0.90
		if inflight == focusInflight {
			want = 0.95
		}
		fmt.Fprintf(w, "  %2d in flight: msgs/s %s× (target >= %.2f), CPU per message %s× the forwarder's, %s× with the server's and app's;\n",
			inflight, spread(ratios(on, base, drainResult.rate), "%.2f"), want, spread(ratios(on, base, cpuPerMsg), "%.2f"),
			spread(ratios(on, base, allPerMsg), "%.2f"))
		fmt.Fprintf(w, "                after start-up %s×, %s× with the server's and app's\n",
			spread(ratios(on, base, steadyCPUPerMsg), "%.2f"), spread(ratios(on, base, steadyAllPerMsg), "%.2f"))
	}
	var peaks []float64
	for _, r := range rows {
		if r.v == dedupOn {
			peaks = append(peaks, r.values(func(d drainResult) float64 { return float64(max(d.peak.rss, d.hwm)) })...)
		}
	}
	if len(peaks) > 0 {
		target := "" // the target is for the default drain of 30,000
		if o.n == 30000 {
			target = " (target <= 32)"
		}
		fmt.Fprintf(w, "  peak RSS draining %d (dedup on, every in-flight limit): %s MiB%s\n", o.n, spreadMiB(peaks), target)
	}

	on, okOn := find(rows, dedupOn, focusInflight)
	off, okOff := find(rows, dedupOff, focusInflight)
	if okOn && okOff {
		fmt.Fprintf(w, "dedup on / dedup off at %d in flight: msgs/s %s×, CPU per message %s×\n",
			focusInflight, spread(ratios(on, off, drainResult.rate), "%.2f"), spread(ratios(on, off, cpuPerMsg), "%.2f"))
	}
	if sh, ok := find(rows, dedupShared, focusInflight); ok && okOn {
		fmt.Fprintf(w, "dedup shared / dedup on (embedded) at %d in flight: msgs/s %s×, CPU per message %s×, %s× with the server's and app's: the cost of sharing keys between pods\n",
			focusInflight, spread(ratios(sh, on, drainResult.rate), "%.2f"), spread(ratios(sh, on, cpuPerMsg), "%.2f"),
			spread(ratios(sh, on, allPerMsg), "%.2f"))
	}
	if dbg, ok := find(rows, dedupOnInfo, focusInflight); ok && okOn {
		fmt.Fprintf(w, "debug logs / the default (info) at %d in flight: msgs/s %s×, CPU per message %s×: the cost of one log line per message\n",
			focusInflight, spread(ratios(dbg, on, drainResult.rate), "%.2f"), spread(ratios(dbg, on, cpuPerMsg), "%.2f"))
	}

	if us, ok := find(rows, dedupSocket, focusInflight); ok && okOn {
		fmt.Fprintf(w, "unix socket / TCP to the app at %d in flight: msgs/s %s×, CPU per message %s×: COURIER_APP_URL=unix://... for an app sharing a volume\n",
			focusInflight, spread(ratios(us, on, drainResult.rate), "%.2f"), spread(ratios(us, on, cpuPerMsg), "%.2f"))
	}

	if bt, ok := find(rows, dedupBatch, focusInflight); ok {
		if okOn {
			fmt.Fprintf(w, "batches of %d / one message a request (dedup on) at %d in flight: msgs/s %s× (target >= 3), CPU per message %s×\n",
				benchBatch, focusInflight, spread(ratios(bt, on, drainResult.rate), "%.2f"), spread(ratios(bt, on, cpuPerMsg), "%.2f"))
		}
		if base, ok := find(rows, baseline, focusInflight); ok {
			fmt.Fprintf(w, "batches of %d / the per-message forwarder at %d in flight: msgs/s %s× (target >= 3)\n",
				benchBatch, focusInflight, spread(ratios(bt, base, drainResult.rate), "%.2f"))
		}
	}
	if bj, ok := find(rows, dedupBatchJSON, focusInflight); ok {
		if base, ok := find(rows, baseline, focusInflight); ok {
			fmt.Fprintf(w, "batches of %d, the app decoding each with encoding/json / the per-message forwarder at %d in flight: msgs/s %s×, CPU per message %s×, %s× with the server's and app's\n",
				benchBatch, focusInflight, spread(ratios(bj, base, drainResult.rate), "%.2f"), spread(ratios(bj, base, cpuPerMsg), "%.2f"),
				spread(ratios(bj, base, allPerMsg), "%.2f"))
		}
	}

	rep.printOrder(w, rows)
	rep.printReplicas(w)
	rep.printSubscriptions(w)
	rep.printAdaptive(w)
	rep.printPublish(w)
	rep.printRollouts(w)

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
		notes := drainNotes(d.err, d.requests, d.strays, d.distinct, d.logs.warns, d.logs.head)
		if len(notes) > 0 {
			n++
			fmt.Fprintf(w, "  drain %s at %d in flight: %s\n", d.v, d.inflight, strings.Join(notes, "; "))
		}
	}
	n += rep.replicasAnomalies(w)
	n += rep.subscriptionsAnomalies(w)
	n += rep.adaptiveAnomalies(w)
	n += rep.rolloutAnomalies(w)
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

// drainNotes is what went wrong in one drain, for the anomalies: its
// error, duplicate requests, requests of another drain, courier's
// warn/error log lines (warns of them, head the first).
func drainNotes(err error, requests, strays, distinct int64, warns int, head []string) []string {
	var notes []string
	if err != nil {
		notes = append(notes, err.Error())
	}
	if dups := requests - strays - distinct; dups > 0 {
		notes = append(notes, fmt.Sprintf("%d duplicate requests", dups))
	}
	if strays > 0 {
		notes = append(notes, fmt.Sprintf("%d requests with a body not from this drain", strays))
	}
	if warns > 0 {
		notes = append(notes, fmt.Sprintf("%d warn/error log lines, first: %s", warns, strings.Join(head, " | ")))
	}
	return notes
}
