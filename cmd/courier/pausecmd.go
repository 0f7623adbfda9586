package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/partition"
)

const pauseUsage = `Usage:
  courier pause [--for D | --until RFC3339]
  courier resume
  courier status

pause and resume pause the durable consumer COURIER_CONSUMER on the server
(JetStream consumer pause, nats-server 2.11 or later), so every courier of
it stops fetching at once: in-flight requests finish, what courier holds
stays in progress, and a courier that starts or restarts keeps the pause.
Without --for or --until, the pause lasts until 'courier resume' (a year).
status prints the consumer's state. Same environment as the sidecar;
COURIER_APP_URL is not needed.
`

// connectCLI connects a command that runs beside a live sidecar.
func connectCLI(cfg config.Config, name string, stderr io.Writer) (jetstream.JetStream, func(), error) {
	log := newLogger(cfg, stderr).With("component", name)
	nopts, err := natsOptions(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	nc, js, err := dialCommand(cfg, nopts, "courier "+name)
	if err != nil {
		return nil, nil, err
	}
	return js, nc.Close, nil
}

// consumerCommand loads the configuration and connects for pause, resume
// and status.
func consumerCommand(name string, environ []string, stderr io.Writer) (config.Config, jetstream.JetStream, func(), error) {
	cfg, err := loadConfigWithoutApp(environ)
	if err != nil {
		return cfg, nil, nil, err
	}
	if !cfg.ConsumesStream() {
		return cfg, nil, nil, usageError("%s needs COURIER_STREAM (and COURIER_CONSUMER, default courier)", name)
	}
	js, closeConn, err := connectCLI(cfg, name, stderr)
	return cfg, js, closeConn, err
}

// runPause runs `courier pause`.
func runPause(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("courier pause", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	forD := fs.Duration("for", 0, "")
	until := fs.String("until", "", "")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, pauseUsage)
		return nil
	} else if err != nil {
		return usageError("pause: %v (see 'courier pause --help')", err)
	}
	end, err := pauseEnd(*forD, *until, time.Now())
	if err != nil {
		return err
	}
	cfg, js, closeConn, err := consumerCommand("pause", environ, stderr)
	if err != nil {
		return err
	}
	defer closeConn()
	if partitioned(cfg) {
		return pausePartitioned(ctx, js, cfg, end, stdout)
	}
	resp, err := js.PauseConsumer(ctx, cfg.Stream, cfg.Consumer, end)
	if err != nil {
		if why := missingConsumer(ctx, js, cfg); why != nil {
			return why
		}
		return fmt.Errorf("cannot pause consumer %q on stream %q (consumer pause needs nats-server 2.11 or later): %w", cfg.Consumer, cfg.Stream, err)
	}
	fmt.Fprintf(stdout, "paused %s/%s until %s\n", cfg.Stream, cfg.Consumer, resp.PauseUntil.UTC().Format(time.RFC3339))
	return nil
}

// pauseEnd is when a pause asked with --for or --until ends.
func pauseEnd(forD time.Duration, until string, now time.Time) (time.Time, error) {
	switch {
	case forD != 0 && until != "":
		return time.Time{}, usageError("pause: give --for or --until, not both")
	case forD < 0:
		return time.Time{}, usageError("pause: --for must be positive (got %s)", forD)
	case forD > 0:
		return now.Add(forD), nil
	case until != "":
		t, err := time.Parse(time.RFC3339, until)
		if err != nil {
			return time.Time{}, usageError("pause: --until %q is not an RFC 3339 time (e.g. 2026-12-01T08:00:00Z)", until)
		}
		if !t.After(now) {
			return time.Time{}, usageError("pause: --until %s is not in the future", until)
		}
		return t, nil
	}
	return now.Add(365 * 24 * time.Hour), nil
}

