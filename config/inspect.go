package config

import (
	"fmt"
	"github.com/courierhq/courier/internal/editdist"
	"slices"
	"strings"
)

// Warning is something in a valid configuration that is most likely a
// mistake, or will be one: the sidecar logs it at start, `courier config`
// prints it.
type Warning struct {
	// Variable is the variable it is about.
	Variable string
	// Text says what is wrong and what to do, in one line.
	Text string
}

func (w Warning) String() string { return w.Text }

// Inspect loads environ as Load does and describes it for `courier
// config`: every variable as Describe shows it, except that a variable
// with a problem shows its value as given (secrets redacted) and carries
// its problems (a plain variable of the path those of the subscriptions
// that take it); then the warnings (Warnings); then Load's error.
func Inspect(environ map[string]string) ([]Var, []Warning, error) {
	cfg, c := load(environ)
	vars := Describe(cfg)
	byName := map[string]*Var{}
	for i := range vars {
		byName[vars[i].Name] = &vars[i]
	}
	mark := func(v *Var, text string) {
		if !slices.Contains(v.Problems, text) {
			v.Problems = append(v.Problems, text)
		}
		if given := c.environ[v.Name]; given != "" {
			v.Value = redactVar(v.Name, given)
		}
	}
	for _, p := range c.problems {
		if v, ok := byName[p.name]; ok && p.group < 2 { // a subscription's: below
			mark(v, p.text)
		}
	}
	// A plain variable of the path is wrong where a subscription takes it.
	for i, sub := range cfg.subs {
		for _, p := range c.subs[i].problems {
			if v, ok := byName[p.name]; ok && sub.Source[p.name] == p.name {
				mark(v, p.text)
			}
		}
	}
	var err error
	if p := c.sorted(); len(p) > 0 {
		err = &Error{Problems: p}
	}
	return vars, Warnings(cfg, c.environ), err
}

// SubscriptionVars describes one subscription of COURIER_SUBSCRIPTIONS for
// `courier config`.
type SubscriptionVars struct {
	// Name is as COURIER_SUBSCRIPTIONS lists it.
	Name string
	// Vars are the variables of one message's path, in the order of
	// Describe, with the subscription's values, where each came from
	// (Source: COURIER_SUB_<NAME>_<VAR>, the plain variable or "default")
	// and, where it is wrong, its problems (the value shown as given).
	Vars []Var
}

// InspectSubscriptions loads environ as Load does and describes each
// subscription of COURIER_SUBSCRIPTIONS; nil when it is unset. Inspect
// describes the rest, and returns the error that lists every problem.
func InspectSubscriptions(environ map[string]string) []SubscriptionVars {
	cfg, c := load(environ)
	if len(cfg.subs) == 0 {
		return nil
	}
	out := make([]SubscriptionVars, 0, len(cfg.subs))
	for i, sub := range cfg.subs {
		sv := SubscriptionVars{Name: sub.Name}
		for _, v := range Describe(sub.Config) {
			if !v.PerSubscription {
				continue
			}
			v.Source = sub.Source[v.Name]
			for _, p := range c.subs[i].problems {
				if p.name != v.Name {
					continue
				}
				v.Problems = append(v.Problems, p.text)
				if src := v.Source; src != SourceDefault && c.environ[src] != "" {
					v.Value = redactVar(v.Name, c.environ[src])
				}
			}
			sv.Vars = append(sv.Vars, v)
		}
		out = append(out, sv)
	}
	return out
}

// Warnings returns what looks wrong in a configuration that Load accepts:
// unknown COURIER_* variables (most likely misspelt, with the closest known
// name), OTLP exporter variables for spans that courier does not read
// (such as OTEL_EXPORTER_OTLP_CERTIFICATE), the deprecated
// COURIER_DEDUP_STORE=kv, for each subscription a COURIER_MAX_DELIVER
// too small to survive a restart, batches that cannot fill, and a route
// that no filter subject lets a message take, and a plain variable of the
// path that every subscription sets for itself. cfg is what Load returned
// for environ.
func Warnings(cfg Config, environ map[string]string) []Warning {
	var ws []Warning
	for _, name := range UnknownVars(environ) {
		text := name + " is not a courier variable and is ignored"
		if near := ClosestVar(name); near != "" {
			text += ": did you mean " + near + "?"
		} else {
			text += " (`courier config` lists them)"
		}
		ws = append(ws, Warning{Variable: name, Text: text})
	}
	for _, name := range ignoredOTLPVars(environ) {
		ws = append(ws, Warning{Variable: name,
			Text: name + " is not read by courier and is ignored: `courier config` lists the OpenTelemetry variables courier reads"})
	}
	if strings.EqualFold(strings.TrimSpace(environ["COURIER_DEDUP_STORE"]), "kv") {
		ws = append(ws, Warning{Variable: "COURIER_DEDUP_STORE",
			Text: `COURIER_DEDUP_STORE=kv is the old name of "shared", read as shared: set COURIER_DEDUP_STORE=shared`})
	}

	// A subscription's warnings name its variables as its problems do; one
	// that several share through a plain variable is said once.
	type shared struct {
		at   int
		subs []string
		text string
	}
	byText := map[string]*shared{}
	var merged []*shared
	for _, sub := range cfg.Subscriptions() {
		names := sourceNames(sub)
		for _, w := range pathWarnings(sub.Config) {
			if names == nil {
				ws = append(ws, w)
				continue
			}
			w.Variable, w.Text = names.display(w.Variable), names.rename(w.Text)
			if strings.HasPrefix(w.Text, names.prefix()) {
				ws = append(ws, w)
				continue
			}
			if s, ok := byText[w.Text]; ok {
				s.subs = append(s.subs, sub.Name)
				continue
			}
			s := &shared{at: len(ws), subs: []string{sub.Name}, text: w.Text}
			byText[w.Text], merged = s, append(merged, s)
			ws = append(ws, w)
		}
	}
	for _, s := range merged {
		ws[s.at].Text = subscriptionsLabel(s.subs) + ": " + s.text
	}
	return append(ws, unusedPlainVars(cfg, environ)...)
}

