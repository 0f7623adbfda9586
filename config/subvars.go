package config

// The names of subscriptions and of their variables: COURIER_SUBSCRIPTIONS
// and every COURIER_SUB_<NAME>_<VAR> that is set.

import (
	"fmt"
	"github.com/courierhq/courier/internal/editdist"
	"maps"
	"slices"
	"strings"
)

// checkSubscriptionNames checks COURIER_SUBSCRIPTIONS and returns its valid
// names, each once.
func (c *checker) checkSubscriptionNames(list []string) []string {
	if len(list) == 0 {
		c.add(subscriptionsVar, "names no subscription: expected names of letters and digits, comma separated, such as orders,payments (unset: one subscription, set by the plain variables)")
		return nil
	}
	var names []string
	seen := map[string]string{}
	for _, n := range list {
		if !validSubName(n) {
			c.add(subscriptionsVar, "%q is not a subscription name: ASCII letters and digits only, as it is part of its variables' names (COURIER_SUB_<NAME>_STREAM)", n)
			continue
		}
		key := strings.ToUpper(n)
		if first, dup := seen[key]; dup {
			c.add(subscriptionsVar, "%q is listed twice (as %q before): a name's variables are upper case, COURIER_SUB_%s_STREAM for both", n, first, key)
			continue
		}
		seen[key] = n
		names = append(names, n)
	}
	return names
}

func validSubName(n string) bool {
	if n == "" {
		return false
	}
	for _, r := range n {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// checkSubVars checks the name of every COURIER_SUB_ variable that is set:
// a subscription listed in COURIER_SUBSCRIPTIONS (names; none when it is
// unset), and a variable of one message's path. Its problems name the
// variable, never its value (it may be a secret set in the wrong place).
func (c *checker) checkSubVars(names []string) {
	for _, v := range slices.Sorted(maps.Keys(c.environ)) {
		rest, ok := strings.CutPrefix(v, SubscriptionPrefix)
		if !ok || c.environ[v] == "" {
			continue
		}
		if msg := subVarProblem(rest, names); msg != "" {
			c.problems = append(c.problems, problem{group: 1, order: len(c.order), name: v, text: v + ": " + msg})
		}
	}
}

// subVarProblem explains what is wrong with the variable
// COURIER_SUB_<rest>, or returns "".
func subVarProblem(rest string, names []string) string {
	name, suffix, ok := strings.Cut(rest, "_")
	if !ok || name == "" || suffix == "" {
		return "not a subscription's variable: expected COURIER_SUB_<NAME>_<VARIABLE>, such as COURIER_SUB_ORDERS_STREAM"
	}
	if len(names) == 0 {
		return fmt.Sprintf("is set but COURIER_SUBSCRIPTIONS is not: list the subscription there (COURIER_SUBSCRIPTIONS=%s), or set the plain COURIER_%s for a courier of one subscription", strings.ToLower(name), suffix)
	}
	listed := ""
	for _, n := range names {
		if strings.ToUpper(n) == name {
			listed = n
		}
	}
	if listed == "" {
		msg := fmt.Sprintf("%s is not a subscription in COURIER_SUBSCRIPTIONS (%s)", name, strings.Join(names, ","))
		if near := closestName(name, names); near != "" {
			msg += ": did you mean " + subVarName(near, "COURIER_"+suffix) + "?"
		}
		return msg
	}

	plain := "COURIER_" + suffix
	for _, s := range specs() {
		switch {
		case s.name == plain && s.perSub:
			return ""
		case s.name == plain || s.name == suffix:
			return fmt.Sprintf("%s is per process, not per subscription: every subscription shares it; set %s", s.name, s.name)
		}
	}
	near, perSub := closestVarName(suffix)
	switch {
	case near == "":
		return fmt.Sprintf("%s is not a courier variable (`courier config` lists them; those of one message's path can be set per subscription, as %s<VAR>)", plain, SubscriptionPrefix+name+"_")
	case perSub:
		return fmt.Sprintf("%s is not a courier variable: did you mean %s?", plain, subVarName(listed, near))
	default:
		return fmt.Sprintf("%s is not a courier variable: did you mean %s? It is per process, not per subscription: set %s", plain, near, near)
	}
}

// closestName returns the listed subscription name closest to got (upper
// case) in spelling, if one is close enough to be what was meant.
func closestName(got string, names []string) string {
	best, bestDist := "", -1
	for _, n := range names {
		d := editdist.Distance(got, strings.ToUpper(n))
		if d > max(2, len(n)/3) {
			continue
		}
		if bestDist < 0 || d < bestDist {
			best, bestDist = n, d
		}
	}
	return best
}

// closestVarName returns the variable closest to suffix, the part after
// COURIER_SUB_<NAME>_, and whether it is one of one message's path.
func closestVarName(suffix string) (string, bool) {
	best, bestDist, perSub := "", -1, false
	for _, s := range specs() {
		known := strings.TrimPrefix(s.name, "COURIER_")
		d := editdist.Distance(suffix, known)
		if d > max(2, len(known)/3) {
			continue
		}
		if bestDist < 0 || d < bestDist {
			best, bestDist, perSub = s.name, d, s.perSub
		}
	}
	return best, perSub
}