// runResume runs `courier resume`.
func runResume(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "--help" {
			fmt.Fprint(stdout, pauseUsage)
			return nil
		}
		return usageError("resume takes no arguments")
	}
	cfg, js, closeConn, err := consumerCommand("resume", environ, stderr)
	if err != nil {
		return err
	}
	defer closeConn()
	if partitioned(cfg) {
		return pausePartitioned(ctx, js, cfg, time.Time{}, stdout)
	}
	if _, err := js.ResumeConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		if why := missingConsumer(ctx, js, cfg); why != nil {
			return why
		}
		return fmt.Errorf("cannot resume consumer %q on stream %q: %w", cfg.Consumer, cfg.Stream, err)
	}
	fmt.Fprintf(stdout, "resumed %s/%s\n", cfg.Stream, cfg.Consumer)
	return nil
}

// runStatus runs `courier status`.
func runStatus(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "--help" {
			fmt.Fprint(stdout, pauseUsage)
			return nil
		}
		return usageError("status takes no arguments")
	}
	cfg, js, closeConn, err := consumerCommand("status", environ, stderr)
	if err != nil {
		return err
	}
	defer closeConn()
	deadLetters := "unknown"
	if n, err := dlq.Depth(ctx, js, cfg.DLQSubject); err == nil {
		deadLetters = fmt.Sprint(n)
	}
	if partitioned(cfg) {
		d, err := partition.Find(ctx, js, cfg.Stream, cfg.Consumer)
		if err != nil {
			return err
		}
		if d == nil {
			return missingConsumer(ctx, js, cfg)
		}
		return printPartitionStatus(ctx, js, cfg, d, deadLetters, stdout)
	}
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		if why := missingConsumer(ctx, js, cfg); why != nil {
			return why
		}
		return fmt.Errorf("consumer %q on stream %q: %w", cfg.Consumer, cfg.Stream, err)
	}
	info := cons.CachedInfo()
	paused := "no"
	if info.Paused && info.Config.PauseUntil != nil {
		paused = "until " + info.Config.PauseUntil.UTC().Format(time.RFC3339)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "consumer\t%s/%s\n", cfg.Stream, cfg.Consumer)
	fmt.Fprintf(w, "paused\t%s\n", paused)
	fmt.Fprintf(w, "pending\t%d\n", info.NumPending)
	fmt.Fprintf(w, "ack pending\t%d\n", info.NumAckPending)
	fmt.Fprintf(w, "redelivered\t%d\n", info.NumRedelivered)
	fmt.Fprintf(w, "waiting pulls\t%d\n", info.NumWaiting)
	fmt.Fprintf(w, "dead letters\t%s (%s)\n", deadLetters, cfg.DLQSubject)
	fmt.Fprintf(w, "in-flight limit\t%s (COURIER_MAX_INFLIGHT, each courier's own)\n", inflightText(cfg))
	if r := lastRewind(ctx, js, cfg); r != nil {
		fmt.Fprintf(w, "rewind\t%s\n", rewindProgress(*r, info.AckFloor.Stream))
	}
	for _, g := range info.PriorityGroups {
		// Order per key pins the durable to one courier at a time, which
		// puts its name with its pin in the membership bucket.
		pinned := "nobody (the next courier to pull takes it)"
		if g.PinnedClientID != "" {
			pinned = pinHolder(ctx, js, cfg, g.PinnedClientID) + " since " + g.PinnedTS.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "pinned (%s)\t%s\n", g.Group, pinned)
	}
	return w.Flush()
}

// pinHolder names the courier holding pin: the instance (host or pod name)
// that put it in the durable's membership bucket, else the pin id.
func pinHolder(ctx context.Context, js jetstream.JetStream, cfg config.Config, pin string) string {
	members, _ := partition.ReadMembers(ctx, js, partition.MembersBucket(cfg.Stream, cfg.Consumer))
	for _, m := range members {
		if slices.Contains(slices.Collect(maps.Values(m.Pins)), pin) {
			return m.Instance
		}
	}
	return "pin " + pin + " (a courier not in the membership: stopped, not yet reporting, or older than this one)"
}
