package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/courierhq/courier/internal/editdist"
)

// command is one of courier's subcommands. The table in commands is the one
// place that lists them: run dispatches on it and usage prints it.
type command struct {
	name    string   // as typed; "" is the sidecar
	aliases []string // other spellings, such as --version
	args    string   // what follows the name in the usage line
	summary string   // one line for the usage
	run     func(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{name: "", summary: "run the sidecar (configured by environment variables)", run: runSidecarCommand},
		{name: "config", args: "[--wide]", summary: "print every variable, its meaning, default and value; warn about unknown ones", run: runConfigCommand},
		{name: "dlq", args: "ls|show|replay|purge [--subscription NAME]", summary: "list, show, replay or purge dead letters ('courier dlq help')", run: runDLQ},
		{name: "schedules", args: "ls|cancel", summary: "list or cancel delayed messages waiting for their time ('courier schedules help')", run: runSchedules},
		{name: "pause", args: "[--for D | --until RFC3339] [--subscription NAME]", summary: "pause the durable consumer on the server: every courier of it stops fetching", run: runPause},
		{name: "resume", args: "[--subscription NAME]", summary: "resume the paused durable consumer", run: runResume},
		{name: "rewind", args: "--to-time RFC3339 | --to-seq N [--yes] [--subscription NAME]", summary: "deliver again, as a replay, every message of the stream from a time or sequence on", run: runRewind},
		{name: "status", args: "[--admin HOST:PORT] [--subscription NAME]", summary: "print the consumer's state as the server has it, and the running courier's own: app, breaker, held, in flight, pause", run: runStatus},
		{name: "cleanup", args: "[--dry-run] [--yes] [--force] [--subscription NAME]", summary: "remove the consumer and what courier created for it (never the stream it consumes)", run: runCleanup},
		{name: "demo", summary: "run a self-contained demo on an embedded JetStream server", run: runDemoCommand},
		{name: "version", aliases: []string{"--version", "-version"}, summary: "print version, commit and Go version", run: runVersion},
		{name: "help", aliases: []string{"-h", "--help", "-help"}, summary: "print this help", run: runHelp},
	}
}

// lookup finds the command called name.
func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name || slices.Contains(c.aliases, name) {
			return c, true
		}
	}
	return command{}, false
}

// unknownCommand is the error for name, which no command of the table is
// called: with the closest name, when one is close enough to be what was
// meant (courier statsu: did you mean status?).
func unknownCommand(name string) error {
	var names []string
	for _, c := range commands() {
		if c.name != "" {
			names = append(names, c.name)
		}
	}
	if near := editdist.Closest(strings.ToLower(name), names); near != "" {
		return usageError("unknown command %q: did you mean %q?", name, near)
	}
	return usageError("unknown command %q", name)
}

// usage is the help text, built from the table.
func usage() string {
	var b strings.Builder
	b.WriteString("courier: a resilience sidecar for NATS JetStream.\n\nUsage:\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, c := range commands() {
		line := strings.TrimSpace("courier " + c.name + " " + c.args)
		fmt.Fprintf(tw, "  %s\t%s\n", line, c.summary)
	}
	tw.Flush()
	b.WriteString(`
Environment: see 'courier config'. Admin endpoints on COURIER_ADMIN_ADDR:
/healthz, /readyz, /metrics.
`)
	return b.String()
}

// noArgs refuses arguments to a command that takes none.
func noArgs(name string, args []string) error {
	if len(args) > 0 {
		return usageError("%s takes no arguments (see 'courier help')", strings.TrimSpace("courier "+name))
	}
	return nil
}

func runSidecarCommand(ctx context.Context, _, environ []string, _, stderr io.Writer) error {
	return runSidecar(ctx, environ, stderr)
}

func runConfigCommand(_ context.Context, args, environ []string, stdout, stderr io.Writer) error {
	return runConfigArgs(args, environ, stdout, stderr)
}

func runDemoCommand(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	return runDemo(ctx, args, environ, stdout, stderr)
}

func runVersion(_ context.Context, args, _ []string, stdout, _ io.Writer) error {
	if err := noArgs("version", args); err != nil {
		return err
	}
	_, err := fmt.Fprintln(stdout, versionString())
	return err
}

func runHelp(_ context.Context, _, _ []string, stdout, _ io.Writer) error {
	_, err := fmt.Fprint(stdout, usage())
	return err
}
