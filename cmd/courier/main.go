// Command courier is a resilience sidecar for NATS JetStream: it consumes a
// durable consumer and POSTs each message to a local app, retrying the
// transient, deduplicating the duplicate and dead-lettering the hopeless.
//
// With no arguments it runs the sidecar, configured by environment variables
// (see `courier config`).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitError carries a process exit status; its message (if any) has been
// printed already or is printed by exitCode.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageError: exit 2.
func usageError(format string, a ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, a...)}
}

// exitCode prints err as one line and maps it to a status: 0 ok, 2 bad
// configuration or usage, 1 anything else retrying cannot fix.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "courier: %v\n", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return 1
}

const usage = `courier: a resilience sidecar for NATS JetStream.

Usage:
  courier              run the sidecar (configured by environment variables)
  courier config       print every variable, its meaning, default and value in effect
  courier demo         run a self-contained demo on an embedded JetStream server
  courier dlq          list, show, replay or purge dead letters ('courier dlq help')
  courier version      print version information
  courier help         print this help

Environment: see 'courier config'. Admin endpoints on COURIER_ADMIN_ADDR:
/healthz, /readyz, /metrics.
`

// run is the whole program, testable in-process.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cmd := ""
	if len(args) > 0 {
		cmd = args[0]
	}
	switch cmd {
	case "":
		return runSidecar(ctx, environ, stderr)
	case "config":
		return runConfig(environ, stdout, stderr)
	case "demo":
		return runDemo(ctx, args[1:], stdout, stderr)
	case "dlq":
		return runDLQ(ctx, args[1:], environ, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, versionString())
		return nil
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return usageError("unknown command %q", cmd)
	}
}
