package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/subject"
)

// dlqUsage is the help of `courier dlq`; it lists dlq.Reasons.
func dlqUsage() string {
	return `Usage:
  courier dlq ls [--reason R] [--subject S] [--since DURATION|RFC3339] [--json]
  courier dlq show [--json] SEQ
  courier dlq show [--json] --original SEQ
  courier dlq replay [--reason R] [--subject S] [--since T] [--limit N] [--rate N] [--dry-run] [SEQ...]
  courier dlq purge [--reason R] [--subject S] [--since T] [--limit N] --yes [SEQ...]

The dead letters of COURIER_STREAM's consumer COURIER_CONSUMER, stored on
COURIER_DLQ_SUBJECT, in the same environment as the sidecar (COURIER_APP_URL
is not needed). The commands run beside a live sidecar: they open neither
the admin address nor the dedup store. SEQ is a dead letter's own sequence
in the dead-letter stream; ORIG_STREAM and ORIG_SEQ are where its original
is (or was) in the stream courier consumes.

  ls       one row per dead letter: sequence, the original's stream and
           sequence, time stored, reason, last HTTP status, original
           subject, attempts, error (--json: one object per line, with
           "seq", "stream", "stream_seq", the original's headers and body)
  show     one dead letter: its envelope, the original's headers and body.
           SEQ is the dead letter's sequence; with --original, SEQ is the
           original's sequence in COURIER_STREAM (every dead letter of it
           is shown). A dead letter too large to carry its original's body
           refers to it: show reads the body from COURIER_STREAM, or says
           it is gone.
  replay   republish to the original subject the body and headers as the
           publisher sent them (an original whose key courier derived gets
           that key in COURIER_IDEMPOTENCY_HEADER, so the app sees the same
           key), and remove each dead letter once its republish is
           acknowledged. With no arguments it replays every dead letter of
           this consumer. A republish the source stream calls a duplicate
           of the original (its Nats-Msg-Id still inside the duplicate
           window), or of another message stored under the same id, keeps
           the dead letter and says why and when to retry. A dead letter
           whose subject NATS reserves ($JS., $KV., _INBOX., ...) or is not
           among COURIER_STREAM's subjects is refused: never republished,
           kept, reported (courier writes no such dead letter). A line per
           dead letter and, on a long run, progress go to stderr; the
           summary "replayed N, kept M (duplicate window), failed K" (and
           ", refused R" when some were) to stdout (--dry-run: the plan, a
           line per dead letter, to stdout). Exit status 0 when all were
           replayed, 1 when some were not.
  purge    delete the selected dead letters for good; needs --yes.

Filters (all must hold):
  --reason R     Courier-Reason, one of: ` + strings.Join(dlq.Reasons(), ", ") + `
  --subject S    original subject, NATS wildcards allowed (orders.*, orders.>)
  --since T      stored within the last DURATION (1h30m) or since an RFC 3339 time
  SEQ...         only these dead-letter stream sequences
`
}

// dlqPlaceholderAppURL stands in for COURIER_APP_URL, which config requires
// and the dlq commands never use.
const dlqPlaceholderAppURL = "http://courier-dlq.invalid/"

// runDLQ runs `courier dlq ...`.
func runDLQ(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, dlqUsage())
		return usageError("dlq needs a command: ls, show, replay or purge")
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, dlqUsage())
		return nil
	case "ls", "show", "replay", "purge":
	default:
		fmt.Fprint(stderr, dlqUsage())
		return usageError("unknown dlq command %q", cmd)
	}
	req, err := parseDLQ(cmd, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, dlqUsage())
		return nil
	}
	if err != nil {
		return err
	}

	cfg, err := loadConfig(dlqEnviron(environ))
	if err != nil {
		return err
	}
	q, closeNATS, err := openDLQ(ctx, cfg, cmd, stderr)
	if err != nil {
		return err
	}
	defer closeNATS()
	sel := req.sel
	sel.Stream, sel.Consumer = cfg.Stream, cfg.Consumer

	switch cmd {
	case "ls":
		return dlqList(ctx, q, sel, req.asJSON, stdout)
	case "show":
		if req.original {
			return dlqShowOriginal(ctx, q, sel, req.asJSON, stdout)
		}
		return dlqShow(ctx, q, sel.Sequences[0], req.asJSON, stdout)
	case "replay":
		return dlqReplay(ctx, q, sel, dlq.ReplayOptions{Limit: req.limit, Rate: req.rate, DryRun: req.dryRun, IdempotencyHeader: cfg.IdempotencyHeader}, stdout, stderr)
	default:
		return dlqPurge(ctx, q, sel, req.limit, stdout, stderr)
	}
}

// dlqRequest is a dlq command's flags and arguments, checked.
type dlqRequest struct {
	sel      dlq.Selection // without the stream and consumer
	asJSON   bool
	limit    int
	rate     float64
	dryRun   bool
	original bool
}

