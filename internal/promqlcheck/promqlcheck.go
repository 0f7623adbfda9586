// Package promqlcheck checks PromQL expressions without Prometheus' own
// parser (github.com/prometheus/prometheus is too large a dependency for
// that): a lexer and a recursive-descent parser of the PromQL grammar with
// the types of its values (scalar, instant vector, range vector, string).
// It catches a syntax error, an unknown function or aggregation, a wrong
// number or type of arguments (rate() of an instant vector, a range where a
// scalar is needed), a bad label matcher or regular expression, a set
// operator between scalars, and it lists the metric names an expression
// selects.
//
// It is narrower than Prometheus in known ways: only the functions in the
// table below are known (a valid but unlisted one is reported as unknown),
// experimental syntax (native histogram literals, duration arithmetic,
// "info" and "limitk") is not accepted, and a selector is not checked for
// matching at least one non-empty value. Use it for courier's own
// dashboards and rules, and add to the table what they come to need.
package promqlcheck

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Type is the type of a PromQL value.
type Type int

// The PromQL value types.
const (
	Scalar Type = iota
	Vector      // instant vector
	Matrix      // range vector
	String
)

func (t Type) String() string {
	return [...]string{"scalar", "instant vector", "range vector", "string"}[t]
}

// Expr is what Parse found in an expression.
type Expr struct {
	// Type is the expression's result type.
	Type Type
	// Metrics are the metric names its selectors select, sorted, once
	// each.
	Metrics []string
	// Selectors are its vector selectors, in order.
	Selectors []Selector
}

// Selector is one vector selector: a metric name (empty if only matchers
// select) and its label matchers.
type Selector struct {
	Metric   string
	Matchers []Matcher
}

// Matcher is one label matcher; Op is =, !=, =~ or !~, Value unquoted.
type Matcher struct {
	Label, Op, Value string
}

// Parse checks expr and returns its type and the metric names it selects.
func Parse(expr string) (*Expr, error) {
	toks, err := lex(expr)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks, metrics: map[string]bool{}}
	t, err := p.expr(0)
	if err == nil && p.peek().kind != tEOF {
		err = p.errorf("unexpected %q after the expression", p.peek().text)
	}
	if err != nil {
		return nil, err
	}
	e := &Expr{Type: t, Selectors: p.selectors}
	for m := range p.metrics {
		e.Metrics = append(e.Metrics, m)
	}
	slices.Sort(e.Metrics)
	return e, nil
}

type parser struct {
	toks      []token
	i         int
	metrics   map[string]bool
	selectors []Selector
}

func (p *parser) peek() token { return p.toks[p.i] }
func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tEOF {
		p.i++
	}
	return t
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("at %d: %s", p.peek().pos, fmt.Sprintf(format, args...))
}

func (p *parser) expect(k kind, what string) (token, error) {
	if p.peek().kind != k {
		return token{}, p.errorf("want %s, got %q", what, p.peek().text)
	}
	return p.next(), nil
}

// Binary operators by precedence, lowest first.
var precedence = map[string]int{
	"or": 1, "and": 2, "unless": 2,
	"==": 3, "!=": 3, "<=": 3, "<": 3, ">=": 3, ">": 3,
	"+": 4, "-": 4, "*": 5, "/": 5, "%": 5, "atan2": 5, "^": 6,
}

func isComparison(op string) bool { return precedence[op] == 3 }
func isSet(op string) bool        { return op == "and" || op == "or" || op == "unless" }

// binaryOp returns the binary operator at the parser's position, if any.
func (p *parser) binaryOp() (string, bool) {
	t := p.peek()
	if t.kind != tOp && t.kind != tIdent {
		return "", false
	}
	_, ok := precedence[t.text]
	return t.text, ok
}

