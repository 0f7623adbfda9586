package promcheck

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// CheckRules reads a Prometheus rule file as Prometheus does
// (rulefmt.Parse: strictly, so an unknown or misspelt field is an error;
// every expression parsed and type-checked, alert templates parsed, names
// valid under the classic scheme) and checks what Prometheus would accept
// but courier's files must not hold: a second YAML document (Prometheus
// ignores it with a warning), a file or group without rules, an
// expression that is not an instant vector. It returns the groups, every
// rule's expression, and every problem found.
func CheckRules(data []byte) (*rulefmt.RuleGroups, []Query, error) {
	var warnings bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&warnings, nil))
	p := newParser()
	rg, errs := rulefmt.Parse(data, false, model.LegacyValidation, p, logger)
	if warnings.Len() > 0 {
		errs = append(errs, fmt.Errorf("rulefmt warns: %s", bytes.TrimSpace(warnings.Bytes())))
	}
	if rg == nil {
		return nil, nil, errors.Join(errs...)
	}
	if len(rg.Groups) == 0 {
		errs = append(errs, errors.New("no groups"))
	}
	var qs []Query
	for _, g := range rg.Groups {
		if len(g.Rules) == 0 {
			errs = append(errs, fmt.Errorf("group %q: no rules", g.Name))
		}
		for i, r := range g.Rules {
			where := fmt.Sprintf("group %q rule %d", g.Name, i+1)
			switch {
			case r.Alert != "":
				where = "alert " + r.Alert
			case r.Record != "":
				where = "record " + r.Record
			}
			e, err := p.ParseExpr(r.Expr)
			if err != nil {
				continue // rulefmt has reported it
			}
			if e.Type() != parser.ValueTypeVector {
				errs = append(errs, fmt.Errorf("%s: expr is a %s, want an instant vector", where, e.Type()))
				continue
			}
			qs = append(qs, Query{Where: where, Source: r.Expr, Expr: e})
		}
	}
	return rg, qs, errors.Join(errs...)
}
