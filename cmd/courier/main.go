// Command courier is a resilience sidecar for NATS JetStream: it consumes a
// durable consumer and POSTs each message to a local app, retrying the
// transient, deduplicating the duplicate and dead-lettering the hopeless.
//
// With no arguments it runs the sidecar, configured by environment variables
// (see `courier config`); the other commands are in commands.go.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

// defaultGCPercent is the garbage collector's target (GOGC) when the
// environment sets none. courier's live heap is small and what it allocates
// per message is short-lived, so Go's default (100: the heap may grow to
// twice what is live) is mostly garbage awaiting collection; 50 keeps the
// peak resident memory of a drain about 4 MiB lower for a few percent more
// CPU per message (README, "Operating it", the footprint).
const defaultGCPercent = 50

func main() {
	tuneGC(os.Getenv)
	ctx, stop := notifyStop(context.Background())
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// tuneGC sets the garbage collector's target to defaultGCPercent unless
// GOGC is set (an operator's choice, which the runtime has applied).
// GOMEMLIMIT, which the Kubernetes example sets, works alongside it.
func tuneGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
}

// stopSignal is the cause of run's context when a signal (SIGTERM, SIGINT)
// stops courier: the sidecar says "stop signal received" only then, and
// not when its caller (the demo, a test) stops it.
type stopSignal struct{ sig os.Signal }

func (s stopSignal) Error() string { return s.sig.String() + " signal received" }

// notifyStop returns a context cancelled, with a stopSignal as its cause,
// at the first SIGTERM or SIGINT; stop releases the signals and waits for
// the goroutine it started. (signal.NotifyContext's cause says the same,
// but is of a type that cannot be told from other causes but by its text.)
func notifyStop(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case sig := <-ch:
			cancel(stopSignal{sig})
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		cancel(nil)
		<-done
	}
}

// run is the whole program, testable in-process: it runs the command args
// names (the sidecar when there is none).
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	name := ""
	if len(args) > 0 {
		name, args = args[0], args[1:]
	}
	cmd, ok := lookup(name)
	if !ok {
		fmt.Fprint(stderr, usage())
		return unknownCommand(name)
	}
	if takesSubscription(cmd.name) {
		var err error
		if args, environ, err = chooseSubscription(cmd.name, args, environ); err != nil {
			return err
		}
	}
	return cmd.run(ctx, args, environ, stdout, stderr)
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
