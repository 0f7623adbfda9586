// Package success owns the success record: the app's answer to a 2xx,
// published to COURIER_SUCCESS_SUBJECT with a JetStream acknowledgement
// before the original is acked (SPEC behaviour 17). It builds the record's
// headers, publishes it, and makes sure a stream keeps what is published to
// the subject. It does not decide when a record is due: the delivery loop
// does.
package success

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
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
}

// hopByHop are the response headers that describe one HTTP connection, not
// the answer (RFC 9110 7.6.1), and Content-Length, which the record's own
// size replaces.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true,
	"Upgrade": true, "Content-Length": true, "Date": true,
}

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

// Message builds the NATS message of r for subject.
func Message(subj string, r Record) *nats.Msg {
	m := nats.NewMsg(subj)
	for name, vs := range r.Header {
		// NATS acts on its own Nats-* headers at publish (an expectation
		// refuses the record for ever, a rollup purges the stream, a TTL
		// expires it): an app's answer must not pose as them, as on a
		// reply.
		if hopByHop[http.CanonicalHeaderKey(name)] || len(name) >= 5 && strings.EqualFold(name[:5], "Nats-") {
			continue
		}
		for _, v := range vs {
			m.Header.Add(name, v)
		}
	}
	m.Header.Set(HeaderStatus, strconv.Itoa(r.Status))
	m.Header.Set(HeaderSubject, r.Subject)
	m.Header.Set(HeaderStream, r.Stream)
	m.Header.Set(HeaderSequence, strconv.FormatUint(r.Sequence, 10))
	m.Header.Set(HeaderAttempt, strconv.Itoa(r.Attempt))
	m.Header.Set(HeaderKey, r.Key)
	m.Header.Set(nats.MsgIdHdr, MsgID(r))
	m.Data = r.Body
	if r.BodyCut {
		m.Data = nil
		m.Header.Set(HeaderBody, BodyOmitted)
		m.Header.Set(HeaderBodySize, strconv.FormatInt(r.BodySize, 10))
	}
	return m
}

// size is what a message counts against max_payload.
func size(m *nats.Msg) int {
	n := len(m.Data)
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n + 16
}

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
// large to publish is stored without its body (HeaderBody says so): it is
// not a reason to call the app again.
func (p *Publisher) Publish(ctx context.Context, r Record) error {
	m := Message(p.subject, r)
	if max := int(p.js.Conn().MaxPayload()); max > 0 && size(m) > max {
		r.BodyCut, r.BodySize = true, max64(r.BodySize, int64(len(r.Body)))
		m = Message(p.subject, r)
	}
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
