package promqlcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Dashboard is the part of a Grafana dashboard's JSON model that holds
// queries.
type Dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []Panel `json:"panels"`
	Templating struct {
		List []Variable `json:"list"`
	} `json:"templating"`
}

// Panel is a dashboard panel; a row may hold panels of its own.
type Panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource *DatasourceRef  `json:"datasource"`
	Targets    []Target        `json:"targets"`
	Panels     []Panel         `json:"panels"`
	GridPos    json.RawMessage `json:"gridPos"`
}

// DatasourceRef names a panel's or target's data source.
type DatasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// Target is one query of a panel.
type Target struct {
	RefID        string         `json:"refId"`
	Expr         string         `json:"expr"`
	LegendFormat string         `json:"legendFormat"`
	Datasource   *DatasourceRef `json:"datasource"`
}

// Variable is a templating variable.
type Variable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"` // a string, or an object with "query"
}

// grafanaIntervals are Grafana's interval variables, replaced by a
// duration before parsing.
var grafanaIntervals = strings.NewReplacer(
	"${__rate_interval}", "5m", "$__rate_interval", "5m",
	"${__interval}", "1m", "$__interval", "1m",
	"${__range}", "1h", "$__range", "1h",
)

// variableQueryRe matches the Prometheus data source's variable queries
// label_values(selector, label), label_values(label) and
// query_result(expr).
var variableQueryRe = regexp.MustCompile(`(?s)^\s*(label_values|query_result|metrics|label_names)\((.*)\)\s*$`)

// ParseDashboard reads a Grafana dashboard and checks its queries: every
// panel's targets (rows included) and every query variable. Grafana's
// interval variables ($__rate_interval and the like) are replaced by a
// duration; other variables are left as written, so they must stand where
// a string may (inside a label matcher's quotes). Panels ids must be
// unique, and each panel's refIds.
func ParseDashboard(data []byte) (Dashboard, []Query, error) {
	var d Dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		return d, nil, fmt.Errorf("dashboard: %w", err)
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if d.UID == "" || d.Title == "" {
		fail("dashboard without uid or title")
	}
	var qs []Query
	add := func(where, src string, want ...Type) {
		e, err := Parse(grafanaIntervals.Replace(src))
		switch {
		case err != nil:
			fail("%s: %v", where, err)
		case len(want) > 0 && !typeIn(e.Type, want):
			fail("%s: %s is a %s", where, src, e.Type)
		default:
			qs = append(qs, Query{Where: where, Source: src, Expr: e})
		}
	}
	ids := map[int]bool{}
	var walk func(ps []Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
			if ids[p.ID] {
				fail("%s: id used twice", where)
			}
			ids[p.ID] = true
			if p.Title == "" {
				fail("%s: no title", where)
			}
			refs := map[string]bool{}
			for _, t := range p.Targets {
				tw := where + " target " + t.RefID
				if t.RefID == "" || refs[t.RefID] {
					fail("%s: missing or repeated refId", tw)
				}
				refs[t.RefID] = true
				if strings.TrimSpace(t.Expr) == "" {
					fail("%s: no expr", tw)
					continue
				}
				add(tw, t.Expr, Vector, Scalar)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		where := "variable " + v.Name
		q, err := variableQuery(v.Query)
		if err != nil {
			fail("%s: %v", where, err)
			continue
		}
		m := variableQueryRe.FindStringSubmatch(q)
		if m == nil {
			fail("%s: query %q is none of label_values(), query_result(), metrics(), label_names()", where, q)
			continue
		}
		switch args := m[2]; m[1] {
		case "label_values":
			sel, label, ok := cutLast(args, ",")
			if !ok {
				if !labelNameRe.MatchString(strings.TrimSpace(args)) {
					fail("%s: bad label %q", where, args)
				}
				continue
			}
			if !labelNameRe.MatchString(strings.TrimSpace(label)) {
				fail("%s: bad label %q", where, label)
			}
			add(where, sel, Vector)
		case "query_result":
			add(where, args, Vector, Scalar)
		}
	}
	return d, qs, errors.Join(errs...)
}

func typeIn(t Type, ts []Type) bool {
	for _, x := range ts {
		if t == x {
			return true
		}
	}
	return false
}

// variableQuery returns a variable's query, written as a string or as the
// Prometheus data source's query object.
func variableQuery(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var o struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", fmt.Errorf("query: %w", err)
	}
	return o.Query, nil
}

// cutLast cuts s around the last sep outside braces and quotes.
func cutLast(s, sep string) (before, after string, found bool) {
	depth, quote := 0, byte(0)
	last := -1
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'' || c == '`':
			quote = c
		case c == '{' || c == '(' || c == '[':
			depth++
		case c == '}' || c == ')' || c == ']':
			depth--
		case depth == 0 && strings.HasPrefix(s[i:], sep):
			last = i
		}
	}
	if last < 0 {
		return s, "", false
	}
	return s[:last], s[last+len(sep):], true
}
