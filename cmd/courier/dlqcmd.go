package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
           the dead letter and says why and when to retry. A line per dead
           letter and, on a long run, progress go to stderr; the summary
           "replayed N, kept M (duplicate window), failed K" to stdout
           (--dry-run: the plan, a line per dead letter, to stdout). Exit
           status 0 when all were replayed, 1 when some were not.
  purge    delete the selected dead letters for good; needs --yes.

Filters (all must hold):
  --reason R     Courier-Reason, one of: ` + strings.Join(dlq.Reasons(), ", ") + `
  --subject S    original subject, NATS wildcards allowed (orders.*, orders.>)
  --since T      stored within the last DURATION (1h30m) or since an RFC 3339 time
  SEQ...         only these dead-letter stream sequences
`
}

// replayProgressEvery is how often a replay reports progress on stderr,
// besides its line per dead letter: every so many dead letters or every
// second, whichever comes first.
const replayProgressEvery = 100

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

	fs := flag.NewFlagSet("courier dlq "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		f        dlqFilters
		asJSON   bool
		limit    int
		rate     float64
		dryRun   bool
		confirm  bool
		original bool
	)
	if cmd != "show" {
		fs.StringVar(&f.reason, "reason", "", "")
		fs.StringVar(&f.subject, "subject", "", "")
		fs.StringVar(&f.since, "since", "", "")
	}
	switch cmd {
	case "ls":
		fs.BoolVar(&asJSON, "json", false, "")
	case "show":
		fs.BoolVar(&asJSON, "json", false, "")
		fs.BoolVar(&original, "original", false, "")
	case "replay":
		fs.IntVar(&limit, "limit", 0, "")
		fs.Float64Var(&rate, "rate", 0, "")
		fs.BoolVar(&dryRun, "dry-run", false, "")
	case "purge":
		fs.IntVar(&limit, "limit", 0, "")
		fs.BoolVar(&confirm, "yes", false, "")
	}
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, dlqUsage())
		return nil
	}
	if err != nil {
		return usageError("dlq %s: %v (see 'courier dlq help')", cmd, err)
	}

	// Everything the user can get wrong is checked before connecting.
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "reason", "subject", "since":
			f.given = append(f.given, fl.Name)
		}
	})
	sel, err := f.selection(pos, time.Now())
	if err != nil {
		return usageError("dlq %s: %v", cmd, err)
	}
	switch {
	case cmd == "ls" && len(pos) > 0:
		return usageError("dlq ls takes no arguments, only flags (use 'courier dlq show SEQ' for one)")
	case cmd == "show" && len(pos) != 1:
		return usageError("dlq show takes exactly one sequence: a dead letter's, or with --original its original's in COURIER_STREAM")
	case limit < 0:
		return usageError("dlq %s: --limit must not be negative", cmd)
	case rate < 0:
		return usageError("dlq %s: --rate must not be negative", cmd)
	case cmd == "purge" && !confirm:
		return usageError("dlq purge deletes dead letters for good: add --yes to confirm (see first what is selected with 'courier dlq ls' and the same filters)")
	}

	cfg, err := loadConfig(dlqEnviron(environ))
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr).With("component", "dlq")
	opts, err := natsOptions(cfg, log)
	if err != nil {
		return err
	}
	opts = append(opts, nats.Name("courier dlq "+cmd+" "+cfg.Stream+"/"+cfg.Consumer))
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		if fatal := fatalConnectError(err); fatal != nil {
			return fatal
		}
		return fmt.Errorf("cannot connect to NATS at %s: %w", cfg.Redacted().NATSURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	q, err := dlq.Open(ctx, js, cfg.DLQSubject)
	if errors.Is(err, dlq.ErrNoStream) {
		return fmt.Errorf("no stream captures the dead-letter subject %q (COURIER_DLQ_SUBJECT): no dead letter was ever stored with this configuration (the sidecar creates the stream when it starts)", cfg.DLQSubject)
	}
	if err != nil {
		return err
	}
	sel.Stream, sel.Consumer = cfg.Stream, cfg.Consumer

	switch cmd {
	case "ls":
		return dlqList(ctx, q, sel, asJSON, stdout)
	case "show":
		if original {
			return dlqShowOriginal(ctx, q, sel, asJSON, stdout)
		}
		return dlqShow(ctx, q, sel.Sequences[0], asJSON, stdout)
	case "replay":
		return dlqReplay(ctx, q, sel, dlq.ReplayOptions{Limit: limit, Rate: rate, DryRun: dryRun, IdempotencyHeader: cfg.IdempotencyHeader}, stdout, stderr)
	default:
		return dlqPurge(ctx, q, sel, limit, stdout, stderr)
	}
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

// dlqList writes the selected dead letters as a table, or as JSON lines.
func dlqList(ctx context.Context, q *dlq.Queue, sel dlq.Selection, asJSON bool, stdout io.Writer) error {
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false)
		for d, err := range q.All(ctx, sel) {
			if err != nil {
				return err
			}
			if err := enc.Encode(letterJSON(d, nil)); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tORIG_STREAM\tORIG_SEQ\tTIME\tREASON\tSTATUS\tSUBJECT\tATTEMPTS\tERROR")
	var listErr error
	for d, err := range q.All(ctx, sel) {
		if err != nil {
			listErr = err
			break
		}
		status := "-"
		if d.Status != 0 {
			status = strconv.Itoa(d.Status)
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\n", d.Sequence, cell(d.Stream, 32), d.StreamSequence,
			d.Time.UTC().Format(time.RFC3339), cell(d.Reason, 24), status, cell(d.Subject, 60), d.Attempts, cell(d.Error, 80))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return listErr
}

// cell makes s fit a table cell: valid UTF-8, no tabs or control
// characters, at most n runes, "-" when empty.
func cell(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if s == "" {
		return "-"
	}
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n-1]) + "…"
	}
	return s
}

// deadLetterJSON is the --json form of a dead letter.
type deadLetterJSON struct {
	Seq        uint64              `json:"seq"`
	Time       time.Time           `json:"time"`
	Reason     string              `json:"reason"`
	Status     int                 `json:"status,omitempty"`
	Subject    string              `json:"subject"`
	SubjectB64 string              `json:"subject_base64,omitempty"`
	Attempts   int                 `json:"attempts"`
	Error      string              `json:"error,omitempty"`
	Stream     string              `json:"stream"`
	StreamSeq  uint64              `json:"stream_seq"`
	Consumer   string              `json:"consumer"`
	FailedAt   *time.Time          `json:"failed_at,omitempty"`
	Published  *time.Time          `json:"published,omitempty"`
	Headers    map[string][]string `json:"headers"`
	Body       *string             `json:"body,omitempty"`
	BodyBase64 *string             `json:"body_base64,omitempty"`
	// BodyOmitted: a reference dead letter; Body is the original's, read
	// from its stream, or absent (BodyError says why).
	BodyOmitted bool   `json:"body_omitted,omitempty"`
	BodySize    int    `json:"body_size,omitempty"`
	BodyError   string `json:"body_error,omitempty"`
}

// letterJSON converts d. Headers are the original's as stored; the body is
// text when it is valid UTF-8, else base64. A subject that is not valid
// UTF-8 is also given exactly, in base64. For a reference dead letter
// (d.BodyOmitted) the body is included only if it was loaded; bodyErr says
// why it was not.
func letterJSON(d *dlq.DeadLetter, bodyErr error) deadLetterJSON {
	j := deadLetterJSON{
		Seq: d.Sequence, Time: d.Time.UTC(), Reason: d.Reason, Status: d.Status, Subject: strings.ToValidUTF8(d.Subject, "\uFFFD"),
		Attempts: d.Attempts, Error: d.Error, Stream: d.Stream, StreamSeq: d.StreamSequence, Consumer: d.Consumer,
		Headers: d.Original(), BodyOmitted: d.BodyOmitted, BodySize: d.BodySize,
	}
	if !utf8.ValidString(d.Subject) {
		j.SubjectB64 = base64.StdEncoding.EncodeToString([]byte(d.Subject))
	}
	if d.BodyOmitted && (bodyErr != nil || d.Data == nil) {
		if bodyErr != nil {
			j.BodyError = bodyErr.Error()
		}
		return withTimes(j, d)
	}
	j = withTimes(j, d)
	if utf8.Valid(d.Data) {
		s := string(d.Data)
		j.Body = &s
	} else {
		s := base64.StdEncoding.EncodeToString(d.Data)
		j.BodyBase64 = &s
	}
	return j
}

// withTimes sets the optional times of j from d.
func withTimes(j deadLetterJSON, d *dlq.DeadLetter) deadLetterJSON {
	if !d.FailedAt.IsZero() {
		t := d.FailedAt.UTC()
		j.FailedAt = &t
	}
	if !d.Published.IsZero() {
		t := d.Published.UTC()
		j.Published = &t
	}
	return j
}

// dlqShowOriginal writes every dead letter of the original at
// sel.Sequences[0] in COURIER_STREAM (usually one; more if the stream was
// created again and its sequences restarted).
func dlqShowOriginal(ctx context.Context, q *dlq.Queue, sel dlq.Selection, asJSON bool, stdout io.Writer) error {
	seq := sel.Sequences[0]
	sel.Sequences = nil
	sel.Originals = []uint64{seq}
	letters, err := q.List(ctx, sel)
	if err != nil {
		return err
	}
	if len(letters) == 0 {
		return fmt.Errorf("%w: no dead letter of sequence %d of stream %q (consumer %q)", dlq.ErrNotFound, seq, sel.Stream, sel.Consumer)
	}
	for i, d := range letters {
		if i > 0 && !asJSON {
			fmt.Fprintln(stdout)
		}
		if err := showLetter(ctx, q, d, asJSON, stdout); err != nil {
			return err
		}
	}
	return nil
}

// dlqShow writes one dead letter in full.
func dlqShow(ctx context.Context, q *dlq.Queue, seq uint64, asJSON bool, stdout io.Writer) error {
	d, err := q.Show(ctx, seq)
	if err != nil {
		return err
	}
	return showLetter(ctx, q, d, asJSON, stdout)
}

// showLetter writes d in full; a reference dead letter's body is read from
// the source stream.
func showLetter(ctx context.Context, q *dlq.Queue, d *dlq.DeadLetter, asJSON bool, stdout io.Writer) error {
	loadErr := q.Load(ctx, d)
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false)
		return enc.Encode(letterJSON(d, loadErr))
	}
	fmt.Fprintf(stdout, "Dead letter %d (stream %s, subject %s)\n", d.Sequence, q.StreamName(), q.Subject())
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(stdout, "  %-10s %s\n", k, cell(v, 1<<20))
		}
	}
	opt := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	row("stored", opt(d.Time))
	row("reason", d.Reason)
	if d.Status != 0 {
		row("status", strconv.Itoa(d.Status))
	}
	row("error", d.Error)
	row("attempts", strconv.Itoa(d.Attempts))
	row("failed at", opt(d.FailedAt))
	row("consumer", d.Consumer)
	fmt.Fprintln(stdout, "Original")
	row("subject", d.Subject)
	row("stream", d.Stream)
	row("sequence", strconv.FormatUint(d.StreamSequence, 10))
	row("published", opt(d.Published))
	h := d.Original()
	switch {
	case d.HeadersOmitted && loadErr != nil:
		fmt.Fprintln(stdout, "Headers: not in the dead letter (too large), and not readable from the stream")
	case len(h) == 0:
		fmt.Fprintln(stdout, "Headers: none")
	default:
		fmt.Fprintln(stdout, "Headers")
	}
	for _, name := range slices.Sorted(maps.Keys(h)) {
		for _, v := range h[name] {
			fmt.Fprintf(stdout, "  %s: %s\n", name, v)
		}
	}
	if d.BodyOmitted {
		where := fmt.Sprintf("stream %s sequence %d", d.Stream, d.StreamSequence)
		if loadErr != nil {
			_, err := fmt.Fprintf(stdout, "Body (%d bytes): not in the dead letter (too large to carry); it was left in %s, but cannot be read there: %v\n", d.BodySize, where, loadErr)
			return err
		}
		fmt.Fprintf(stdout, "Body: not in the dead letter (too large to carry); read from %s\n", where)
	}
	if isText(d.Data) {
		fmt.Fprintf(stdout, "Body (%d bytes)\n%s", len(d.Data), d.Data)
		if len(d.Data) > 0 && d.Data[len(d.Data)-1] != '\n' {
			fmt.Fprintln(stdout)
		}
		return nil
	}
	_, err := fmt.Fprintf(stdout, "Body (%d bytes, not text: quoted)\n%s\n", len(d.Data), strconv.Quote(string(d.Data)))
	return err
}

// isText reports whether b prints safely on a terminal as it is.
func isText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\n' && r != '\r' && r != '\t' {
			return false
		}
	}
	return true
}

// dlqReplay replays the selection: a line per dead letter and periodic
// progress on stderr, the summary on stdout. A dry run writes its plan, a
// line per dead letter, to stdout.
func dlqReplay(ctx context.Context, q *dlq.Queue, sel dlq.Selection, opts dlq.ReplayOptions, stdout, stderr io.Writer) error {
	handled := 0
	var counts dlq.ReplaySummary
	lastReport := time.Now()
	opts.Progress = func(r dlq.ReplayResult) {
		handled++
		d := r.Letter
		subject := cell(d.Subject, 1<<10)
		switch r.Outcome {
		case dlq.WouldReplay:
			fmt.Fprintf(stdout, "would replay %d (%s sequence %d) to %s (%s, %s)\n", d.Sequence, d.Stream, d.StreamSequence, subject, d.Reason, plural(d.Attempts, "attempt"))
			return
		case dlq.Replayed:
			counts.Replayed++
			if r.Earlier {
				fmt.Fprintf(stderr, "removed %d: already republished to %s by an earlier, interrupted replay (%s sequence %d)\n",
					d.Sequence, subject, r.Ack.Stream, r.Ack.Sequence)
			} else {
				fmt.Fprintf(stderr, "replayed %d to %s (%s sequence %d)\n", d.Sequence, subject, r.Ack.Stream, r.Ack.Sequence)
			}
		case dlq.Kept:
			counts.Kept++
			fmt.Fprintf(stderr, "kept %d: %s; %s\n", d.Sequence, r.Why, retryHint(r.RetryAt))
		case dlq.Failed:
			counts.Failed++
			fmt.Fprintf(stderr, "failed %d: %v\n", d.Sequence, r.Err)
		}
		if handled%replayProgressEvery == 0 || time.Since(lastReport) >= time.Second {
			lastReport = time.Now()
			fmt.Fprintf(stderr, "progress: %d handled so far: replayed %d, kept %d, failed %d\n", handled, counts.Replayed, counts.Kept, counts.Failed)
		}
	}
	sum, err := q.Replay(ctx, sel, opts)
	if opts.DryRun {
		fmt.Fprintf(stdout, "dry run: would replay %d, nothing changed\n", sum.WouldReplay)
	} else {
		fmt.Fprintf(stdout, "replayed %d, kept %d (duplicate window), failed %d\n", sum.Replayed, sum.Kept, sum.Failed)
		if sum.Kept > 1 {
			fmt.Fprintf(stderr, "the kept dead letters can be replayed again %s\n", strings.TrimPrefix(retryHint(sum.RetryAt), "retry "))
		}
	}
	switch {
	case err != nil:
		return err
	case sum.Kept+sum.Failed > 0:
		return &exitError{code: 1, err: fmt.Errorf("dlq replay: %d kept, %d failed", sum.Kept, sum.Failed)}
	case missingSequences(sel, opts.Limit, handled):
		return &exitError{code: 1, err: fmt.Errorf("dlq replay: %d of the %d sequences given hold no dead letter of this consumer matching the filters",
			len(sel.Sequences)-handled, len(sel.Sequences))}
	}
	return nil
}

// dlqPurge purges the selection, a line per dead letter on stderr and the
// summary on stdout.
func dlqPurge(ctx context.Context, q *dlq.Queue, sel dlq.Selection, limit int, stdout, stderr io.Writer) error {
	handled := 0
	sum, err := q.Purge(ctx, sel, dlq.PurgeOptions{Limit: limit, Progress: func(r dlq.PurgeResult) {
		handled++
		if r.Err != nil {
			fmt.Fprintf(stderr, "failed %d: %v\n", r.Letter.Sequence, r.Err)
			return
		}
		fmt.Fprintf(stderr, "purged %d (%s, %s)\n", r.Letter.Sequence, r.Letter.Reason, r.Letter.Subject)
	}})
	fmt.Fprintf(stdout, "purged %d, failed %d\n", sum.Purged, sum.Failed)
	switch {
	case err != nil:
		return err
	case sum.Failed > 0:
		return &exitError{code: 1, err: fmt.Errorf("dlq purge: %d failed", sum.Failed)}
	case missingSequences(sel, limit, handled):
		return &exitError{code: 1, err: fmt.Errorf("dlq purge: %d of the %d sequences given hold no dead letter of this consumer matching the filters",
			len(sel.Sequences)-handled, len(sel.Sequences))}
	}
	return nil
}

// missingSequences reports whether sequences were given and fewer dead
// letters than that were handled, without a limit to explain it.
func missingSequences(sel dlq.Selection, limit, handled int) bool {
	n := len(sel.Sequences)
	return n > 0 && handled < n && (limit == 0 || handled < limit)
}

// retryHint says when a kept dead letter can be replayed.
func retryHint(at time.Time) string {
	if at.IsZero() {
		return "retry later (the duplicate window is unknown)"
	}
	in := time.Until(at).Round(time.Second)
	if in <= 0 {
		return "retry now: the window has passed (" + at.UTC().Format(time.RFC3339) + ")"
	}
	return "retry after " + at.UTC().Format(time.RFC3339) + " (in " + in.String() + ")"
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}
