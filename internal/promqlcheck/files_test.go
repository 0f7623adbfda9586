package promqlcheck

import (
	"strings"
	"testing"
)

const goodRules = `
groups:
  - name: g
    rules:
      - alert: A
        expr: rate(x_total[5m]) > 0
        for: 5m
        labels: {severity: warning}
        annotations:
          summary: "{{ $labels.instance }} at {{ $value | humanize }}"
      - record: job:x:rate5m
        expr: sum by (job) (rate(x_total[5m]))
`

func TestParseRules(t *testing.T) {
	_, qs, err := ParseRules([]byte(goodRules))
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) != 2 || qs[0].Where != "alert A" || qs[0].Expr.Metrics[0] != "x_total" {
		t.Errorf("queries %+v", qs)
	}
	for _, tt := range []struct{ name, from, to string }{
		{"unknown field", "for: 5m", "fore: 5m"},
		{"bad for", "for: 5m", "for: 5 minutes"},
		{"bad expr", "rate(x_total[5m]) > 0", "rate(x_total) > 0"},
		{"scalar expr", "rate(x_total[5m]) > 0", "1"},
		{"bad template", "{{ $value | humanize }}", "{{ $value | humanize }"},
		{"unknown template function", "humanize }}", "humanise }}"},
		{"unknown template variable", "$labels.instance", "$label.instance"},
		{"bad label name", "{severity: warning}", "{sev-erity: warning}"},
		{"alert and record", "- record: job", "- alert: B\n        record: job"},
		{"no name", "- name: g", "- name: \"\""},
	} {
		bad := strings.Replace(goodRules, tt.from, tt.to, 1)
		if bad == goodRules {
			t.Fatalf("%s: %q not in the rules", tt.name, tt.from)
		}
		if _, _, err := ParseRules([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", tt.name)
		}
	}
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
    {"id": 3, "type": "stat", "title": "s", "targets": [{"refId": "A", "expr": "max(y)"}]}
  ]
}`

func TestParseDashboard(t *testing.T) {
	_, qs, err := ParseDashboard([]byte(goodDashboard))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, q := range qs {
		got = append(got, q.Expr.Metrics...)
	}
	if strings.Join(got, " ") != "x_total y up" {
		t.Errorf("metrics %v, want x_total y up", got)
	}
	for _, tt := range []struct{ name, from, to string }{
		{"bad expr", "[$__rate_interval]", "[$__rate_interval"},
		{"range result", "sum(rate(x_total{job=~\\\"$job\\\"}[$__rate_interval]))", "x_total[5m]"},
		{"repeated id", `"id": 3`, `"id": 2`},
		{"repeated refId", `"refId": "A", "expr": "max(y)"}]`, `"refId": "A", "expr": "max(y)"}, {"refId": "A", "expr": "y"}]`},
		{"bad variable", "label_values(up", "label_valuez(up"},
		{"bad JSON", `"uid"`, `uid`},
	} {
		bad := strings.Replace(goodDashboard, tt.from, tt.to, 1)
		if bad == goodDashboard {
			t.Fatalf("%s: %q not in the dashboard", tt.name, tt.from)
		}
		if _, _, err := ParseDashboard([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", tt.name)
		}
	}
}
