package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// subscriptionsVar lists the subscriptions of one courier.
const subscriptionsVar = "COURIER_SUBSCRIPTIONS"

// SubscriptionPrefix starts the variables of one subscription:
// COURIER_SUB_<NAME>_<VAR>, such as COURIER_SUB_ORDERS_STREAM for the
// subscription orders' COURIER_STREAM.
const SubscriptionPrefix = "COURIER_SUB_"

// SourceDefault is Subscription.Source's word for a value neither the
// subscription's own variable nor the plain one sets: the default, or
// what Load derives (COURIER_DLQ_SUBJECT from the subscription's own
// stream and consumer).
const SourceDefault = "default"

// Subscription is one delivery path of a courier: a durable consumer, and
// how its messages reach the app.
type Subscription struct {
	// Name is as COURIER_SUBSCRIPTIONS lists it, such as "orders"; "" for
	// the one subscription of the plain variables (no
	// COURIER_SUBSCRIPTIONS).
	Name string
	// Config is the whole configuration as this subscription sees it: the
	// variables of one message's path (PerSubscription in Variables) from
	// the subscription's own COURIER_SUB_<NAME>_<VAR> where set, else from
	// the plain COURIER_<VAR>, else their defaults, COURIER_DLQ_SUBJECT's
	// following the subscription's own stream and consumer; every other
	// field is the process's, as in the Config it came from. Load has run
	// every check on it. Its Subscriptions method knows nothing of the
	// others.
	Config Config
	// Source maps each variable of one message's path, by its plain name
	// (COURIER_STREAM), to where its value came from: the subscription's
	// own variable (COURIER_SUB_ORDERS_STREAM), the plain one
	// (COURIER_STREAM) or SourceDefault. Read it only: copies share it.
	Source map[string]string
}

// Var is the variable that sets plain (such as COURIER_STREAM) for this
// subscription, to name in a message: COURIER_SUB_ORDERS_STREAM for the
// subscription orders, plain itself for the subscription of the plain
// variables or for a variable the process has once.
func (s Subscription) Var(plain string) string {
	if s.Name == "" || !isPerSub(plain) {
		return plain
	}
	return subVarName(s.Name, plain)
}

// Subscriptions returns the subscriptions courier serves: those of
// COURIER_SUBSCRIPTIONS, in its order, or without it a single one named ""
// whose Config is c. Each is a delivery path of its own (its own durable,
// dead-letter subject, breaker, order, batches, limit); what they share is
// in every Config alike (the NATS connection, the dedup store, the admin
// and publish addresses, request/reply, signing, tracing, logs, shutdown).
func (c Config) Subscriptions() []Subscription {
	if len(c.subs) > 0 {
		return slices.Clone(c.subs)
	}
	return []Subscription{{Config: c, Source: c.source}}
}

// subVarName is the variable that sets plain for the subscription name.
func subVarName(name, plain string) string {
	return SubscriptionPrefix + strings.ToUpper(name) + "_" + strings.TrimPrefix(plain, "COURIER_")
}

// perSubVars is the set of the variables of one message's path.
func perSubVars() map[string]bool {
	m := map[string]bool{}
	for _, s := range specs() {
		if s.perSub {
			m[s.name] = true
		}
	}
	return m
}

// isPerSub reports whether name is a variable of one message's path,
// which each subscription may set for itself.
func isPerSub(name string) bool {
	for _, s := range specs() {
		if s.name == name {
			return s.perSub
		}
	}
	return false
}

// plainSources is Subscription.Source for the subscription of the plain
// variables.
func plainSources(environ map[string]string) map[string]string {
	src := map[string]string{}
	for name := range perSubVars() {
		src[name] = SourceDefault
		if environ[name] != "" {
			src[name] = name
		}
	}
	return src
}

// subNames names the variables of one subscription in its problems: the
// subscription's own variable where it set one, or where neither it nor
// the plain variable is set (it is the one to set); the plain variable
// where that is what set the value.
type subNames struct {
	name   string          // as listed in COURIER_SUBSCRIPTIONS
	perSub map[string]bool // the variables of one message's path
	own    map[string]bool // by plain name: set by the subscription's own variable
	plain  map[string]bool // by plain name: set by the plain variable
}

func (n *subNames) display(name string) string {
	if !n.perSub[name] || (n.plain[name] && !n.own[name]) {
		return name
	}
	return subVarName(n.name, name)
}

// rename renames every variable text names as display does.
func (n *subNames) rename(text string) string {
	const lead = "COURIER_"
	var b strings.Builder
	for {
		i := strings.Index(text, lead)
		if i < 0 {
			b.WriteString(text)
			return b.String()
		}
		end := i + len(lead)
		for end < len(text) && (text[end] >= 'A' && text[end] <= 'Z' || text[end] >= '0' && text[end] <= '9' || text[end] == '_') {
			end++
		}
		for end > i+len(lead) && text[end-1] == '_' {
			end--
		}
		b.WriteString(text[:i])
		b.WriteString(n.display(text[i:end]))
		text = text[end:]
	}
}

// prefix is what starts the subscription's own variables.
func (n *subNames) prefix() string { return SubscriptionPrefix + strings.ToUpper(n.name) + "_" }