// expr parses a chain of binary operations whose operators bind tighter
// than minPrec (precedence climbing; ^ is right-associative).
func (p *parser) expr(minPrec int) (Type, error) {
	lhs, err := p.unary()
	if err != nil {
		return 0, err
	}
	for {
		op, ok := p.binaryOp()
		if !ok || precedence[op] <= minPrec {
			return lhs, nil
		}
		p.next()
		boolMod, matching, err := p.binaryModifiers(op)
		if err != nil {
			return 0, err
		}
		next := precedence[op]
		if op == "^" {
			next-- // right-associative
		}
		rhs, err := p.expr(next)
		if err != nil {
			return 0, err
		}
		if lhs, err = p.binaryType(op, lhs, rhs, boolMod, matching); err != nil {
			return 0, err
		}
	}
}

// binaryModifiers parses bool, on/ignoring(...) and group_left/right(...).
func (p *parser) binaryModifiers(op string) (boolMod, matching bool, err error) {
	if p.peek().kind == tIdent && p.peek().text == "bool" {
		if !isComparison(op) {
			return false, false, p.errorf("bool modifier on %q, which is not a comparison", op)
		}
		p.next()
		boolMod = true
	}
	if t := p.peek(); t.kind == tIdent && (t.text == "on" || t.text == "ignoring") {
		p.next()
		if err := p.labelList(); err != nil {
			return false, false, err
		}
		matching = true
		if t := p.peek(); t.kind == tIdent && (t.text == "group_left" || t.text == "group_right") {
			if isSet(op) {
				return false, false, p.errorf("%s with the set operator %q", t.text, op)
			}
			p.next()
			if p.peek().kind == tLParen {
				if err := p.labelList(); err != nil {
					return false, false, err
				}
			}
		}
	}
	return boolMod, matching, nil
}

func (p *parser) binaryType(op string, l, r Type, boolMod, matching bool) (Type, error) {
	for _, t := range []Type{l, r} {
		if t != Scalar && t != Vector {
			return 0, p.errorf("operator %q on a %s", op, t)
		}
	}
	switch {
	case isSet(op) && (l != Vector || r != Vector):
		return 0, p.errorf("set operator %q needs instant vectors on both sides", op)
	case matching && (l != Vector || r != Vector):
		return 0, p.errorf("vector matching with %q needs instant vectors on both sides", op)
	case isComparison(op) && l == Scalar && r == Scalar && !boolMod:
		return 0, p.errorf("comparison %q between scalars needs bool", op)
	case l == Scalar && r == Scalar:
		return Scalar, nil
	}
	return Vector, nil
}

func (p *parser) unary() (Type, error) {
	if t := p.peek(); t.kind == tOp && (t.text == "-" || t.text == "+") {
		p.next()
		// Unary minus binds tighter than ^'s left side in PromQL only
		// for literals; for the checks here the operand's type suffices.
		typ, err := p.expr(precedence["^"] - 1)
		if err != nil {
			return 0, err
		}
		if typ != Scalar && typ != Vector {
			return 0, p.errorf("unary %q on a %s", t.text, typ)
		}
		return typ, nil
	}
	typ, err := p.primary()
	if err != nil {
		return 0, err
	}
	return p.postfix(typ)
}

// postfix parses what may follow a value: a range or subquery, offset, @.
func (p *parser) postfix(typ Type) (Type, error) {
	for {
		switch t := p.peek(); {
		case t.kind == tLBrack:
			p.next()
			if _, err := p.expect(tDuration, "a duration"); err != nil {
				return 0, err
			}
			sub := false
			if p.peek().kind == tColon {
				p.next()
				sub = true
				if p.peek().kind == tDuration {
					p.next()
				}
			}
			if _, err := p.expect(tRBrack, `"]"`); err != nil {
				return 0, err
			}
			switch {
			case sub && typ != Vector:
				return 0, p.errorf("subquery of a %s", typ)
			case !sub && (typ != Vector || !p.lastWasSelector()):
				return 0, p.errorf("range of something other than a vector selector (use a subquery [d:])")
			}
			typ = Matrix
		case t.kind == tIdent && t.text == "offset":
			p.next()
			if p.peek().kind == tOp && p.peek().text == "-" {
				p.next()
			}
			if _, err := p.expect(tDuration, "a duration after offset"); err != nil {
				return 0, err
			}
		case t.kind == tAt:
			p.next()
			switch n := p.next(); {
			case n.kind == tNumber:
			case n.kind == tIdent && (n.text == "start" || n.text == "end"):
				if _, err := p.expect(tLParen, `"("`); err != nil {
					return 0, err
				}
				if _, err := p.expect(tRParen, `")"`); err != nil {
					return 0, err
				}
			default:
				return 0, p.errorf("bad @ modifier")
			}
		default:
			return typ, nil
		}
	}
}

