package main

import (
	"encoding/json"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/poll"
)

// selectorsFile lists every vector selector of the Grafana dashboard and the
// Prometheus rules in deploy/, as Prometheus's own parser reads them: it is
// written, and kept in step with those files, by deploy/promcheck (a module
// of its own, so that this one does not carry Prometheus's dependencies).
const selectorsFile = "../../deploy/promcheck/selectors.json"

// selector is one entry of selectorsFile.
type selector struct {
	Where    string `json:"where"`
	Metric   string `json:"metric"`
	Matchers []struct {
		Label string `json:"label"`
		Op    string `json:"op"`
		Value string `json:"value"`
	} `json:"matchers"`
}

// targetLabels are the labels Prometheus adds to a scraped series; the
// dashboard and rules may match and aggregate on them.
var targetLabels = []string{"job", "instance", "pod", "namespace", "container", "service", "endpoint"}

// TestMonitoringUsesServedMetrics runs courier and checks what it serves
// on /metrics, freshly started (ready, before any message or request),
// against the Grafana dashboard and the Prometheus rules in deploy/: every
// metric they select is served from start-up, every label they match on is
// one the metric has and every label value they match with = is served (so
// an alert on an event that has not happened yet is not blind, and a panel
// is not empty until then), the app reads available, promlint finds
// nothing in courier's metrics, and no family's name plus a suffix
// OpenMetrics reserves is another's.
func TestMonitoringUsesServedMetrics(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	// Answering requests and serving the publish API too, so their
	// metrics are served.
	env := append(h.env(a.URL), "COURIER_REPLY_SUBJECTS=quotes.get", "COURIER_SUCCESS_SUBJECT=ok.orders")
	c := start(t, append(env, publishEnv...))
	admin := adminAddr(t, c)
	poll.Until(t, 10*time.Second, "courier ready", func() bool {
		code, _ := get(t, "http://"+admin+"/readyz")
		return code == 200
	})
	// The dead-letter count is read from the server by a collector: there
	// once it has answered.
	poll.Until(t, 10*time.Second, "courier_dead_letters_stored served", func() bool {
		_, ok := metricstest.Lookup(t, metrics(admin), "courier_dead_letters_stored")
		return ok
	})
	mfs, err := metrics(admin).Gather()
	if err != nil {
		t.Fatal(err)
	}
	if a.count() != 0 {
		t.Fatalf("the app was called %d times: the scrape is not of a fresh courier", a.count())
	}
	if v := metricstest.Value(t, metrics(admin), "courier_app_available"); v != 1 {
		t.Errorf("courier_app_available is %v at start-up for an app not known to be unavailable, want 1", v)
	}
	checkLint(t, mfs)
	checkOpenMetricsNames(t, mfs)

	b, err := os.ReadFile(selectorsFile)
	if err != nil {
		t.Fatal(err)
	}
	var selectors []selector
	if err := json.Unmarshal(b, &selectors); err != nil {
		t.Fatalf("%s: %v", selectorsFile, err)
	}
	if len(selectors) < 20 {
		t.Fatalf("only %d selectors in %s", len(selectors), selectorsFile)
	}
	served := seriesByName(mfs)
	used := map[string]bool{}
	for _, s := range selectors {
		used[s.Metric] = true
		checkSelector(t, s, served)
	}
	t.Logf("%d selectors, %d metrics checked against %d served series names", len(selectors), len(used), len(served))
}

// checkSelector checks that s selects a served series, that each label it
// matches on is one the series carry, and that each value it matches with
// = is served.
func checkSelector(t *testing.T, s selector, served map[string][]map[string]string) {
	t.Helper()
	series, ok := served[s.Metric]
	if !ok {
		t.Errorf("%s: %s is not served", s.Where, s.Metric)
		return
	}
	for _, m := range s.Matchers {
		if slices.Contains(targetLabels, m.Label) {
			continue
		}
		if m.Label == "subscription" && m.Op == "=~" {
			// A courier of one subscription carries none; the dashboard's
			// All (.*) matches its series too.
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
			t.Errorf("%s: %s has no label %s", s.Where, s.Metric, m.Label)
		case m.Op == "=" && !matched:
			t.Errorf("%s: %s{%s=%q} is not served (at start-up, before any such event)", s.Where, s.Metric, m.Label, m.Value)
		}
	}
}

// seriesByName returns the label sets of every series in mfs by the name a
// query selects it by: a histogram's _bucket, _sum and _count apart, and a
// summary's quantiles, _sum and _count.
func seriesByName(mfs []*dto.MetricFamily) map[string][]map[string]string {
	out := map[string][]map[string]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			add := func(name string, extra map[string]string) {
				ls := maps.Clone(labels)
				maps.Copy(ls, extra)
				out[name] = append(out[name], ls)
			}
			name := mf.GetName()
			switch mf.GetType() {
			case dto.MetricType_HISTOGRAM:
				for _, b := range m.GetHistogram().GetBucket() {
					if !math.IsInf(b.GetUpperBound(), 1) {
						add(name+"_bucket", map[string]string{"le": formatFloat(b.GetUpperBound())})
					}
				}
				add(name+"_bucket", map[string]string{"le": "+Inf"})
				add(name+"_sum", nil)
				add(name+"_count", nil)
			case dto.MetricType_SUMMARY:
				for _, q := range m.GetSummary().GetQuantile() {
					add(name, map[string]string{"quantile": formatFloat(q.GetQuantile())})
				}
				add(name+"_sum", nil)
				add(name+"_count", nil)
			default:
				add(name, nil)
			}
		}
	}
	return out
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// checkLint runs promlint over the served metrics and reports what it
// finds in courier's own (not the Go and process collectors').
func checkLint(t *testing.T, mfs []*dto.MetricFamily) {
	t.Helper()
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
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
func checkOpenMetricsNames(t *testing.T, mfs []*dto.MetricFamily) {
	t.Helper()
	families := map[string]dto.MetricType{}
	for _, mf := range mfs {
		families[mf.GetName()] = mf.GetType()
	}
	for name, typ := range families {
		if !strings.HasPrefix(name, "courier_") {
			continue
		}
		// A counter's family is named without _total under OpenMetrics.
		base := strings.TrimSuffix(name, "_total")
		if typ == dto.MetricType_COUNTER && base == name {
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
		t.Fatal("no metric families on /metrics")
	}
}
