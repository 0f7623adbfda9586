package config

import (
	"errors"
	"strconv"
	"strings"
)

// inflightVar is the variable of MaxInflight and InflightAuto.
const inflightVar = "COURIER_MAX_INFLIGHT"

// defaultInflight is COURIER_MAX_INFLIGHT's default: a fixed limit of 8.
const defaultInflight = 8

// DefaultInflightCeiling is the most COURIER_MAX_INFLIGHT=auto lets the
// automatic limit reach; auto:N sets another.
const DefaultInflightCeiling = 64

// maxInflight is the most COURIER_MAX_INFLIGHT (a number, or the N of
// auto:N) may be: courier starts a worker, a slot and room in its fetch
// queue for each request it may have in flight, whether or not the app
// ever takes that many, and keeps a connection open to the app per request.
const maxInflight = 10000

// inflightSyntax is what every problem of COURIER_MAX_INFLIGHT says is
// accepted.
const inflightSyntax = "expected a number from 1 to 10000 (the requests in flight), or auto or auto:N (courier finds the number from the app's answers, at most N, a number from 1 to 10000; auto alone is auto:64)"

// parseInflight reads COURIER_MAX_INFLIGHT into MaxInflight and
// InflightAuto. env cannot: the variable is a number or a word, and the
// number must stay an int for the code that reads MaxInflight.
func (c *checker) parseInflight(cfg *Config) {
	v := lower(c.environ[inflightVar])
	if v == "" {
		cfg.MaxInflight = defaultInflight
		return
	}
	n, auto, msg := parseInflight(v)
	if msg != "" {
		c.bad[inflightVar] = true
		c.add(inflightVar, "%s", msg)
		return
	}
	cfg.MaxInflight, cfg.InflightAuto = n, auto
}

// parseInflight reads a trimmed, lower-cased value of COURIER_MAX_INFLIGHT:
// the limit or ceiling, whether it is automatic, or why it is wrong.
func parseInflight(v string) (n int, auto bool, problem string) {
	number, auto := v, false
	switch {
	case v == "auto":
		return DefaultInflightCeiling, true, ""
	case strings.HasPrefix(v, "auto:"):
		number, auto = strings.TrimSpace(strings.TrimPrefix(v, "auto:")), true
	}
	n, err := strconv.Atoi(number)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return 0, false, "integer out of range: " + inflightSyntax
	case err != nil && auto:
		return 0, false, "the N of auto:N is not a whole number: " + inflightSyntax
	case err != nil:
		return 0, false, "not a number: " + inflightSyntax
	case n < 1 && auto:
		return 0, false, "the N of auto:N must be at least 1: " + inflightSyntax
	case n < 1:
		return 0, false, "must be at least 1: " + inflightSyntax
	case n > maxInflight && auto:
		return 0, false, "the N of auto:N must be at most " + strconv.Itoa(maxInflight) + ": " + inflightSyntax
	case n > maxInflight:
		return 0, false, "must be at most " + strconv.Itoa(maxInflight) + ": " + inflightSyntax
	}
	return n, auto, ""
}

// inflightString is COURIER_MAX_INFLIGHT as it could be set: the number,
// auto, or auto:N.
func (c Config) inflightString() string {
	switch {
	case !c.InflightAuto:
		return strconv.Itoa(c.MaxInflight)
	case c.MaxInflight == DefaultInflightCeiling:
		return "auto"
	default:
		return "auto:" + strconv.Itoa(c.MaxInflight)
	}
}
