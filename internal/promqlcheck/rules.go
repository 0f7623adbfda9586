package promqlcheck

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"text/template"

	"go.yaml.in/yaml/v3"
)

// Query is one PromQL expression found in a file.
type Query struct {
	// Where names it: the alert, or the dashboard panel and target.
	Where string
	// Source is the expression as written; Expr what Parse found in it
	// (with Grafana's interval variables replaced, for a dashboard).
	Source string
	Expr   *Expr
}

// RuleGroups is the content of a Prometheus rule file (and of a
// PrometheusRule's spec).
type RuleGroups struct {
	Groups []RuleGroup `yaml:"groups"`
}

// RuleGroup is one group of rules.
type RuleGroup struct {
	Name        string            `yaml:"name"`
	Interval    string            `yaml:"interval,omitempty"`
	QueryOffset string            `yaml:"query_offset,omitempty"`
	Limit       int               `yaml:"limit,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Rules       []Rule            `yaml:"rules"`
}

// Rule is an alerting or recording rule.
type Rule struct {
	Alert         string            `yaml:"alert,omitempty"`
	Record        string            `yaml:"record,omitempty"`
	Expr          string            `yaml:"expr"`
	For           string            `yaml:"for,omitempty"`
	KeepFiringFor string            `yaml:"keep_firing_for,omitempty"`
	Labels        map[string]string `yaml:"labels,omitempty"`
	Annotations   map[string]string `yaml:"annotations,omitempty"`
}

// ParseRules reads a rule file strictly (an unknown or misspelt field is an
// error, as it is for Prometheus) and checks it: group names present and
// unique, each rule an alert or a record, expressions that parse to an
// instant vector, durations, label names, and annotation templates. It
// returns the groups and every rule's expression.
func ParseRules(data []byte) (RuleGroups, []Query, error) {
	var rg RuleGroups
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&rg); err != nil {
		return rg, nil, fmt.Errorf("rule file: %w", err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return rg, nil, errors.New("rule file: more than one YAML document")
	}
	qs, err := rg.Check()
	return rg, qs, err
}

// Check checks the groups as ParseRules does, returning every problem.
func (rg RuleGroups) Check() ([]Query, error) {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(rg.Groups) == 0 {
		fail("no groups")
	}
	var qs []Query
	groups := map[string]bool{}
	for gi, g := range rg.Groups {
		if g.Name == "" {
			fail("group %d: no name", gi+1)
		}
		if groups[g.Name] {
			fail("group %q: name used twice", g.Name)
		}
		groups[g.Name] = true
		for _, d := range []string{g.Interval, g.QueryOffset} {
			if d != "" && !isDuration(d) {
				fail("group %q: bad duration %q", g.Name, d)
			}
		}
		checkLabels(fail, "group "+g.Name, g.Labels)
		if len(g.Rules) == 0 {
			fail("group %q: no rules", g.Name)
		}
		for ri, r := range g.Rules {
			where := fmt.Sprintf("group %q rule %d", g.Name, ri+1)
			switch {
			case r.Alert != "" && r.Record != "":
				fail("%s: both alert and record", where)
			case r.Alert != "":
				where = "alert " + r.Alert
			case r.Record != "":
				where = "record " + r.Record
				if !metricNameRe.MatchString(r.Record) {
					fail("%s: not a valid metric name", where)
				}
				if r.For != "" || r.KeepFiringFor != "" || len(r.Annotations) > 0 {
					fail("%s: for, keep_firing_for and annotations are for alerts", where)
				}
			default:
				fail("%s: neither alert nor record", where)
			}
			for _, d := range []string{r.For, r.KeepFiringFor} {
				if d != "" && !isDuration(d) {
					fail("%s: bad duration %q", where, d)
				}
			}
			checkLabels(fail, where, r.Labels)
			for k, v := range r.Annotations {
				if !labelNameRe.MatchString(k) {
					fail("%s: bad annotation name %q", where, k)
				}
				if err := checkTemplate(v); err != nil {
					fail("%s: annotation %s: %v", where, k, err)
				}
			}
			for k, v := range r.Labels {
				if err := checkTemplate(v); err != nil {
					fail("%s: label %s: %v", where, k, err)
				}
			}
			e, err := Parse(r.Expr)
			switch {
			case err != nil:
				fail("%s: expr: %v", where, err)
			case e.Type != Vector:
				fail("%s: expr is a %s, want an instant vector", where, e.Type)
			default:
				qs = append(qs, Query{Where: where, Source: r.Expr, Expr: e})
			}
		}
	}
	return qs, errors.Join(errs...)
}

func checkLabels(fail func(string, ...any), where string, labels map[string]string) {
	for k := range labels {
		if !labelNameRe.MatchString(k) {
			fail("%s: bad label name %q", where, k)
		}
	}
}

// isDuration reports whether s is a Prometheus duration such as 5m or 1h30m.
func isDuration(s string) bool { return durationRe.FindString(s) == s }

// templateFuncs are the functions Prometheus offers alert templates; only
// their names matter here, for parsing.
var templateFuncs = template.FuncMap{}

func init() {
	for _, n := range []string{"query", "first", "label", "value", "strvalue", "args", "reReplaceAll",
		"safeHtml", "match", "title", "toUpper", "toLower", "graphLink", "tableLink", "sortByLabel",
		"humanize", "humanize1024", "humanizeDuration", "humanizePercentage", "humanizeTimestamp",
		"toTime", "toDuration", "now", "pathPrefix", "externalURL", "parseDuration", "stripPort",
		"stripDomain", "urlQueryEscape"} {
		templateFuncs[n] = func(...any) any { return nil }
	}
}

// templateDefs are the variables Prometheus defines before expanding an
// alert's labels and annotations.
const templateDefs = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"

var (
	templateActionRe = regexp.MustCompile(`(?s){{.*?}}`)
	templateVarRe    = regexp.MustCompile(`\$([a-zA-Z_][a-zA-Z0-9_]*)`)
)

// checkTemplate parses an alert label or annotation as Prometheus would.
func checkTemplate(s string) error {
	_, err := template.New("t").Option("missingkey=zero").Funcs(templateFuncs).Parse(templateDefs + s)
	if err != nil {
		return err
	}
	// $labels.x, $value, $externalLabels.x, $externalURL only.
	for _, action := range templateActionRe.FindAllString(s, -1) {
		for _, m := range templateVarRe.FindAllStringSubmatch(action, -1) {
			switch m[1] {
			case "labels", "value", "externalLabels", "externalURL":
			default:
				return fmt.Errorf("unknown template variable $%s", m[1])
			}
		}
	}
	return nil
}
