package promcheck

import (
	"reflect"
	"slices"
	"strings"
	"testing"
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
