package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/printable"
	"github.com/courierhq/courier/schedule"
)

const schedulesUsage = `Usage:
  courier schedules ls [--stream NAME] [--json]
  courier schedules cancel ID...

The delayed messages waiting for their time (published with Courier-Delay or
Courier-Deliver-At; docs/delayed-delivery.md), held by JetStream on
COURIER_SCHEDULE_PREFIX.<STREAM>.<token> in the stream of their subject. Same
environment as the sidecar (COURIER_APP_URL is not needed); they run beside
a live courier.

  ls       one row per schedule, soonest first: its id, when it is due,
           the subject it is delivered to, its idempotency key and its
           sequence; every stream that holds schedules, or --stream's
           (--json: one object per line)
  cancel   remove each schedule ID (as the publish answered it, e.g.
           ORDERS.K3J...), so that it is never delivered. One delivered
           already, or unknown, is not found; one due within a second is
           left to be delivered. Exit status 1 when one was not cancelled.
`

// runSchedules runs `courier schedules ...`.
func runSchedules(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, schedulesUsage)
		return usageError("schedules needs a command: ls or cancel")
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("courier schedules "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	stream := fs.String("stream", "", "")
	asJSON := fs.Bool("json", false, "")
	switch cmd {
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, schedulesUsage)
		return nil
	case "ls", "cancel":
	default:
		fmt.Fprint(stderr, schedulesUsage)
		return usageError("unknown schedules command %q", cmd)
	}
	pos, err := parseInterleaved(fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, schedulesUsage)
		return nil
	case err != nil:
		return usageError("schedules %s: %v (see 'courier schedules help')", cmd, err)
	case cmd == "ls" && len(pos) > 0:
		return usageError("schedules ls takes no arguments (--stream NAME names a stream)")
	case cmd == "cancel" && len(pos) == 0:
		return usageError("schedules cancel needs the id of a schedule, as the publish answered it (see 'courier schedules ls')")
	case cmd == "cancel" && (*stream != "" || *asJSON):
		return usageError("schedules cancel takes ids alone")
	}
	var ids []schedule.ID
	for _, p := range pos {
		id, err := schedule.ParseID(p)
		if err != nil {
			return usageError("schedules cancel: %v", err)
		}
		ids = append(ids, id)
	}
	cfg, err := loadConfigWithoutApp(environ)
	if err != nil {
		return err
	}
	js, closeConn, err := connectCLI(cfg, "schedules", stderr)
	if err != nil {
		return err
	}
	defer closeConn()
	if cmd == "cancel" {
		return cancelSchedules(ctx, js, cfg.SchedulePrefix, ids, stdout, stderr)
	}
	return listSchedules(ctx, js, cfg.SchedulePrefix, *stream, *asJSON, stdout)
}

// listSchedules prints the schedules waiting in stream, or in every stream
// that holds them.
func listSchedules(ctx context.Context, js jetstream.JetStream, prefix, stream string, asJSON bool, stdout io.Writer) error {
	streams := []string{stream}
	if stream == "" {
		var err error
		if streams, err = schedule.Streams(ctx, js, prefix); err != nil {
			return fmt.Errorf("listing the streams: %w", err)
		}
	}
	var all []schedule.Info
	for _, s := range streams {
		infos, err := schedule.List(ctx, js, prefix, s)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("stream %q not found", s)
		}
		if err != nil {
			return fmt.Errorf("listing the schedules of stream %s: %w", s, err)
		}
		all = append(all, infos...)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		for _, i := range all {
			if err := enc.Encode(scheduleJSON{ID: i.ID.String(), Stream: i.ID.Stream, Seq: i.Seq, Stored: i.Stored,
				Subject: i.Target, DeliverAt: i.DeliverAt, Key: i.Key}); err != nil {
				return err
			}
		}
		return nil
	}
	if len(all) == 0 {
		_, err := fmt.Fprintf(stdout, "no delayed message waiting (under %s.<STREAM>.>)\n", prefix)
		return err
	}
	now := time.Now()
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tDELIVER AT\tIN\tSUBJECT\tKEY\tSEQ")
	for _, i := range all {
		in := i.DeliverAt.Sub(now).Round(time.Second).String()
		if !i.DeliverAt.After(now) {
			in = "due"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\n", i.ID, i.DeliverAt.Format(time.RFC3339), in, printable.Line(i.Target, 0), printable.Line(i.Key, 80), i.Seq)
	}
	return w.Flush()
}

// scheduleJSON is the --json form of a schedule.
type scheduleJSON struct {
	ID        string    `json:"id"`
	Stream    string    `json:"stream"`
	Seq       uint64    `json:"seq"`
	Stored    time.Time `json:"stored"`
	Subject   string    `json:"subject"`
	DeliverAt time.Time `json:"deliver_at"`
	Key       string    `json:"key,omitempty"`
}

// cancelSchedules cancels each of ids, saying what became of each; exit
// status 1 when one was not cancelled.
func cancelSchedules(ctx context.Context, js jetstream.JetStream, prefix string, ids []schedule.ID, stdout, stderr io.Writer) error {
	failed := 0
	for _, id := range ids {
		info, err := schedule.Cancel(ctx, js, prefix, id, time.Now())
		if err != nil {
			failed++
			fmt.Fprintf(stderr, "courier: not cancelled: %v\n", err)
			continue
		}
		fmt.Fprintf(stdout, "cancelled %s: %s, due %s\n", id, printable.Line(info.Target, 0), info.DeliverAt.Format(time.RFC3339Nano))
	}
	if failed > 0 {
		return &exitError{code: 1, err: fmt.Errorf("%d of %d schedules not cancelled", failed, len(ids))}
	}
	return nil
}
