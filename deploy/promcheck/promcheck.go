// Package promcheck checks courier's monitoring files, the Grafana dashboard
// (deploy/grafana/courier.json) and the Prometheus rules
// (deploy/prometheus/courier-rules.yaml), with Prometheus's own rule-file
// reader and PromQL parser (model/rulefmt and promql/parser, what
// `promtool check rules` runs). It is a Go module of its own so that
// courier's module does not carry Prometheus's dependencies; .ci/run runs
// its tests.
//
// The vector selectors the files' expressions use are written to
// selectors.json (TestSelectorsFile keeps it in step with the files), and
// courier's module reads that file to check, against a running courier,
// that every metric and label value they select is served
// (cmd/courier/monitoring_test.go).
package promcheck

import (
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// Query is one PromQL expression found in a file.
type Query struct {
	// Where names it: the alert or record, or the dashboard panel and
	// target, or the variable.
	Where string
	// Source is the expression as written; Expr is what the parser made of
	// it (with Grafana's interval variables replaced, for a dashboard).
	Source string
	Expr   parser.Expr
}

// Selector is one vector selector of a query.
type Selector struct {
	// Where is the Where of its query.
	Where string `json:"where"`
	// Metric is the metric name it selects ("" if only labels select).
	Metric string `json:"metric"`
	// Matchers are its label matchers other than the metric name's.
	Matchers []Matcher `json:"matchers,omitempty"`
}

// Matcher is one label matcher; Op is =, !=, =~ or !~, Value unquoted.
type Matcher struct {
	Label string `json:"label"`
	Op    string `json:"op"`
	Value string `json:"value"`
}

// newParser returns the parser Prometheus uses by default: experimental
// functions off, so what parses runs on a stock Prometheus.
func newParser() parser.Parser { return parser.NewParser(parser.Options{}) }

// Selectors returns the vector selectors of q, in the order they appear
// (a range's or subquery's included).
func (q Query) Selectors() []Selector {
	var out []Selector
	parser.Inspect(q.Expr, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := Selector{Where: q.Where, Metric: vs.Name}
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				if m.Type == labels.MatchEqual {
					s.Metric = m.Value
				}
				continue
			}
			s.Matchers = append(s.Matchers, Matcher{Label: m.Name, Op: m.Type.String(), Value: m.Value})
		}
		out = append(out, s)
		return nil
	})
	return out
}
