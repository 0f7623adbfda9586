package config

import (
	"fmt"
	"io"
	"strings"
)

//go:generate go test . -run ^TestConfigurationDoc$ -update

// Variable is one environment variable courier reads.
type Variable struct {
	// Name is the variable, such as COURIER_MAX_DELIVER.
	Name string
	// Meaning is a short description.
	Meaning string
	// Default is the default as a value (such as "5") or in words (such
	// as "unset", "required", "dlq.<stream>.<consumer>").
	Default string
	// PerSubscription is true for the variables of one message's path:
	// with COURIER_SUBSCRIPTIONS each subscription may set its own as
	// COURIER_SUB_<NAME>_<VAR> (SubscriptionPrefix), such as
	// COURIER_SUB_ORDERS_STREAM, falling back to the plain variable. The
	// others are per process: every subscription shares them.
	PerSubscription bool
	// Secret is true for the variables whose value is never shown.
	Secret bool
}

// Variables returns every environment variable courier reads, in the
// order `courier config` and docs/configuration.md list them. Any other
// COURIER_* variable is unknown (a warning), except the subscriptions'
// COURIER_SUB_<NAME>_<VAR>, which Load checks.
func Variables() []Variable {
	ss := specs()
	vs := make([]Variable, len(ss))
	for i, s := range ss {
		vs[i] = Variable{Name: s.name, Meaning: s.meaning, Default: s.def, PerSubscription: s.perSub, Secret: s.secret}
	}
	return vs
}

// referenceIntro opens docs/configuration.md.
const referenceIntro = `# Configuration

<!-- Generated from the config package (config.WriteReference) by ` + "`go generate ./config/`" + `. Do not edit: change the package and generate again. -->

courier is configured by environment variables alone. ` + "`courier config`" + ` prints every
variable with its meaning, its default and the value in effect (secrets redacted), and names any
unknown ` + "`COURIER_*`" + ` variable with the closest real one. An invalid configuration stops
courier, and every command, before anything is consumed: every problem is listed on stderr in
one go, and the exit status is 2.

A variable set to the empty string counts as unset. Durations are in Go's syntax (` + "`500ms`, `30s`, `10m`, `1h30m`" + `);
lists are comma separated, spaces around items ignored.

## Several subscriptions in one courier

With ` + "`COURIER_SUBSCRIPTIONS=orders,payments`" + ` one courier serves several durable consumers.
Each subscription is set by the variables marked *per subscription* below, written
` + "`COURIER_SUB_<NAME>_<VAR>`" + ` in place of ` + "`COURIER_<VAR>`" + `: ` + "`COURIER_SUB_ORDERS_STREAM`" + `,
` + "`COURIER_SUB_PAYMENTS_BATCH_MAX`" + `. Where a subscription does not set one, the plain
` + "`COURIER_<VAR>`" + ` applies, and where that is unset too, the default; the default dead-letter
subject follows the subscription's own stream and consumer (` + "`dlq.<stream>.<consumer>`" + `).
` + "`courier config`" + ` shows each subscription's values and where each came from.

A name is ASCII letters and digits; its variables spell it in upper case, so ` + "`orders`" + ` is set
by ` + "`COURIER_SUB_ORDERS_*`" + ` (two names that differ only in case are one name, refused). The name
is kept as listed wherever courier shows it. The variables not marked per subscription are per
process: every subscription shares them (the NATS connection, the dedup store, the admin
address, the publish API, request/reply, signing, tracing, logs, the shutdown grace).

Configuration errors: a ` + "`COURIER_SUB_`" + ` variable of a name not listed (with the closest listed
name), of a variable that is per process (naming the plain one to set), or of no variable at
all (with the closest real one); a name that is not letters and digits, listed twice, or an
empty list; two subscriptions on the same stream and consumer, or dead-lettering to the same
subject (` + "`courier dlq`" + ` of one would list, replay and purge the other's). A problem caused by a
subscription's own variable names that variable; one caused by a plain variable names it and
the subscriptions it applies to.

## Routes

` + "`COURIER_ROUTES=orders.*.created=/created,orders.>=/orders`" + ` POSTs a message to the path of the first
pattern its subject matches, on the origin of ` + "`COURIER_APP_URL`" + ` (its scheme, user and host, or
its Unix socket); a message that matches none goes to ` + "`COURIER_APP_URL`" + ` itself. A pattern is a
NATS subject pattern (` + "`*`" + ` one token, ` + "`>`" + ` as the last token one or more), split from its path at
the first ` + "`=`" + `. A path starts with ` + "`/`" + ` and may carry a query (` + "`/events?kind=created`" + `),
which is sent as given in place of the app URL's path and query: an app that dispatches on a
query parameter is routed as one that dispatches on the path. A ` + "`,`" + `, a space or a ` + "`#`" + ` in a path
is percent-encoded (` + "`%2C`, `%20`, `%23`" + `). A route that an earlier one always wins over
(` + "`orders.*.created`" + ` after ` + "`orders.>`" + `) is refused: it would never be used.

## Variables
`

