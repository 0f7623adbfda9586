package schedule

// A delayed message as JetStream holds it: the schedule message, and what
// it says when read back.
//
// What the server delivers when a schedule fires (nats-server 2.15
// server/scheduler.go, getScheduledMessages): the schedule's body and
// headers, less Nats-Schedule*, Nats-Expected-*, Nats-Msg-Id, Nats-TTL and
// Nats-Rollup, plus Nats-Scheduler (the schedule's subject) and
// Nats-Schedule-Next: purge, after which the schedule is purged; a
// Nats-Schedule-TTL becomes the delivered message's Nats-TTL. So the
// idempotency key travels as the Idempotency-Key header, which courier's
// delivery reads as a message's key, and not as Nats-Msg-Id alone.

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// The server's header names (nats-server server/stream.go), as it spells
// them: NATS header names are case-sensitive.
const (
	hdrSchedule       = "Nats-Schedule"
	hdrScheduleTarget = "Nats-Schedule-Target"
	hdrScheduleTTL    = "Nats-Schedule-TTL"
	hdrTTL            = "Nats-TTL"
	hdrLastSubjectSeq = "Nats-Expected-Last-Subject-Sequence"
	// HeaderIdempotencyKey is the header courier's delivery reads a
	// message's key from by default (COURIER_IDEMPOTENCY_HEADER).
	HeaderIdempotencyKey = "Idempotency-Key"
)

// ErrExpectation is Message's error for a message with a Nats-Expected-*
// header that would be checked against the schedule rather than the
// message (all but Nats-Expected-Stream).
var ErrExpectation = errors.New("a delayed message is stored at its time, when no one checks a Nats-Expected-Last-* header: the server would check it now, against the schedule; publish without it, or at once")

// Message is the schedule of m, to be stored in stream under prefix: m
// delivered to its subject at at. key is m's idempotency key, "" when it
// has none (courier made its Nats-Msg-Id): with one, the schedule's
// subject is the key's (KeyToken) and the key is kept as the
// Idempotency-Key header. The schedule carries m's body and headers, its
// Nats-Msg-Id (so that a publish sent again within the stream's duplicate
// window is stored once), Courier-Deliver-At (the time, which the app
// sees), its Nats-TTL as Nats-Schedule-TTL (the delivered message's), and
// expects its subject empty (Nats-Expected-Last-Subject-Sequence: 0), so
// that the same key sent again while its schedule waits is refused by the
// server as a wrong last sequence rather than replacing it. m is left as
// it is.
func Message(m *nats.Msg, stream, prefix string, at time.Time, key string) (*nats.Msg, ID, error) {
	if err := CheckExpectations(m.Header); err != nil {
		return nil, ID{}, err
	}
	id := ID{Stream: stream, Token: NewToken()}
	if key != "" {
		id.Token = KeyToken(key)
	}
	at = at.UTC()
	h := make(nats.Header, len(m.Header)+6)
	for name, vs := range m.Header {
		switch name {
		case HeaderDelay:
		case hdrTTL:
			h[hdrScheduleTTL] = vs
		default:
			h[name] = vs
		}
	}
	if key != "" && len(h[HeaderIdempotencyKey]) == 0 {
		h[HeaderIdempotencyKey] = []string{key}
	}
	when := at.Format(time.RFC3339Nano)
	h[HeaderDeliverAt] = []string{when}
	h[hdrSchedule] = []string{"@at " + when}
	h[hdrScheduleTarget] = []string{m.Subject}
	h[hdrLastSubjectSeq] = []string{"0"}
	return &nats.Msg{Subject: id.Subject(prefix), Header: h, Data: m.Data}, id, nil
}

// CheckExpectations refuses, with an error wrapping ErrExpectation, the
// headers of a delayed message that hold a Nats-Expected-* header but
// Nats-Expected-Stream (as JetStream spells them).
func CheckExpectations(h nats.Header) error {
	for name := range h {
		if strings.HasPrefix(name, "Nats-Expected-") && name != "Nats-Expected-Stream" {
			return fmt.Errorf("%s: %w", name, ErrExpectation)
		}
	}
	return nil
}

// Info is a waiting schedule as read back from its stream.
type Info struct {
	ID ID
	// Seq is the schedule's sequence in its stream, and Stored when it
	// was stored.
	Seq    uint64
	Stored time.Time
	// Target is the subject the message is delivered to, at DeliverAt.
	Target    string
	DeliverAt time.Time
	// Key is the message's idempotency key, "" without one.
	Key string
}

// infoOf reads the schedule stored on subj under prefix, with headers h:
// false when it is no schedule of courier's (no Nats-Schedule: @at).
func infoOf(prefix, subj string, h nats.Header, seq uint64, stored time.Time) (Info, bool) {
	rest, ok := strings.CutPrefix(subj, prefix+".")
	if !ok {
		return Info{}, false
	}
	id, err := ParseID(rest)
	if err != nil {
		return Info{}, false
	}
	at, ok := strings.CutPrefix(natsGet(h, hdrSchedule), "@at ")
	if !ok {
		return Info{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return Info{}, false
	}
	return Info{ID: id, Seq: seq, Stored: stored, Target: natsGet(h, hdrScheduleTarget), DeliverAt: t.UTC(),
		Key: natsGet(h, HeaderIdempotencyKey)}, true
}

// natsGet is the first value of header name in h, as stored or in
// net/http's canonical form.
func natsGet(h nats.Header, name string) string {
	if vs := h[name]; len(vs) > 0 {
		return vs[0]
	}
	if vs := h[http.CanonicalHeaderKey(name)]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}