// subResult is what checking one subscription found, for Inspect.
type subResult struct {
	name     string
	problems []problem // as the subscription's own check wrote them
}

// loadSubscriptions checks COURIER_SUBSCRIPTIONS and the COURIER_SUB_
// variables, then loads and checks each subscription, adding its
// problems to c's: one that a subscription's own variable causes as it is;
// one from a plain variable prefixed with the subscriptions it applies to
// ("subscriptions orders, payments: COURIER_BATCH_MAX=..."), once.
func (c *checker) loadSubscriptions(cfg *Config, environ map[string]string) {
	names := c.checkSubscriptionNames(cfg.SubscriptionNames)
	if len(names) == 0 {
		return // COURIER_SUBSCRIPTIONS's problem says why
	}
	c.checkSubVars(names)

	type shared struct {
		at   int // index in c.problems
		subs []string
		text string
	}
	var merged []*shared
	byText := map[string]*shared{}
	for i, name := range names {
		sub, sc := loadSubscription(*cfg, environ, name)
		cfg.subs = append(cfg.subs, sub)
		c.subs = append(c.subs, subResult{name: name, problems: sc.problems})
		own := sc.sub.prefix()
		for _, p := range sc.problems {
			p.group = 2 + i
			if strings.HasPrefix(p.text, own) {
				c.problems = append(c.problems, p)
				continue
			}
			if s, ok := byText[p.text]; ok {
				s.subs = append(s.subs, name)
				continue
			}
			s := &shared{at: len(c.problems), subs: []string{name}, text: p.text}
			byText[p.text], merged = s, append(merged, s)
			c.problems = append(c.problems, p)
		}
	}
	for _, s := range merged {
		c.problems[s.at].text = subscriptionsLabel(s.subs) + ": " + s.text
	}
	c.checkDurables(cfg.subs, 2+len(names))
}

// subscriptionsLabel names subscriptions in a message.
func subscriptionsLabel(names []string) string {
	if len(names) == 1 {
		return "subscription " + names[0]
	}
	return "subscriptions " + strings.Join(names, ", ")
}

// loadSubscription loads the subscription name: environ with the
// subscription's own variables in place of the plain ones, checked as one
// message's path; the rest of its Config is the process's, plain.
func loadSubscription(plain Config, environ map[string]string, name string) (Subscription, *checker) {
	names := &subNames{name: name, perSub: perSubVars(), own: map[string]bool{}, plain: map[string]bool{}}
	overlay := maps.Clone(environ)
	source := map[string]string{}
	for v := range names.perSub {
		own := subVarName(name, v)
		switch {
		case environ[own] != "":
			overlay[v], names.own[v], source[v] = environ[own], true, own
		case environ[v] != "":
			names.plain[v], source[v] = true, v
		default:
			source[v] = SourceDefault
		}
	}
	scfg, sc := loadScope(overlay, scopeSubscription, names)

	// The process's fields are the plain Config's; the path's the
	// subscription's.
	cfg := plain
	cfg.subs, cfg.source = nil, nil
	dst, src := reflect.ValueOf(&cfg).Elem(), reflect.ValueOf(scfg)
	t := dst.Type()
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("env"), ",")
		if names.perSub[tag] {
			dst.Field(i).Set(src.Field(i))
		}
	}
	cfg.MaxInflight, cfg.InflightAuto = scfg.MaxInflight, scfg.InflightAuto
	return Subscription{Name: name, Config: cfg, Source: source}, sc
}

// checkDurables refuses two subscriptions on one durable consumer, and two
// dead-lettering to one subject: `courier dlq` of one would list, replay
// and purge the other's dead letters.
func (c *checker) checkDurables(subs []Subscription, group int) {
	for i, a := range subs {
		for _, b := range subs[i+1:] {
			ac, bc := a.Config, b.Config
			switch {
			case ac.Stream == "" || ac.Consumer == "":
			case ac.Stream == bc.Stream && ac.Consumer == bc.Consumer:
				c.problems = append(c.problems, problem{group: group, text: fmt.Sprintf(
					"subscriptions %s and %s are the same durable consumer, %q of the stream %q: each subscription needs its own; set %s (or %s) to another name",
					a.Name, b.Name, ac.Consumer, ac.Stream, b.Var("COURIER_CONSUMER"), b.Var("COURIER_STREAM"))})
			case ac.DLQSubject != "" && ac.DLQSubject == bc.DLQSubject:
				c.problems = append(c.problems, problem{group: group, text: fmt.Sprintf(
					"subscriptions %s and %s dead-letter to the same subject %q (%s, %s): each needs its own, or `courier dlq` of one would list, replay and purge the other's; leave COURIER_DLQ_SUBJECT unset (dlq.<stream>.<consumer> differs per subscription) or set %s",
					a.Name, b.Name, ac.DLQSubject, sourceOf(a, "COURIER_DLQ_SUBJECT"), sourceOf(b, "COURIER_DLQ_SUBJECT"), b.Var("COURIER_DLQ_SUBJECT"))})
			}
		}
	}
}

// sourceOf names where a subscription's value of plain came from.
func sourceOf(s Subscription, plain string) string {
	if src := s.Source[plain]; src != "" && src != SourceDefault {
		return src
	}
	return "the default of " + s.Var(plain)
}
