package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/courierhq/courier/config"
)

// loadConfig parses the environment; problems are printed one per line,
// with the warnings `courier config` prints (a misspelt variable is often
// why a required one is missing), and mean exit status 2.
func loadConfig(environ []string) (config.Config, error) {
	m := config.Environ(environ)
	cfg, err := config.Load(m)
	if err != nil {
		return cfg, invalidConfig(err, config.Warnings(cfg, m))
	}
	return cfg, nil
}

// loadConfigWithoutApp is loadConfig for the commands that talk to the
// server only (cleanup): COURIER_APP_URL, which config requires to consume,
// is filled with a placeholder when unset.
func loadConfigWithoutApp(environ []string) (config.Config, error) {
	m := config.Environ(environ)
	if m["COURIER_APP_URL"] == "" && (m["COURIER_STREAM"] != "" || m["COURIER_SUBSCRIPTIONS"] != "") {
		m["COURIER_APP_URL"] = "http://courier-no-app.invalid/"
	}
	cfg, err := config.Load(m)
	if err != nil {
		return cfg, invalidConfig(err, config.Warnings(cfg, m))
	}
	return cfg, nil
}

// invalidConfig is the exit-2 error listing every problem of err, then the
// warnings.
func invalidConfig(err error, warnings []config.Warning) error {
	for _, w := range warnings {
		err = fmt.Errorf("%w\nwarning: %s", err, w.Text)
	}
	return &exitError{code: 2, err: fmt.Errorf("invalid configuration:\n%w", indent(err))}
}

func indent(err error) error {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = "  " + l
	}
	return errors.New(strings.Join(lines, "\n"))
}

// configWidth is the width `courier config` fits its table in, unless
// --wide: a value is never cut (it is to be copied), so only a long value
// runs past it.
const configWidth = 100

const configUsage = `Usage: courier config [--wide]

Prints every variable courier reads: its value in effect (secrets
redacted; an invalid one as given), its default and what it means, then,
with COURIER_SUBSCRIPTIONS, each subscription's values of the variables of
one message's path and where each came from (its own
COURIER_SUB_<NAME>_<VAR>, the plain variable, or the default). Unknown
COURIER_* variables are named on stderr. Exit status 2 if the
configuration is invalid, with every problem.

  --wide   one line a variable, the meaning last (for a wide terminal or grep)
`

// runConfigArgs runs `courier config [--wide]`.
func runConfigArgs(args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("courier config", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	wide := fs.Bool("wide", false, "")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, configUsage)
		return nil
	} else if err != nil {
		return usageError("config: %v (see 'courier config --help')", err)
	}
	if fs.NArg() > 0 {
		return usageError("config takes no arguments, only --wide (see 'courier config --help')")
	}
	return printConfig(environ, *wide, stdout, stderr)
}

// printConfig prints every variable (an invalid one as given) on stdout,
// then each subscription's, the warnings on stderr, and fails with status
// 2 if the configuration is invalid.
func printConfig(environ []string, wide bool, stdout, stderr io.Writer) error {
	m := config.Environ(environ)
	vars, warnings, err := config.Inspect(m)
	var werr error
	if wide {
		werr = config.WriteTable(stdout, vars)
	} else {
		werr = writeWrapped(stdout, vars, configWidth)
	}
	if werr == nil {
		werr = writeSubscriptions(stdout, m["COURIER_SUBSCRIPTIONS"], config.InspectSubscriptions(m))
	}
	if werr != nil {
		return werr
	}
	for _, w := range warnings {
		fmt.Fprintf(stderr, "courier: warning: %s\n", w.Text)
	}
	if err != nil {
		return invalidConfig(err, nil) // the warnings are above
	}
	// The secrets and token files are read as the sidecar would read them.
	cfg, _ := config.Load(m)
	auth, err := openAppAuth(cfg, nil)
	if err != nil {
		return err
	}
	auth.Close()
	return nil
}

// nameColumn is the width of the variable's column: the longest name and
// two spaces.
func nameColumn(vars []config.Var) int {
	n := 0
	for _, v := range vars {
		n = max(n, len(v.Name))
	}
	return n + 2
}

// writeWrapped writes vars in width columns: a line with the variable and
// its value, then its meaning and default wrapped below it, indented.
func writeWrapped(w io.Writer, vars []config.Var, width int) error {
	const indent = "    "
	col := nameColumn(vars)
	var b strings.Builder
	fmt.Fprintf(&b, "%-*s%s\n", col, "VARIABLE", "VALUE")
	for _, v := range vars {
		value := cell(v.Value, 0)
		if len(v.Problems) > 0 && v.Value != "" {
			value += " (invalid)"
		}
		fmt.Fprintf(&b, "%-*s%s\n", col, v.Name, value)
		about := v.Meaning + ". Default: " + v.Default
		if v.PerSubscription {
			about += "; per subscription"
		}
		for _, line := range wrap(about+".", width-len(indent)) {
			b.WriteString(indent + line + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeSubscriptions writes each subscription's variables: the variable,
// where its value came from, the value.
func writeSubscriptions(w io.Writer, list string, subs []config.SubscriptionVars) error {
	if len(subs) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("\n")
	for _, line := range wrap(fmt.Sprintf("Subscriptions (COURIER_SUBSCRIPTIONS=%s): the variables of one message's path as each subscription has them, and where each value came from: the subscription's own variable, the plain one, or the default.", strings.TrimSpace(list)), configWidth) {
		b.WriteString(line + "\n")
	}
	col, from := nameColumn(subs[0].Vars), len("FROM")
	for _, s := range subs {
		for _, v := range s.Vars {
			from = max(from, len(v.Source))
		}
	}
	for _, s := range subs {
		fmt.Fprintf(&b, "\nsubscription %s\n%-*s%-*s%s\n", s.Name, col, "VARIABLE", from+2, "FROM", "VALUE")
		for _, v := range s.Vars {
			value := cell(v.Value, 0)
			if len(v.Problems) > 0 && v.Value != "" {
				value += " (invalid)"
			}
			fmt.Fprintf(&b, "%-*s%-*s%s\n", col, v.Name, from+2, v.Source, value)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// wrap breaks text into lines of at most width bytes at spaces; a word
// longer than width has a line of its own.
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