// unusedPlainVars warns of the plain variables of the path that every
// subscription sets for itself: they are not used (nor checked).
func unusedPlainVars(cfg Config, environ map[string]string) []Warning {
	if len(cfg.subs) == 0 {
		return nil
	}
	var ws []Warning
	for _, s := range specs() {
		if !s.perSub || environ[s.name] == "" {
			continue
		}
		used := slices.ContainsFunc(cfg.subs, func(sub Subscription) bool { return sub.Source[s.name] == s.name })
		if !used {
			ws = append(ws, Warning{Variable: s.name, Text: fmt.Sprintf(
				"%s is set but every subscription sets its own (%s<NAME>_%s): it is not used",
				s.name, SubscriptionPrefix, strings.TrimPrefix(s.name, "COURIER_"))})
		}
	}
	return ws
}

// sourceNames names a subscription's variables as its problems do; nil for
// the subscription of the plain variables.
func sourceNames(sub Subscription) *subNames {
	if sub.Name == "" {
		return nil
	}
	n := &subNames{name: sub.Name, perSub: perSubVars(), own: map[string]bool{}, plain: map[string]bool{}}
	for v, src := range sub.Source {
		n.own[v] = src != v && src != SourceDefault
		n.plain[v] = src == v
	}
	return n
}

// pathWarnings are the warnings of one message's path.
func pathWarnings(cfg Config) []Warning {
	var ws []Warning
	if !cfg.ConsumesStream() {
		return nil
	}
	switch cfg.MaxDeliver {
	case 1:
		ws = append(ws, Warning{Variable: "COURIER_MAX_DELIVER",
			Text: "COURIER_MAX_DELIVER=1 allows no retry: a transient failure (a 503, a timeout) dead-letters the message at once, and so does stopping courier (a rollout, an app outage) while it holds messages; keep it at 3 or more"})
	case 2:
		ws = append(ws, Warning{Variable: "COURIER_MAX_DELIVER",
			Text: "COURIER_MAX_DELIVER=2 allows one retry, which a restart while courier holds a message (a rollout, an app outage) may already spend; keep it at 3 or more"})
	}
	if n := cfg.MaxInflight * cfg.BatchMax; cfg.BatchMax > 1 && n > cfg.MaxAckPending {
		ws = append(ws, Warning{Variable: "COURIER_BATCH_MAX",
			Text: fmt.Sprintf("COURIER_MAX_INFLIGHT × COURIER_BATCH_MAX = %d messages may be in batches at once, more than COURIER_MAX_ACK_PENDING=%d lets the server hand out: batches will not fill; raise COURIER_MAX_ACK_PENDING", n, cfg.MaxAckPending)})
	}
	if len(cfg.Subjects) == 0 {
		return ws
	}
	for _, r := range cfg.Routes {
		if !slices.ContainsFunc(cfg.Subjects, func(f string) bool { return subjectsCollide(f, r.Pattern) }) {
			ws = append(ws, Warning{Variable: "COURIER_ROUTES",
				Text: fmt.Sprintf("COURIER_ROUTES: the pattern %q matches no subject of COURIER_SUBJECTS (%s): no message takes the route to %s", r.Pattern, strings.Join(cfg.Subjects, ","), r.Path)})
		}
	}
	return ws
}

// ClosestVar returns the courier variable closest to name in spelling, if
// one is close enough to be what was meant, else "".
func ClosestVar(name string) string {
	const prefix = "COURIER_"
	var known []string
	for _, s := range specs() {
		if k, ok := strings.CutPrefix(s.name, prefix); ok {
			known = append(known, k)
		}
	}
	if near := editdist.Closest(strings.TrimPrefix(strings.ToUpper(name), prefix), known); near != "" {
		return prefix + near
	}
	return ""
}