// lastWasSelector reports whether the token before "[" ends a vector
// selector: a metric name or a "}" of its matchers (not a ")").
func (p *parser) lastWasSelector() bool {
	// The "[", duration, and "]" were consumed: look before them.
	j := p.i - 1
	for j >= 0 && p.toks[j].kind != tLBrack {
		j--
	}
	if j < 1 {
		return false
	}
	prev := p.toks[j-1]
	return prev.kind == tIdent || prev.kind == tRBrace
}

func (p *parser) primary() (Type, error) {
	t := p.peek()
	switch t.kind {
	case tNumber:
		p.next()
		return Scalar, nil
	case tString:
		p.next()
		if _, err := unquote(t.text); err != nil {
			return 0, p.errorf("bad string %s: %v", t.text, err)
		}
		return String, nil
	case tLParen:
		p.next()
		typ, err := p.expr(0)
		if err != nil {
			return 0, err
		}
		if _, err := p.expect(tRParen, `")"`); err != nil {
			return 0, err
		}
		return typ, nil
	case tLBrace:
		return Vector, p.selector("")
	case tIdent:
		switch low := strings.ToLower(t.text); {
		case low == "inf" || low == "nan":
			p.next()
			return Scalar, nil
		case aggregations[t.text] != nil:
			return p.aggregation()
		case p.toks[p.i+1].kind == tLParen:
			return p.call()
		case keywords[t.text]:
			return 0, p.errorf("unexpected keyword %q", t.text)
		}
		p.next()
		return Vector, p.selector(t.text)
	}
	return 0, p.errorf("unexpected %q", t.text)
}

var keywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "offset": true, "and": true, "or": true, "unless": true, "atan2": true,
}

var metricNameRe = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
var labelNameRe = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// selector parses the optional {matchers} after name ("" for none).
func (p *parser) selector(name string) error {
	if name != "" {
		if !metricNameRe.MatchString(name) {
			return p.errorf("bad metric name %q", name)
		}
		p.metrics[name] = true
	}
	if p.peek().kind != tLBrace {
		p.selectors = append(p.selectors, Selector{Metric: name})
		return nil
	}
	sel := Selector{Metric: name}
	p.next()
	matchers := 0
	for p.peek().kind != tRBrace {
		lt := p.next()
		if lt.kind != tIdent || !labelNameRe.MatchString(lt.text) {
			return p.errorf("want a label name, got %q", lt.text)
		}
		op := p.next()
		if op.kind != tOp || !slices.Contains([]string{"=", "!=", "=~", "!~"}, op.text) {
			return p.errorf("want a label matcher operator after %s, got %q", lt.text, op.text)
		}
		st, err := p.expect(tString, "a quoted label value")
		if err != nil {
			return err
		}
		v, err := unquote(st.text)
		if err != nil {
			return p.errorf("bad string %s: %v", st.text, err)
		}
		if op.text == "=~" || op.text == "!~" {
			if _, err := regexp.Compile("^(?s:" + v + ")$"); err != nil {
				return p.errorf("bad regular expression %s: %v", st.text, err)
			}
		}
		if lt.text == "__name__" && op.text == "=" {
			if name != "" {
				return p.errorf("metric name given twice")
			}
			if !metricNameRe.MatchString(v) {
				return p.errorf("bad metric name %q", v)
			}
			p.metrics[v] = true
			sel.Metric = v
		} else {
			sel.Matchers = append(sel.Matchers, Matcher{Label: lt.text, Op: op.text, Value: v})
		}
		matchers++
		if p.peek().kind == tComma {
			p.next()
			continue
		}
		if p.peek().kind != tRBrace {
			return p.errorf(`want "," or "}" in label matchers, got %q`, p.peek().text)
		}
	}
	p.next()
	if name == "" && matchers == 0 {
		return p.errorf("empty selector {}")
	}
	p.selectors = append(p.selectors, sel)
	return nil
}

