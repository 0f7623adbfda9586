package main

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/courierhq/courier/internal/promqlcheck"
)

// targetLabels are the labels Prometheus adds to a scraped series; the
// dashboard and rules may match and aggregate on them.
var targetLabels = []string{"job", "instance", "pod", "namespace", "container", "service", "endpoint"}

// TestMonitoringUsesServedMetrics runs courier and checks what it serves
// on /metrics, freshly started (ready, before any message or request),
// against the Grafana dashboard and the Prometheus rules in deploy/: every
// metric they select is served from start-up, every label value they match
// on is served (so an alert on an event that has not happened yet is not
// blind, and a panel is not empty until then), the app reads available,
// promlint finds nothing in courier's metrics, and no family's name plus a
// suffix OpenMetrics reserves is another's.
func TestMonitoringUsesServedMetrics(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	// Answering requests too, so the reply metrics are served.
	c := start(t, append(h.env(a.URL), "COURIER_REPLY_SUBJECTS=quotes.get", "COURIER_SUCCESS_SUBJECT=ok.orders"))
	admin := adminAddr(t, c)
	waitFor(t, 10*time.Second, "courier ready", func() bool {
		code, _ := get(t, "http://"+admin+"/readyz")
		return code == 200
	})
	var body string
	// The dead-letter count is read from the server by a collector: there
	// once it has answered.
	waitFor(t, 10*time.Second, "courier_dead_letters_stored served", func() bool {
		_, body = get(t, "http://"+admin+"/metrics")
		return strings.Contains(body, "\ncourier_dead_letters_stored ")
	})
	if a.count() != 0 {
		t.Fatalf("the app was called %d times: the scrape is not of a fresh courier", a.count())
	}
	if !strings.Contains(body, "\ncourier_app_available 1\n") {
		t.Errorf("courier_app_available is not 1 at start-up for an app not known to be unavailable")
	}

	served := parseExposition(t, body)
	checkLint(t, body)
	checkOpenMetricsNames(t, body)

	var queries []promqlcheck.Query
	for _, f := range []struct {
		path  string
		parse func([]byte) ([]promqlcheck.Query, error)
	}{
		{"../../deploy/grafana/courier.json", func(b []byte) ([]promqlcheck.Query, error) {
			_, qs, err := promqlcheck.ParseDashboard(b)
			return qs, err
		}},
		{"../../deploy/prometheus/courier-rules.yaml", func(b []byte) ([]promqlcheck.Query, error) {
			_, qs, err := promqlcheck.ParseRules(b)
			return qs, err
		}},
	} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		qs, err := f.parse(b)
		if err != nil {
			t.Fatalf("%s:\n%v", f.path, err)
		}
		for i := range qs {
			qs[i].Where = f.path + ": " + qs[i].Where
		}
		queries = append(queries, qs...)
	}
	if len(queries) < 20 {
		t.Fatalf("only %d queries in the dashboard and rules", len(queries))
	}

	used := map[string]bool{}
	for _, q := range queries {
		for _, s := range q.Expr.Selectors {
			used[s.Metric] = true
			checkSelector(t, q.Where, s, served)
		}
	}
	t.Logf("%d queries, %d metrics checked against %d served series names", len(queries), len(used), len(served))
}

// checkSelector checks that s selects a served series and that each label
// value it matches with = is served.
func checkSelector(t *testing.T, where string, s promqlcheck.Selector, served map[string][]map[string]string) {
	t.Helper()
	series, ok := served[s.Metric]
	if !ok {
		t.Errorf("%s: %s is not served", where, s.Metric)
		return
	}
	for _, m := range s.Matchers {
		if slices.Contains(targetLabels, m.Label) {
			continue
		}
		carried, matched := false, false
		for _, labels := range series {
			v, ok := labels[m.Label]
			carried = carried || ok
			matched = matched || ok && v == m.Value
		}
		switch {
		case !carried:
			t.Errorf("%s: %s has no label %s", where, s.Metric, m.Label)
		case m.Op == "=" && !matched:
			t.Errorf("%s: %s{%s=%q} is not served (at start-up, before any such event)", where, s.Metric, m.Label, m.Value)
		}
	}
}

// sampleRe matches a sample line of the text format: name, labels, value.
var (
	sampleRe = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+( \S+)?$`)
	labelRe  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?`)
)

// parseExposition returns the label sets of every sample in a text-format
// body, by series name (a histogram's _bucket, _sum and _count apart).
func parseExposition(t *testing.T, body string) map[string][]map[string]string {
	t.Helper()
	out := map[string][]map[string]string{}
	for line := range strings.Lines(body) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := sampleRe.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("unreadable sample line %q", line)
		}
		labels := map[string]string{}
		for _, l := range labelRe.FindAllStringSubmatch(m[2], -1) {
			labels[l[1]] = strings.NewReplacer(`\"`, `"`, `\\`, `\`, `\n`, "\n").Replace(l[2])
		}
		out[m[1]] = append(out[m[1]], labels)
	}
	return out
}

// checkLint runs promlint over the served metrics and reports what it
// finds in courier's own (not the Go and process collectors').
func checkLint(t *testing.T, body string) {
	t.Helper()
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatalf("promlint: %v", err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "courier_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
}

// checkOpenMetricsNames: no courier family is another's name plus a suffix
// OpenMetrics gives series of its own (a gauge x beside a counter x_total
// cannot both be exposed).
func checkOpenMetricsNames(t *testing.T, body string) {
	t.Helper()
	families := map[string]string{} // name: type
	for line := range strings.Lines(body) {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(strings.TrimSpace(rest), " ")
			families[name] = typ
		}
	}
	for name, typ := range families {
		if !strings.HasPrefix(name, "courier_") {
			continue
		}
		// A counter's family is named without _total under OpenMetrics.
		base := strings.TrimSuffix(name, "_total")
		if typ == "counter" && base == name {
			t.Errorf("counter %s does not end in _total", name)
		}
		for _, suffix := range []string{"", "_total", "_created", "_bucket", "_count", "_sum", "_info", "_gcount", "_gsum"} {
			other := base + suffix
			if other == name {
				continue
			}
			if otherType, ok := families[other]; ok {
				t.Errorf("%s (%s) and %s (%s) clash under OpenMetrics: rename one", name, typ, other, otherType)
			}
		}
	}
	if len(families) == 0 {
		t.Fatal(fmt.Errorf("no # TYPE lines in /metrics"))
	}
}
