package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
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

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/printable"
)

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

// cell makes s fit a table cell: one printable line (printable.Line) of
// at most n bytes (n <= 0: any length), "-" when empty.
func cell(s string, n int) string {
	if s = printable.Line(s, n); s == "" {
		return "-"
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
	// The original's headers are its publisher's, or a planted dead
	// letter's writer's: an escape sequence or a line break among them
	// would act on the terminal or forge a line of this output.
	for _, name := range slices.Sorted(maps.Keys(h)) {
		for _, v := range h[name] {
			fmt.Fprintf(stdout, "  %s: %s\n", printable.Line(name, 0), printable.Line(v, 0))
		}
	}
	if d.BodyOmitted {
		where := fmt.Sprintf("stream %s sequence %d", cell(d.Stream, 64), d.StreamSequence)
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