// parseDLQ parses and checks the flags and arguments of the dlq command cmd:
// everything the user can get wrong is checked before connecting. It returns
// flag.ErrHelp when help was asked for.
func parseDLQ(cmd string, args []string) (dlqRequest, error) {
	fs := flag.NewFlagSet("courier dlq "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		r       dlqRequest
		f       dlqFilters
		confirm bool
	)
	if cmd != "show" {
		fs.StringVar(&f.reason, "reason", "", "")
		fs.StringVar(&f.subject, "subject", "", "")
		fs.StringVar(&f.since, "since", "", "")
	}
	switch cmd {
	case "ls":
		fs.BoolVar(&r.asJSON, "json", false, "")
	case "show":
		fs.BoolVar(&r.asJSON, "json", false, "")
		fs.BoolVar(&r.original, "original", false, "")
	case "replay":
		fs.IntVar(&r.limit, "limit", 0, "")
		fs.Float64Var(&r.rate, "rate", 0, "")
		fs.BoolVar(&r.dryRun, "dry-run", false, "")
	case "purge":
		fs.IntVar(&r.limit, "limit", 0, "")
		fs.BoolVar(&confirm, "yes", false, "")
	}
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return r, err
	}
	if err != nil {
		return r, usageError("dlq %s: %v (see 'courier dlq help')", cmd, err)
	}

	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "reason", "subject", "since":
			f.given = append(f.given, fl.Name)
		}
	})
	if r.sel, err = f.selection(pos, time.Now()); err != nil {
		return r, usageError("dlq %s: %v", cmd, err)
	}
	switch {
	case cmd == "ls" && len(pos) > 0:
		return r, usageError("dlq ls takes no arguments, only flags (use 'courier dlq show SEQ' for one)")
	case cmd == "show" && len(pos) != 1:
		return r, usageError("dlq show takes exactly one sequence: a dead letter's, or with --original its original's in COURIER_STREAM")
	case r.limit < 0:
		return r, usageError("dlq %s: --limit must not be negative", cmd)
	case r.rate < 0:
		return r, usageError("dlq %s: --rate must not be negative", cmd)
	case cmd == "purge" && !confirm:
		return r, usageError("dlq purge deletes dead letters for good: add --yes to confirm (see first what is selected with 'courier dlq ls' and the same filters)")
	}
	return r, nil
}

// openDLQ connects to NATS as the dlq command cmd and opens the dead-letter
// queue; the func it returns closes the connection.
func openDLQ(ctx context.Context, cfg config.Config, cmd string, stderr io.Writer) (*dlq.Queue, func(), error) {
	log := newLogger(cfg, stderr).With("component", "dlq")
	opts, err := natsOptions(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	nc, js, err := dialCommand(cfg, opts, "courier dlq "+cmd)
	if err != nil {
		return nil, nil, err
	}
	q, err := dlq.Open(ctx, js, cfg.DLQSubject)
	if errors.Is(err, dlq.ErrNoStream) {
		// A misspelt COURIER_STREAM or COURIER_CONSUMER makes another
		// dead-letter subject: say so first.
		if why := missingStream(ctx, js, cfg.Stream); why != nil {
			err = fmt.Errorf("%w: no dead letters of it", why)
		} else {
			err = fmt.Errorf("no stream captures the dead-letter subject %q (COURIER_DLQ_SUBJECT): no dead letter was ever stored with this configuration (the sidecar creates the stream when it starts)%s", cfg.DLQSubject, otherConsumers(ctx, js, cfg))
		}
	}
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return q, nc.Close, nil
}

// dlqEnviron fills COURIER_APP_URL with a placeholder when it is unset, so
// that config.Load accepts an environment without it.
func dlqEnviron(environ []string) []string {
	if config.Environ(environ)["COURIER_APP_URL"] != "" {
		return environ
	}
	out := make([]string, 0, len(environ)+1)
	for _, kv := range environ {
		if k, _, _ := strings.Cut(kv, "="); k != "COURIER_APP_URL" {
			out = append(out, kv)
		}
	}
	return append(out, "COURIER_APP_URL="+dlqPlaceholderAppURL)
}

// parseInterleaved parses flags and positional arguments in any order.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// dlqFilters are the filter flags as given.
type dlqFilters struct {
	reason, subject, since string
	given                  []string // the names of the filter flags given
}

// selection checks the filters and positional sequences and builds the
// Selection (without the stream and consumer).
func (f dlqFilters) selection(seqs []string, now time.Time) (dlq.Selection, error) {
	sel := dlq.Selection{Reason: strings.TrimSpace(f.reason), Subject: strings.TrimSpace(f.subject)}
	// A filter given empty ("--reason \"$R\"" with R unset) is not "no
	// filter": purge would delete every dead letter.
	for _, name := range f.given {
		if v := map[string]string{"reason": f.reason, "subject": f.subject, "since": f.since}[name]; strings.TrimSpace(v) == "" {
			return sel, fmt.Errorf("--%s is empty: give a value, or leave the flag out to select every dead letter", name)
		}
	}
	if sel.Reason != "" && !slices.Contains(dlq.Reasons(), sel.Reason) {
		return sel, fmt.Errorf("--reason %q is not a reason courier writes; use one of: %s", sel.Reason, strings.Join(dlq.Reasons(), ", "))
	}
	if sel.Subject != "" {
		if err := subject.Check(sel.Subject); err != nil {
			return sel, fmt.Errorf("--subject: %w", err)
		}
	}
	if s := strings.TrimSpace(f.since); s != "" {
		since, err := parseSince(s, now)
		if err != nil {
			return sel, err
		}
		sel.Since = since
	}
	for _, s := range seqs {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n == 0 {
			return sel, fmt.Errorf("%q is not a dead-letter sequence (a positive integer)", s)
		}
		if !slices.Contains(sel.Sequences, n) { // a sequence given twice is one dead letter
			sel.Sequences = append(sel.Sequences, n)
		}
	}
	return sel, nil
}

// parseSince reads --since: a duration back from now, or an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--since %q: a duration must not be negative", s)
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--since %q: expected a duration such as 1h30m or an RFC 3339 time such as 2025-06-01T12:00:00Z", s)
}
