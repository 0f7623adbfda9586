package promcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
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
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *DatasourceRef `json:"datasource"`
	Targets    []Target       `json:"targets"`
	Panels     []Panel        `json:"panels"`
}

// DatasourceRef names a panel's or target's data source.
type DatasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// Target is one query of a panel.
type Target struct {
	RefID      string         `json:"refId"`
	Expr       string         `json:"expr"`
	Datasource *DatasourceRef `json:"datasource"`
}

// Variable is a templating variable.
type Variable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"` // a string, or an object with "query"
	// IncludeAll offers All, which stands for AllValue (or, without one,
	// every value the query found).
	IncludeAll bool   `json:"includeAll"`
	AllValue   string `json:"allValue"`
	Multi      bool   `json:"multi"`
}

// grafanaIntervals are Grafana's interval variables, replaced by a
// duration before parsing (Grafana does the same before it sends a query).
var grafanaIntervals = strings.NewReplacer(
	"${__rate_interval}", "5m", "$__rate_interval", "5m",
	"${__interval}", "1m", "$__interval", "1m",
	"${__range}", "1h", "$__range", "1h",
)

// variableQueryRe matches the Prometheus data source's variable queries
// label_values(selector, label), label_values(label), query_result(expr),
// metrics(regexp) and label_names().
var variableQueryRe = regexp.MustCompile(`(?s)^\s*(label_values|query_result|metrics|label_names)\((.*)\)\s*$`)

// CheckDashboard reads a Grafana dashboard and checks its queries with
// Prometheus's parser: every panel's targets (rows' panels included), each
// an instant vector or a scalar, and every query variable's selector or
// expression. Grafana's interval variables ($__rate_interval and the like)
// are replaced by a duration; other variables are left as written, so
// they must stand where a string may (inside a label matcher's quotes).
// Panel ids must be unique, and each panel's refIds. It returns the
// dashboard, every query, and every problem found.
func CheckDashboard(data []byte) (Dashboard, []Query, error) {
	var d Dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		return d, nil, fmt.Errorf("dashboard: %w", err)
	}
	c := dashboardChecker{p: newParser(), ids: map[int]bool{}}
	if d.UID == "" || d.Title == "" {
		c.fail("dashboard without uid or title")
	}
	c.panels(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			c.variable(v)
		}
	}
	return d, c.qs, errors.Join(c.errs...)
}

type dashboardChecker struct {
	p    parser.Parser
	ids  map[int]bool
	qs   []Query
	errs []error
}

func (c *dashboardChecker) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// add parses src and keeps it as a query if its type is one of want.
func (c *dashboardChecker) add(where, src string, want ...parser.ValueType) {
	e, err := c.p.ParseExpr(grafanaIntervals.Replace(src))
	switch {
	case err != nil:
		c.fail("%s: %v", where, err)
	case !slices.Contains(want, e.Type()):
		c.fail("%s: %s is a %s, want %v", where, src, e.Type(), want)
	default:
		c.qs = append(c.qs, Query{Where: where, Source: src, Expr: e})
	}
}

func (c *dashboardChecker) panels(ps []Panel) {
	for _, p := range ps {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if c.ids[p.ID] {
			c.fail("%s: id used twice", where)
		}
		c.ids[p.ID] = true
		if p.Title == "" {
			c.fail("%s: no title", where)
		}
		refs := map[string]bool{}
		for _, t := range p.Targets {
			tw := where + " target " + t.RefID
			if t.RefID == "" || refs[t.RefID] {
				c.fail("%s: missing or repeated refId", tw)
			}
			refs[t.RefID] = true
			if strings.TrimSpace(t.Expr) == "" {
				c.fail("%s: no expr", tw)
				continue
			}
			c.add(tw, t.Expr, parser.ValueTypeVector, parser.ValueTypeScalar)
		}
		c.panels(p.Panels)
	}
}

func (c *dashboardChecker) variable(v Variable) {
	where := "variable " + v.Name
	q, err := variableQuery(v.Query)
	if err != nil {
		c.fail("%s: %v", where, err)
		return
	}
	m := variableQueryRe.FindStringSubmatch(q)
	if m == nil {
		c.fail("%s: query %q is none of label_values(), query_result(), metrics(), label_names()", where, q)
		return
	}
	switch args := m[2]; m[1] {
	case "label_values":
		sel, label, ok := cutLast(args, ",")
		if !ok {
			label = sel
		}
		if !model.LegacyValidation.IsValidLabelName(strings.TrimSpace(label)) {
			c.fail("%s: bad label %q", where, label)
		}
		if ok {
			c.add(where, sel, parser.ValueTypeVector)
		}
	case "query_result":
		c.add(where, args, parser.ValueTypeVector, parser.ValueTypeScalar)
	}
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

// cutLast cuts s around the last sep outside brackets and quotes.
func cutLast(s, sep string) (before, after string, found bool) {
	depth, quote := 0, byte(0)
	last := -1
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; {
		case quote != 0:
			if ch == '\\' {
				i++
			} else if ch == quote {
				quote = 0
			}
		case ch == '"' || ch == '\'' || ch == '`':
			quote = ch
		case ch == '{' || ch == '(' || ch == '[':
			depth++
		case ch == '}' || ch == ')' || ch == ']':
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
