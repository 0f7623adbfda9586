package promcheck

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
)

// TestDashboard: the dashboard's queries parse, use the data source and
// instance variables everywhere, and name documented metrics.
func TestDashboard(t *testing.T) {
	d, qs, err := CheckDashboard(read(t, dashboardFile))
	if err != nil {
		t.Fatalf("%s:\n%v", dashboardFile, err)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	for _, v := range []string{"datasource", "job", "instance"} {
		if !vars[v] {
			t.Errorf("no $%s variable", v)
		}
	}
	var walk func([]Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			if p.Type != "row" && (p.Datasource == nil || p.Datasource.UID != "${datasource}") {
				t.Errorf("panel %q: data source %+v, want uid ${datasource} (so the dashboard imports anywhere)", p.Title, p.Datasource)
			}
			for _, tg := range p.Targets {
				if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
					t.Errorf("panel %q target %s: data source %+v, want uid ${datasource}", p.Title, tg.RefID, tg.Datasource)
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	panels := 0
	for _, q := range qs {
		if !strings.HasPrefix(q.Where, "panel") {
			continue
		}
		panels++
		for _, s := range q.Selectors() {
			if !hasMatcher(s, "job", `$job`) || !hasMatcher(s, "instance", `$instance`) {
				t.Errorf("%s: selector of %s lacks job=~\"$job\", instance=~\"$instance\": the variables would not apply", q.Where, s.Metric)
			}
		}
	}
	if panels < 20 {
		t.Errorf("only %d panel queries", panels)
	}
	checkDocumented(t, qs)
}

// TestDashboardSubscriptions: the $subscription variable picks the
// subscriptions of couriers serving several, and every panel keeps working
// for a courier of one, which labels nothing subscription: All is .*, which
// matches a series without the label; each metric of a message's path is
// filtered by it in every panel or in none; and the in-flight limit has its
// panels.
func TestDashboardSubscriptions(t *testing.T) {
	d, qs, err := CheckDashboard(read(t, dashboardFile))
	if err != nil {
		t.Fatalf("%s:\n%v", dashboardFile, err)
	}
	var v *Variable
	for i := range d.Templating.List {
		if d.Templating.List[i].Name == "subscription" {
			v = &d.Templating.List[i]
		}
	}
	if v == nil {
		t.Fatal("no $subscription variable")
	}
	q, err := variableQuery(v.Query)
	if err != nil || !strings.HasPrefix(q, "label_values(") || !strings.HasSuffix(q, ", subscription)") {
		t.Errorf("$subscription's query %q (%v): want label_values(<a metric of the path>, subscription)", q, err)
	}
	if !v.IncludeAll || !v.Multi {
		t.Errorf("$subscription: includeAll %v, multi %v: want All and several at once", v.IncludeAll, v.Multi)
	}
	// Without allValue Grafana writes All as the values found, which a
	// courier of one subscription is not among.
	all, err := labels.NewMatcher(labels.MatchRegexp, "subscription", v.AllValue)
	if err != nil || v.AllValue == "" || !all.Matches("") {
		t.Errorf("$subscription's allValue %q (%v) does not match a series without the label: All would leave out couriers of one subscription", v.AllValue, err)
	}

	filtered := map[string]bool{} // metrics filtered by $subscription somewhere
	for _, q := range qs {
		for _, s := range q.Selectors() {
			for _, m := range s.Matchers {
				if m.Label != "subscription" {
					continue
				}
				if m.Op != "=~" || m.Value != "$subscription" {
					t.Errorf("%s: %s{subscription%s%q}: want subscription=~\"$subscription\"", q.Where, s.Metric, m.Op, m.Value)
				}
				filtered[s.Metric] = true
			}
		}
	}
	for _, name := range []string{"courier_messages_total", "courier_inflight_limit", "courier_consumer_pending_messages"} {
		if !filtered[name] {
			t.Errorf("no panel filters %s by $subscription", name)
		}
	}
	for _, q := range qs {
		if !strings.HasPrefix(q.Where, "panel") {
			continue
		}
		for _, s := range q.Selectors() {
			if filtered[s.Metric] && !hasMatcher(s, "subscription", "$subscription") {
				t.Errorf("%s: %s is not filtered by $subscription here, as it is in other panels", q.Where, s.Metric)
			}
		}
	}

	panels := map[string]bool{} // metric names of panels' queries
	for _, q := range qs {
		for _, s := range q.Selectors() {
			if strings.HasPrefix(q.Where, "panel") {
				panels[s.Metric] = true
			}
		}
	}
	for _, name := range []string{"courier_inflight_limit", "courier_inflight_requests", "courier_inflight_limit_min_rtt_seconds", "courier_inflight_limit_changes_total"} {
		if !panels[name] {
			t.Errorf("no panel shows %s", name)
		}
	}
}

func hasMatcher(s Selector, label, value string) bool {
	return slices.Contains(s.Matchers, Matcher{Label: label, Op: "=~", Value: value})
}

const goodDashboard = `{
  "uid": "u", "title": "t",
  "templating": {"list": [
    {"name": "job", "type": "query", "query": {"query": "label_values(up{a=\"b,c\"}, job)"}},
    {"name": "ds", "type": "datasource", "query": "prometheus"}
  ]},
  "panels": [
    {"id": 1, "type": "row", "title": "r", "panels": [
      {"id": 2, "type": "timeseries", "title": "p", "targets": [
        {"refId": "A", "expr": "sum(rate(x_total{job=~\"$job\"}[$__rate_interval]))"}
      ]}
    ]},
    {"id": 3, "type": "stat", "title": "s", "targets": [{"refId": "A", "expr": "histogram_quantile(0.9, sum by (le) (rate(y_bucket[5m])))"}]}
  ]
}`

// TestCheckDashboardRejects: each way a dashboard's queries can be wrong is
// reported.
func TestCheckDashboardRejects(t *testing.T) {
	_, qs, err := CheckDashboard([]byte(goodDashboard))
	if err != nil {
		t.Fatal(err)
	}
	var got []Selector
	for _, q := range qs {
		got = append(got, q.Selectors()...)
	}
	want := []Selector{
		{Where: `panel 2 "p" target A`, Metric: "x_total", Matchers: []Matcher{{Label: "job", Op: "=~", Value: "$job"}}},
		{Where: `panel 3 "s" target A`, Metric: "y_bucket"},
		{Where: "variable job", Metric: "up", Matchers: []Matcher{{Label: "a", Op: "=", Value: "b,c"}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("selectors %+v, want %+v", got, want)
	}
	for _, tt := range []struct{ name, from, to string }{
		{"bad expr", "[$__rate_interval]", "[$__rate_interval"},
		{"range result", `sum(rate(x_total{job=~\"$job\"}[$__rate_interval]))`, "x_total[5m]"},
		{"unknown function", "histogram_quantile(", "histogram_quantil("},
		{"wrong arity", "histogram_quantile(0.9, ", "histogram_quantile("},
		{"bad regexp", `=~\"$job\"`, `=~\"(\"`},
		{"repeated id", `"id": 3`, `"id": 2`},
		{"no title", `"title": "s"`, `"title": ""`},
		{"repeated refId", `[{"refId": "A", "expr": "histogram`, `[{"refId": "A", "expr": "up"}, {"refId": "A", "expr": "histogram`},
		{"bad variable", "label_values(up", "label_valuez(up"},
		{"bad variable label", `"b,c\"}, job)`, `"b,c\"}, jo-b)`},
		{"bad JSON", `"uid"`, `uid`},
	} {
		bad := strings.Replace(goodDashboard, tt.from, tt.to, 1)
		if bad == goodDashboard {
			t.Fatalf("%s: %q not in the dashboard", tt.name, tt.from)
		}
		if _, _, err := CheckDashboard([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", tt.name)
		} else {
			t.Logf("%s: %v", tt.name, err)
		}
	}
}
