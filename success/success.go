// Package success owns the success record: the app's answer to a 2xx,
// published to COURIER_SUCCESS_SUBJECT with a JetStream acknowledgement
// before the original is acked (docs/behaviour.md#success-records). It builds the record's
// headers, publishes it, and makes sure a stream keeps what is published to
// the subject. It does not decide when a record is due: the delivery loop
// does.
package success

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/internal/natshdr"
	"github.com/courierhq/courier/internal/subject"
)

// Headers of a success record, beside the app's own response headers.
const (
	HeaderStatus   = "Courier-Status"
	HeaderSubject  = "Courier-Subject"
	HeaderStream   = "Courier-Stream"
	HeaderSequence = "Courier-Sequence"
	HeaderAttempt  = "Courier-Attempt"
	HeaderKey      = "Idempotency-Key"
	// HeaderBody is "omitted-too-large" on a record whose answer was too
	// large to publish (the server's max_payload); HeaderBodySize then
	// gives the answer's size in bytes, as far as it was read.
	HeaderBody     = "Courier-Body"
	HeaderBodySize = "Courier-Body-Size"
	// BodyOmitted is HeaderBody's value on such a record.
	BodyOmitted = "omitted-too-large"
	// HeaderOmittedHeaders names, comma separated, the app's headers left
	// out of a record that could not be stored with them (max_payload);
	// a list longer than omittedListMax ends in ", …".
	HeaderOmittedHeaders = "Courier-Omitted-Headers"
)

// Record is one success record.
type Record struct {
	// Status, Header and Body are the app's answer. Header may be nil.
	Status int
	Header http.Header
	Body   []byte
	// BodyCut says Body is not the whole answer (it was larger than could
	// be read); BodySize is the answer's size as far as it was read.
	BodyCut  bool
	BodySize int64
	// Where the original came from, and which delivery this was.
	Subject  string
	Stream   string
	Consumer string
	Sequence uint64
	Attempt  int
	// Key is the message's idempotency key as the app saw it.
	Key string
	// Trace is the trace context the record carries (W3C Trace Context's
	// traceparent and tracestate, under the names given), as courier's own
	// headers: kept when the app's must be left out, and in place of any
	// the app answered with. Empty leaves the app's as they are.
	Trace nats.Header
}

// hopByHop are the response headers that describe one HTTP connection, not
// the answer (RFC 9110 7.6.1; Proxy-* ones are left out by their prefix),
// and Content-Length, which the record's own size replaces.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Te": true, "Trailer": true, "Transfer-Encoding": true,
	"Upgrade": true, "Content-Length": true, "Date": true,
}

// cookies are the headers that set the app's cookies (RFC 6265; Set-Cookie2,
// RFC 2965, is obsolete but still sent): a record goes to every reader of
// the success stream, where a session cookie would be a credential.
var cookies = map[string]bool{"Set-Cookie": true, "Set-Cookie2": true}

// MsgID is the record's Nats-Msg-Id: one per consumer (its stream and
// name, as dedup keys are scoped) and key, so that a record published twice
// (a crash between the publish and the ack, the app called again) is stored
// once within the stream's duplicate window, while the records of
// like-named durables on two streams sharing a success subject are not
// taken for each other.
func MsgID(r Record) string {
	sum := sha256.Sum256([]byte(r.Stream + "\x00" + r.Consumer + "\x00" + r.Key))
	return "courier-success:" + hex.EncodeToString(sum[:16])
}

// Message builds the NATS message of r for subject, with every header and
// the whole body (see Fit for one within max_payload).
func Message(subj string, r Record) *nats.Msg {
	return build(subj, r, nil)
}

// appHeaders are the app's response headers a record may carry: neither
// hop-by-hop ones (those above, Proxy-* ones and any the Connection header
// names), nor cookies, nor NATS's own Nats-* (NATS acts on them at publish:
// an expectation refuses the record for ever, a rollup purges the stream, a
// TTL expires it; an app's answer must not pose as them, as on a reply),
// nor the app's trace context when the record carries the message's.
func appHeaders(r Record) http.Header {
	named := map[string]bool{}
	for _, v := range r.Header.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				named[http.CanonicalHeaderKey(f)] = true
			}
		}
	}
	out := make(http.Header, len(r.Header))
	for name, vs := range r.Header {
		canon := http.CanonicalHeaderKey(name)
		switch {
		case hopByHop[canon], named[canon], cookies[canon], hasPrefixFold(name, "Proxy-"), hasPrefixFold(name, "Nats-"),
			len(r.Trace) > 0 && (strings.EqualFold(name, "traceparent") || strings.EqualFold(name, "tracestate")):
			continue
		}
		out[name] = vs
	}
	return out
}

// hasPrefixFold reports whether s begins with prefix in any case.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// build is Message leaving out the app's headers in omitted (listed in
// HeaderOmittedHeaders).
func build(subj string, r Record, omitted []string) *nats.Msg {
	m := nats.NewMsg(subj)
	for name, vs := range appHeaders(r) {
		if slices.Contains(omitted, name) {
			continue
		}
		for _, v := range vs {
			m.Header.Add(name, v)
		}
	}
	for name, vs := range r.Trace {
		m.Header[name] = slices.Clone(vs)
	}
	m.Header.Set(HeaderStatus, strconv.Itoa(r.Status))
	m.Header.Set(HeaderSubject, r.Subject)
	m.Header.Set(HeaderStream, r.Stream)
	m.Header.Set(HeaderSequence, strconv.FormatUint(r.Sequence, 10))
	m.Header.Set(HeaderAttempt, strconv.Itoa(r.Attempt))
	m.Header.Set(HeaderKey, r.Key)
	m.Header.Set(nats.MsgIdHdr, MsgID(r))
	if len(omitted) > 0 {
		m.Header.Set(HeaderOmittedHeaders, omittedList(omitted))
	}
	m.Data = r.Body
	if r.BodyCut {
		m.Data = nil
		m.Header.Set(HeaderBody, BodyOmitted)
		m.Header.Set(HeaderBodySize, strconv.FormatInt(r.BodySize, 10))
	}
	return m
}