// WriteReference writes docs/configuration.md: how courier is configured,
// and every variable with its meaning, its default and whether each
// subscription may set its own, in tables by prefix.
func WriteReference(w io.Writer) error {
	var b strings.Builder
	b.WriteString(referenceIntro)
	sections := []struct{ prefix, title, intro string }{
		{"NATS_", "Connection", "Named as the `nats` CLI names them; per process."},
		{"COURIER_", "courier", ""},
		{"OTEL_", "Tracing", "OpenTelemetry's own variables, read as its specification says; per process."},
	}
	vars := Variables()
	for _, sec := range sections {
		fmt.Fprintf(&b, "\n### %s\n\n", sec.title)
		if sec.intro != "" {
			b.WriteString(sec.intro + "\n\n")
		}
		b.WriteString("| variable | meaning | default | per subscription |\n|---|---|---|---|\n")
		for _, v := range vars {
			if !strings.HasPrefix(v.Name, sec.prefix) {
				continue
			}
			per := "no"
			if v.PerSubscription {
				per = "yes"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", v.Name, markdownText(v.Meaning), markdownDefault(v.Default), per)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// markdownDefault shows a default that is a value as code, one in words as
// text.
func markdownDefault(d string) string {
	if d == "unset" || strings.Contains(d, " ") {
		return markdownText(d)
	}
	return "`" + d + "`"
}

// markdownText makes text safe in a table cell of GitHub's Markdown:
// variable names become code, and what Markdown or HTML would read as
// markup ('*', '_' outside names, '<', '>', '|', '`') is escaped.
func markdownText(s string) string {
	var b strings.Builder
	for _, word := range strings.SplitAfter(s, " ") {
		core := strings.TrimSuffix(strings.TrimRight(word, " ,.;:)"), "'s")
		lead := ""
		if strings.HasPrefix(core, "(") {
			lead, core = "(", core[1:]
		}
		if name, _, _ := strings.Cut(core, "="); isVarName(name) { // COURIER_ORDER_KEY=subject:N too
			b.WriteString(lead + "`" + core + "`" + word[len(lead)+len(core):])
			continue
		}
		for _, r := range word {
			switch r {
			case '<':
				b.WriteString("&lt;")
			case '>':
				b.WriteString("&gt;")
			case '*', '_', '|', '`':
				b.WriteString(`\` + string(r))
			default:
				b.WriteRune(r)
			}
		}
	}
	return b.String()
}

// isVarName reports whether s reads as an environment variable's name, a
// placeholder such as COURIER_SUB_<NAME>_<VAR> included.
func isVarName(s string) bool {
	if !strings.Contains(s, "_") || !(strings.HasPrefix(s, "COURIER_") || strings.HasPrefix(s, "NATS_") || strings.HasPrefix(s, "OTEL_")) {
		return false
	}
	for _, r := range s {
		if !(r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_<>", r)) {
			return false
		}
	}
	return true
}