// labelList parses "(" label, ... ")".
func (p *parser) labelList() error {
	if _, err := p.expect(tLParen, `"(" of a label list`); err != nil {
		return err
	}
	for p.peek().kind != tRParen {
		lt := p.next()
		if lt.kind != tIdent || !labelNameRe.MatchString(lt.text) {
			return p.errorf("want a label name, got %q", lt.text)
		}
		if p.peek().kind == tComma {
			p.next()
		} else if p.peek().kind != tRParen {
			return p.errorf(`want "," or ")" in a label list, got %q`, p.peek().text)
		}
	}
	p.next()
	return nil
}

// args parses "(" expr, ... ")" and returns the argument types.
func (p *parser) args() ([]Type, error) {
	if _, err := p.expect(tLParen, `"("`); err != nil {
		return nil, err
	}
	var types []Type
	for p.peek().kind != tRParen {
		t, err := p.expr(0)
		if err != nil {
			return nil, err
		}
		types = append(types, t)
		if p.peek().kind == tComma {
			p.next()
		} else if p.peek().kind != tRParen {
			return nil, p.errorf(`want "," or ")" in arguments, got %q`, p.peek().text)
		}
	}
	p.next()
	return types, nil
}

func (p *parser) aggregation() (Type, error) {
	name := p.next().text
	grouped := false
	grouping := func() error {
		if t := p.peek(); t.kind == tIdent && (t.text == "by" || t.text == "without") {
			if grouped {
				return p.errorf("%s: grouping given twice", name)
			}
			grouped = true
			p.next()
			return p.labelList()
		}
		return nil
	}
	if err := grouping(); err != nil {
		return 0, err
	}
	types, err := p.args()
	if err != nil {
		return 0, err
	}
	if err := grouping(); err != nil {
		return 0, err
	}
	if err := p.checkArgs(name, aggregations[name], types); err != nil {
		return 0, err
	}
	return Vector, nil
}

func (p *parser) call() (Type, error) {
	name := p.next().text
	f, ok := functions[name]
	if !ok {
		return 0, p.errorf("unknown function %q", name)
	}
	types, err := p.args()
	if err != nil {
		return 0, err
	}
	if err := p.checkArgs(name, f.args, types); err != nil {
		return 0, err
	}
	return f.ret, nil
}

// checkArgs checks the argument types got against want (optionalArgs and
// variadic say which may be left out or repeated).
func (p *parser) checkArgs(name string, want []Type, got []Type) error {
	sig := signature(name, want)
	least, most := len(want)-optionalArgs[name], len(want)
	if variadic[name] {
		most = 1 << 30
	}
	if len(got) < least || len(got) > most {
		return p.errorf("%s takes %s, got %d arguments", name, sig, len(got))
	}
	for i, g := range got {
		w := want[min(i, len(want)-1)]
		if g != w {
			return p.errorf("%s takes %s: argument %d is a %s", name, sig, i+1, g)
		}
	}
	return nil
}

func signature(name string, args []Type) string {
	var s []string
	for _, a := range args {
		s = append(s, a.String())
	}
	return name + "(" + strings.Join(s, ", ") + ")"
}

// unquote reads a PromQL string literal (Go's escapes; single quotes
// allowed).
func unquote(s string) (string, error) {
	if s[0] == '\'' {
		s = `"` + strings.ReplaceAll(strings.ReplaceAll(s[1:len(s)-1], `\'`, `'`), `"`, `\"`) + `"`
	}
	return strconv.Unquote(s)
}
