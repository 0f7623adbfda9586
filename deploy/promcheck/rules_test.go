package promcheck

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

// TestRules: the rule file reads as Prometheus reads it, every alert has a
// severity, a summary, a description and a runbook that is its own section
// of docs/operations.md, and every metric it selects is documented.
func TestRules(t *testing.T) {
	rg, qs, err := CheckRules(read(t, rulesFile))
	if err != nil {
		t.Fatalf("%s:\n%v", rulesFile, err)
	}
	anchors := docAnchors(t)
	alerts := 0
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
				t.Errorf("alert %s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("alert %s: no %s annotation", r.Alert, a)
				}
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookPrefix)
			if !ok || !anchors[anchor] {
				t.Errorf("alert %s: runbook_url %q is not a heading of docs/operations.md (want %s<heading>)", r.Alert, r.Annotations["runbook_url"], runbookPrefix)
			}
			if want := strings.ToLower(r.Alert); anchor != want {
				t.Errorf("alert %s: runbook anchor %q, want its own section %q", r.Alert, anchor, want)
			}
		}
	}
	if alerts < 5 || len(qs) < alerts {
		t.Errorf("%d alerts, %d expressions: the file was not read whole", alerts, len(qs))
	}
	checkDocumented(t, qs)
}

// TestPrometheusRuleMatchesRules: the Kubernetes example's PrometheusRule
// carries exactly the rule file's groups, and they read as a rule file.
func TestPrometheusRuleMatchesRules(t *testing.T) {
	file, _, err := CheckRules(read(t, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	var cr struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name   string            `yaml:"name"`
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec yaml.Node `yaml:"spec"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(read(t, ruleCRFile))))
	dec.KnownFields(true)
	if err := dec.Decode(&cr); err != nil {
		t.Fatalf("%s: %v", ruleCRFile, err)
	}
	if cr.APIVersion != "monitoring.coreos.com/v1" || cr.Kind != "PrometheusRule" || cr.Metadata.Name == "" {
		t.Errorf("%s: %s %s %q, want a monitoring.coreos.com/v1 PrometheusRule with a name", ruleCRFile, cr.APIVersion, cr.Kind, cr.Metadata.Name)
	}
	spec, err := yaml.Marshal(&cr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	crGroups, _, err := CheckRules(spec)
	if err != nil {
		t.Fatalf("%s's spec:\n%v", ruleCRFile, err)
	}
	if !reflect.DeepEqual(crGroups, file) {
		t.Errorf("%s's groups differ from %s: copy them over", ruleCRFile, rulesFile)
	}
}

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
        expr: sum by (job) (rate(x_total{a="b"}[5m]))
`

// TestCheckRulesRejects: each way a rule file can be wrong is reported.
func TestCheckRulesRejects(t *testing.T) {
	_, qs, err := CheckRules([]byte(goodRules))
	if err != nil {
		t.Fatal(err)
	}
	var got []Selector
	for _, q := range qs {
		got = append(got, q.Selectors()...)
	}
	want := []Selector{
		{Where: "alert A", Metric: "x_total"},
		{Where: "record job:x:rate5m", Metric: "x_total", Matchers: []Matcher{{Label: "a", Op: "=", Value: "b"}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("selectors %+v, want %+v", got, want)
	}
	for _, tt := range []struct{ name, from, to string }{
		{"unknown field", "for: 5m", "fore: 5m"},
		{"bad for", "for: 5m", "for: 5 minutes"},
		{"rate of an instant vector", "rate(x_total[5m]) > 0", "rate(x_total) > 0"},
		{"unknown function", "rate(x_total[5m]) > 0", "rat(x_total[5m]) > 0"},
		{"scalar expr", "rate(x_total[5m]) > 0", "1"},
		{"bad template", "{{ $value | humanize }}", "{{ $value | humanize }"},
		{"unknown template function", "humanize }}", "humanise }}"},
		{"unknown template variable", "$labels.instance", "$label.instance"},
		{"bad label name", "{severity: warning}", "{sev-erity: warning}"},
		{"alert and record", "- record: job", "- alert: B\n        record: job"},
		{"no name", "- name: g", "- name: \"\""},
		{"no rules", "    rules:\n      - alert: A", "    rules: []\n  - name: h\n    rules:\n      - alert: A"},
		{"second document", "groups:", "groups: []\n---\ngroups:"},
	} {
		bad := strings.Replace(goodRules, tt.from, tt.to, 1)
		if bad == goodRules {
			t.Fatalf("%s: %q not in the rules", tt.name, tt.from)
		}
		if _, _, err := CheckRules([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", tt.name)
		} else {
			t.Logf("%s: %v", tt.name, err)
		}
	}
}

// TestRulesKeepSubscriptions: no rule merges the subscriptions of a courier
// serving several, whose metrics of a message's path carry a subscription
// label (a courier of one carries none): every aggregation keeps the labels
// it does not name (without), or names subscription among those it keeps,
// and no vector matching ignores it or leaves it out, so an alert on one
// subscription names it and another's traffic does not hide it.
func TestRulesKeepSubscriptions(t *testing.T) {
	_, qs, err := CheckRules(read(t, rulesFile))
	if err != nil {
		t.Fatalf("%s:\n%v", rulesFile, err)
	}
	for _, p := range subscriptionsMerged(qs) {
		t.Error(p)
	}
	// The check itself: each of these merges subscriptions.
	p := newParser()
	for _, src := range []string{
		`sum by (stream) (rate(courier_messages_total[5m])) > 0`,
		`sum(rate(courier_messages_total[5m])) > 0`,
		`sum without (subscription) (rate(courier_messages_total[5m])) > 0`,
		`rate(courier_messages_total{outcome="retried"}[5m]) / on (instance) rate(courier_app_requests_total[5m])`,
		`rate(courier_messages_total{outcome="retried"}[5m]) / ignoring (subscription, outcome) rate(courier_app_requests_total[5m])`,
	} {
		e, err := p.ParseExpr(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if len(subscriptionsMerged([]Query{{Where: "test", Source: src, Expr: e}})) == 0 {
			t.Errorf("%s merges subscriptions, but is not reported", src)
		}
	}
}

// subscriptionsMerged describes each aggregation and vector matching of qs
// that leaves out the subscription label.
func subscriptionsMerged(qs []Query) []string {
	var out []string
	for _, q := range qs {
		parser.Inspect(q.Expr, func(n parser.Node, _ []parser.Node) error {
			switch n := n.(type) {
			case *parser.AggregateExpr:
				if n.Without == slices.Contains(n.Grouping, "subscription") {
					out = append(out, fmt.Sprintf("%s: %s leaves out the subscription label: use without (...), which keeps it", q.Where, n))
				}
			case *parser.BinaryExpr:
				if vm := n.VectorMatching; vm != nil && (vm.On || len(vm.MatchingLabels) > 0) && vm.On != slices.Contains(vm.MatchingLabels, "subscription") {
					out = append(out, fmt.Sprintf("%s: %s matches its sides without the subscription label", q.Where, n))
				}
			}
			return nil
		})
	}
	return out
}