// omittedListMax bounds HeaderOmittedHeaders' value, so that naming what
// was left out never makes the record too large itself.
const omittedListMax = 512

// omittedList is HeaderOmittedHeaders' value for names, at most
// omittedListMax bytes.
func omittedList(names []string) string {
	var b strings.Builder
	for i, name := range names {
		sep := ""
		if i > 0 {
			sep = ", "
		}
		if b.Len()+len(sep)+len(name) > omittedListMax-len(", …") {
			b.WriteString(", …")
			break
		}
		b.WriteString(sep)
		b.WriteString(name)
	}
	return b.String()
}

// Fit returns the message of r for subj within max bytes (max_payload; 0 or
// less: no limit). What does not fit is left out, never the reason to call
// the app again: first the app's headers, the largest first, as many as
// must go for the body to fit; when the body does not fit even alone, the
// body (HeaderBody), and then only the headers that still do not fit.
// Courier's own headers and the trace context are always kept; a record
// they alone make too large is returned as it is (the publish fails).
func Fit(subj string, r Record, max int) *nats.Msg {
	m := build(subj, r, nil)
	if max <= 0 || size(m) <= max {
		return m
	}
	// Largest first, by what each costs in the message.
	var fields []field
	for name, vs := range appHeaders(r) {
		f := field{name: name}
		for _, v := range vs {
			f.size += natshdr.LineSize(name, v)
		}
		fields = append(fields, f)
	}
	slices.SortFunc(fields, func(a, b field) int { return cmp.Or(cmp.Compare(b.size, a.size), strings.Compare(a.name, b.name)) })
	all := 0
	for _, f := range fields {
		all += f.size
	}
	// What the record costs beside the app's headers, with the longest
	// list of omitted names it can carry.
	reserve := natshdr.LineSize(HeaderOmittedHeaders, strings.Repeat("x", omittedListMax))
	if !r.BodyCut {
		base := size(m) - all + reserve
		if base <= max {
			return build(subj, r, omit(fields, base, max))
		}
		// The body does not fit even alone: it goes, as a body cut off
		// when it was read does.
		r.BodyCut, r.BodySize = true, max64(r.BodySize, int64(len(r.Body)))
		if m = build(subj, r, nil); size(m) <= max {
			return m
		}
	}
	base := size(m) - all + reserve
	return build(subj, r, omit(fields, base, max))
}

// field is one of the app's headers and what it costs in the message.
type field struct {
	name string
	size int
}

// omit returns the names of fields (largest first) to leave out so that the
// rest fits in max beside base bytes.
func omit(fields []field, base, max int) []string {
	total := base
	for _, f := range fields {
		total += f.size
	}
	var names []string
	for _, f := range fields {
		if total <= max {
			break
		}
		names = append(names, f.name)
		total -= f.size
	}
	return names
}

// size is what a message counts against max_payload.
func size(m *nats.Msg) int { return len(m.Data) + natshdr.Size(m.Header) }

// Publisher publishes success records to one subject. Safe for concurrent
// use.
type Publisher struct {
	js      jetstream.JetStream
	subject string
}

// NewPublisher returns a Publisher to subject.
func NewPublisher(js jetstream.JetStream, subject string) *Publisher {
	return &Publisher{js: js, subject: subject}
}

// Subject is where records go.
func (p *Publisher) Subject() string { return p.subject }

// Publish stores r: it returns nil once a stream acknowledged it (a duplicate
// acknowledgement included: the record was stored before). An answer too
// large to publish is stored without what does not fit (Fit: the app's
// largest headers, then the body; HeaderOmittedHeaders and HeaderBody say
// so): it is not a reason to call the app again.
func (p *Publisher) Publish(ctx context.Context, r Record) error {
	m := Fit(p.subject, r, int(p.js.Conn().MaxPayload()))
	if _, hasDeadline := ctx.Deadline(); !hasDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	if _, err := p.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("publishing the success record to %q: %w", p.subject, err)
	}
	return nil
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// DuplicateWindow is the duplicate window of a stream courier creates for
// success records: a record published again within it is stored once.
const DuplicateWindow = 10 * time.Minute

// StreamConfig is the stream courier creates to keep success records.
func StreamConfig(subj string, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        jsutil.SafeStreamName("COURIER_SUCCESS_", subj, subj),
		Description: "courier success records",
		Subjects:    []string{subj},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
		Discard:     jetstream.DiscardOld,
		MaxMsgs:     -1, MaxBytes: -1, MaxMsgsPerSubject: -1, MaxMsgSize: -1, MaxConsumers: -1,
		Duplicates:  DuplicateWindow,
		AllowDirect: true,
	}
}

// ErrSubject: the success subject cannot be published to.
var ErrSubject = errors.New("success: invalid subject")

// EnsureStream makes sure a stream captures subj and keeps what it
// receives: it uses one that does (check decides; the dead-letter stream's
// rules fit), or creates one (StreamConfig). created says which.
func EnsureStream(ctx context.Context, js jetstream.JetStream, subj string, replicas int,
	check func(jetstream.StreamConfig) ([]string, error)) (info *jetstream.StreamInfo, created bool, err error) {
	if err := subject.CheckLiteral(subj); err != nil {
		return nil, false, fmt.Errorf("%w %q: %w", ErrSubject, subj, err)
	}
	return jsutil.EnsureCapture(ctx, js, StreamConfig(subj, replicas), check)
}
