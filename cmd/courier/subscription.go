package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/courierhq/courier/config"
)

// The commands that act on one durable (status, pause, resume, dlq,
// cleanup) take --subscription NAME when courier serves several
// (COURIER_SUBSCRIPTIONS): they then run with the environment that
// subscription's delivery path has, its own COURIER_SUB_<NAME>_ variables
// in place of the plain ones, as if courier served it alone.

// takesSubscription reports whether command name acts on one
// subscription's durable.
func takesSubscription(name string) bool {
	return slices.Contains([]string{"status", "pause", "resume", "dlq", "cleanup", "rewind"}, name)
}

// chooseSubscription takes --subscription NAME (or --subscription=NAME)
// out of args and returns environ as the chosen subscription's. Without
// COURIER_SUBSCRIPTIONS environ is left as it is and the flag refused;
// with one subscription it is the one; with several the flag is required.
func chooseSubscription(cmd string, args, environ []string) ([]string, []string, error) {
	var name string
	given := false
	rest := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--subscription" || a == "-subscription":
			if i+1 >= len(args) {
				return nil, nil, usageError("courier %s: --subscription needs a name", cmd)
			}
			name, given = args[i+1], true
			i++
		case strings.HasPrefix(a, "--subscription=") || strings.HasPrefix(a, "-subscription="):
			_, name, _ = strings.Cut(a, "=")
			given = true
		default:
			rest = append(rest, a)
		}
	}
	env := config.Environ(environ)
	var names []string
	for _, n := range strings.Split(env["COURIER_SUBSCRIPTIONS"], ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	switch {
	case len(names) == 0 && given:
		return nil, nil, usageError("courier %s: --subscription %s, but COURIER_SUBSCRIPTIONS is not set: there is one durable, set by the plain variables", cmd, name)
	case len(names) == 0:
		return rest, environ, nil
	case !given && len(names) > 1:
		return nil, nil, usageError("courier %s: courier serves several subscriptions (%s): choose one with --subscription NAME", cmd, strings.Join(names, ", "))
	case !given:
		name = names[0]
	}
	i := slices.IndexFunc(names, func(n string) bool { return strings.EqualFold(n, name) })
	if i < 0 {
		return nil, nil, usageError("courier %s: no subscription %q in COURIER_SUBSCRIPTIONS (%s)", cmd, name, strings.Join(names, ", "))
	}
	return rest, subscriptionEnviron(environ, names[i]), nil
}

// subscriptionEnviron is environ as subscription name's delivery path has
// it: its COURIER_SUB_<NAME>_<VAR> as COURIER_<VAR>, over the plain ones,
// and no other COURIER_SUB_ variable nor COURIER_SUBSCRIPTIONS.
func subscriptionEnviron(environ []string, name string) []string {
	prefix := config.SubscriptionPrefix + strings.ToUpper(name) + "_"
	own := map[string]string{}
	var out []string
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, prefix):
			own["COURIER_"+strings.TrimPrefix(k, prefix)] = v
		case k == "COURIER_SUBSCRIPTIONS" || strings.HasPrefix(k, config.SubscriptionPrefix):
		default:
			out = append(out, kv)
		}
	}
	out = slices.DeleteFunc(out, func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		_, ok := own[k]
		return ok
	})
	for _, k := range slices.Sorted(maps.Keys(own)) {
		out = append(out, fmt.Sprintf("%s=%s", k, own[k]))
	}
	return out
}
