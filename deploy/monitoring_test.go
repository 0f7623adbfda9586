// Package deploy_test checks courier's monitoring files, the Grafana
// dashboard and the Prometheus rules, for what can be checked without a
// Prometheus: their shape, the syntax and types of their PromQL
// (internal/promqlcheck: a parser of our own, since Prometheus' is not a
// dependency), that the Kubernetes PrometheusRule carries the same rules,
// and that they follow the dashboard's variables and the docs. That every
// metric and label value they use is served by courier is checked against
// a running courier in cmd/courier (monitoring_test.go).
package deploy_test

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/courierhq/courier/internal/promqlcheck"
)

const (
	rulesFile      = "prometheus/courier-rules.yaml"
	ruleCRFile     = "kubernetes/prometheusrule.yaml"
	dashboardFile  = "grafana/courier.json"
	operationsFile = "../docs/operations.md"
	runbookPrefix  = "https://github.com/courierhq/courier/blob/main/docs/operations.md#"
)

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRules(t *testing.T) {
	rg, qs, err := promqlcheck.ParseRules(read(t, rulesFile))
	if err != nil {
		t.Fatalf("%s:\n%v", rulesFile, err)
	}
	anchors := docAnchors(t)
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
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
	checkDocumented(t, qs)
}

// TestPrometheusRuleMatchesRules: the Kubernetes example's PrometheusRule
// carries exactly the rule file's groups.
func TestPrometheusRuleMatchesRules(t *testing.T) {
	file, _, err := promqlcheck.ParseRules(read(t, rulesFile))
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
		Spec promqlcheck.RuleGroups `yaml:"spec"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(read(t, ruleCRFile))))
	dec.KnownFields(true)
	if err := dec.Decode(&cr); err != nil {
		t.Fatalf("%s: %v", ruleCRFile, err)
	}
	if cr.APIVersion != "monitoring.coreos.com/v1" || cr.Kind != "PrometheusRule" || cr.Metadata.Name == "" {
		t.Errorf("%s: %s %s %q, want a monitoring.coreos.com/v1 PrometheusRule with a name", ruleCRFile, cr.APIVersion, cr.Kind, cr.Metadata.Name)
	}
	if _, err := cr.Spec.Check(); err != nil {
		t.Errorf("%s:\n%v", ruleCRFile, err)
	}
	if !reflect.DeepEqual(cr.Spec, file) {
		t.Errorf("%s's groups differ from %s: copy them over", ruleCRFile, rulesFile)
	}
}

// TestDashboard: the dashboard's queries parse, use the data source and
// instance variables everywhere, and name documented metrics.
func TestDashboard(t *testing.T) {
	d, qs, err := promqlcheck.ParseDashboard(read(t, dashboardFile))
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
	var walk func([]promqlcheck.Panel)
	walk = func(ps []promqlcheck.Panel) {
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
		for _, s := range q.Expr.Selectors {
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

func hasMatcher(s promqlcheck.Selector, label, value string) bool {
	return slices.Contains(s.Matchers, promqlcheck.Matcher{Label: label, Op: "=~", Value: value})
}

// seriesSuffix is what a histogram's or summary's series add to its name.
var seriesSuffix = regexp.MustCompile(`_(bucket|sum|count)$`)

// checkDocumented: every courier_* metric the queries use is in the
// operations guide's metric tables.
func checkDocumented(t *testing.T, qs []promqlcheck.Query) {
	t.Helper()
	doc := string(read(t, operationsFile))
	for _, q := range qs {
		for _, m := range q.Expr.Metrics {
			if !strings.HasPrefix(m, "courier_") {
				continue
			}
			documented := func(name string) bool {
				return strings.Contains(doc, "`"+name+"`") || strings.Contains(doc, "`"+name+"{")
			}
			if !documented(m) && !documented(seriesSuffix.ReplaceAllString(m, "")) {
				t.Errorf("%s: %s is not in docs/operations.md", q.Where, m)
			}
		}
	}
}

// docAnchors returns the GitHub anchors of the operations guide's headings.
func docAnchors(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	for line := range strings.Lines(string(read(t, operationsFile))) {
		h := strings.TrimLeft(line, "#")
		if len(h) == len(line) || !strings.HasPrefix(h, " ") {
			continue
		}
		a := drop.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), "")
		out[strings.ReplaceAll(a, " ", "-")] = true
	}
	return out
}
