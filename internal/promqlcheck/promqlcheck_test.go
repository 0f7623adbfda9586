package promqlcheck

import (
	"slices"
	"testing"
)

func TestParseValid(t *testing.T) {
	for _, tt := range []struct {
		expr    string
		typ     Type
		metrics []string
	}{
		{`up`, Vector, []string{"up"}},
		{`1`, Scalar, nil},
		{`-1.5e3 + 0x1f`, Scalar, nil},
		{`sum by (outcome) (rate(courier_messages_total{job="x"}[5m]))`, Vector, []string{"courier_messages_total"}},
		{`sum(rate(courier_messages_total[5m])) by (outcome)`, Vector, []string{"courier_messages_total"}},
		{`histogram_quantile(0.99, sum by (le, result) (rate(courier_app_request_duration_seconds_bucket{pod=~"$pod"}[5m])))`,
			Vector, []string{"courier_app_request_duration_seconds_bucket"}},
		{`increase(courier_dead_letters_total[15m]) > 0 or delta(courier_dead_letters_stored[15m]) > 0`,
			Vector, []string{"courier_dead_letters_stored", "courier_dead_letters_total"}},
		{`max without (instance, pod) (courier_consumer_pending_messages) > 1000`, Vector, []string{"courier_consumer_pending_messages"}},
		{`a / on (pod) group_left (version) b`, Vector, []string{"a", "b"}},
		{`a > bool 1`, Vector, []string{"a"}},
		{`1 < bool 2`, Scalar, nil},
		{`{__name__="courier_build_info", version!=""}`, Vector, []string{"courier_build_info"}},
		{`deriv(courier_consumer_pending_messages[30m]) > 0 # growing`, Vector, []string{"courier_consumer_pending_messages"}},
		{`max_over_time(rate(x[1m])[10m:30s])`, Vector, []string{"x"}},
		{`x offset 5m`, Vector, []string{"x"}},
		{`label_replace(x, "a", "$1", "b", "(.*)")`, Vector, []string{"x"}},
		{`2 ^ 3 ^ 2`, Scalar, nil},
		{`-x ^ 2`, Vector, []string{"x"}},
		{`time() - x`, Vector, []string{"x"}},
		{`topk(5, x)`, Vector, []string{"x"}},
		{`absent(x{a='b'})`, Vector, []string{"x"}},
		{`clamp_min(x, 0)`, Vector, []string{"x"}},
		{`job:x:rate5m`, Vector, []string{"job:x:rate5m"}},
		{`x{a="b",}`, Vector, []string{"x"}},
		{`x unless on() y`, Vector, []string{"x", "y"}},
		{`x[5m]`, Matrix, []string{"x"}}, // valid; callers check the type they need
		{`x{} + 1`, Vector, []string{"x"}},
	} {
		e, err := Parse(tt.expr)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.expr, err)
			continue
		}
		if e.Type != tt.typ || !slices.Equal(e.Metrics, tt.metrics) {
			t.Errorf("Parse(%q) = %v %v, want %v %v", tt.expr, e.Type, e.Metrics, tt.typ, tt.metrics)
		}
	}
}

func TestParseInvalid(t *testing.T) {
	for _, expr := range []string{
		``,
		`rate(x)`,                    // instant vector where a range is needed
		`rate(x[5m]`,                 // unbalanced
		`sum(rate(x[5m])))`,          // unbalanced
		`ratee(x[5m])`,               // unknown function
		`histogram_quantile(x, 0.9)`, // arguments swapped
		`histogram_quantile(0.9)`,    // too few
		`sum by (a) x`,               // aggregation without parentheses
		`x{a=b}`,                     // unquoted value
		`x{a~"b"}`,                   // bad operator
		`x{a=~"("}`,                  // bad regexp
		`x{a="b"`,                    // unterminated
		`x{"a"="b"}`,                 // label name quoted (Prometheus 3 UTF-8 syntax not accepted)
		`1 and 2`,                    // set operator between scalars
		`1 > 2`,                      // comparison between scalars without bool
		`x + on(a) 1`,                // matching with a scalar
		`x and on(a) group_left y`,   // group_left with a set operator
		`rate(x[5m])[5m]`,            // range of a non-selector
		`x[5]`,                       // range without a unit
		`{}`,                         // empty selector
		`"a" + 1`,                    // string in arithmetic
		`x +`,                        // dangling operator
		`sum by (a) by (b) (x)`,      // grouping twice
		`x y`,                        // two expressions
		`x{a="\q"}`,                  // bad escape
		`quantile_over_time(x[5m], 0.5)`,
	} {
		if e, err := Parse(expr); err == nil {
			t.Errorf("Parse(%q) = %v %v, want an error", expr, e.Type, e.Metrics)
		}
	}
}

func TestParseSelectors(t *testing.T) {
	e, err := Parse(`sum(rate(a{x="1", y=~"2|3"}[5m])) / on() {__name__="b"} + c`)
	if err != nil {
		t.Fatal(err)
	}
	want := []Selector{
		{Metric: "a", Matchers: []Matcher{{"x", "=", "1"}, {"y", "=~", "2|3"}}},
		{Metric: "b"},
		{Metric: "c"},
	}
	if len(e.Selectors) != len(want) {
		t.Fatalf("selectors %+v, want %+v", e.Selectors, want)
	}
	for i, s := range e.Selectors {
		if s.Metric != want[i].Metric || !slices.Equal(s.Matchers, want[i].Matchers) {
			t.Errorf("selector %d = %+v, want %+v", i, s, want[i])
		}
	}
}
