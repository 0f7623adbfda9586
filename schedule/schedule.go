// Package schedule owns courier's delayed delivery: a message published now
// and delivered to its subject at a later time by JetStream's own message
// schedules (nats-server 2.12 or later, ADR-51; docs/delayed-delivery.md).
//
// A delayed message is stored in the stream of its subject as a schedule:
// a message on a subject of its own, <prefix>.<STREAM>.<token>
// (Subject), carrying Nats-Schedule: @at <time> and Nats-Schedule-Target:
// <subject> (message.go). The server publishes its body and headers to the
// target when the time comes, and purges the schedule; until then the
// schedule survives any restart of courier, the app or the server, and no
// courier needs to run when it is due. The schedule's id, <STREAM>.<token>,
// is how it is listed and cancelled (tools.go).
//
// The package also says whether a stream can hold schedules, and how to
// make it (stream.go); which filter subjects leave the schedules out of a
// durable (Leave); and counts the delayed messages that reach the app
// later than asked (lateness.go). It knows nothing of HTTP requests: the
// publish API reads the delay (When) and answers; the sidecar sets up
// durables with Leave.
package schedule

import (
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nuid"
)

// The headers a publish asks for delayed delivery with; HeaderDeliverAt is
// also kept on the message, as the time it was asked for (RFC 3339 with
// nanoseconds, UTC), and so reaches the app.
const (
	// HeaderDelay is a delay from now: a Go duration (90s, 15m, 1h30m) or
	// whole seconds (90).
	HeaderDelay = "Courier-Delay"
	// HeaderDeliverAt is a time, RFC 3339 (2026-05-01T08:00:00Z).
	HeaderDeliverAt = "Courier-Deliver-At"
)

// DefaultPrefix is where schedules wait unless COURIER_SCHEDULE_PREFIX says
// otherwise: _sched.<STREAM>.<token>.
const DefaultPrefix = "_sched"

// Subjects is the subject filter of every schedule of stream under prefix:
// <prefix>.<stream>.>.
func Subjects(prefix, stream string) string { return prefix + "." + stream + ".>" }

// ID names one schedule: its stream and the last token of its subject,
// written <STREAM>.<token> (a stream name holds no '.').
type ID struct {
	Stream, Token string
}

func (id ID) String() string { return id.Stream + "." + id.Token }

// Subject is the schedule's subject under prefix.
func (id ID) Subject(prefix string) string { return prefix + "." + id.Stream + "." + id.Token }

// ErrBadID is ParseID's error for what is not a schedule's id.
var ErrBadID = errors.New("not a schedule id: expected <STREAM>.<token>, as the publish answered")

// ParseID reads an id as ID.String writes it.
func ParseID(s string) (ID, error) {
	stream, token, ok := strings.Cut(s, ".")
	if !ok || stream == "" || !validToken(token) || strings.ContainsAny(stream, "*> \t\r\n/\\") {
		return ID{}, fmt.Errorf("%q: %w", s, ErrBadID)
	}
	return ID{Stream: stream, Token: token}, nil
}

// validToken reports whether t is one subject token of printable ASCII, no
// wildcard.
func validToken(t string) bool {
	if t == "" {
		return false
	}
	for i := 0; i < len(t); i++ {
		if c := t[i]; c <= ' ' || c > '~' || c == '.' || c == '*' || c == '>' {
			return false
		}
	}
	return true
}

// tokenEncoding writes a key's digest as a subject token.
var tokenEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// KeyToken is the token of the schedule of a message whose idempotency key
// is key: the same key always gets the same subject, so that a delayed
// publish sent again while its schedule waits finds it there rather than
// storing a second one (one per subject: Message expects the subject
// empty). 128 bits of SHA-256, in base32.
func KeyToken(key string) string {
	sum := sha256.Sum256([]byte(key))
	return tokenEncoding.EncodeToString(sum[:16])
}

// NewToken is the token of the schedule of a message without a key: unique.
func NewToken() string { return nuid.Next() }

// When reads a publish's delay: the values of its Courier-Delay and
// Courier-Deliver-At headers (either may be nil), relative to now. It
// returns the time to deliver at (UTC), and false when neither header is
// given. A time in the past is returned as it is: the server delivers it
// at once. An error says what is wrong with the headers, for a 400.
func When(delay, at []string, now time.Time) (time.Time, bool, error) {
	switch {
	case len(delay) == 0 && len(at) == 0:
		return time.Time{}, false, nil
	case len(delay) > 0 && len(at) > 0:
		return time.Time{}, true, fmt.Errorf("both %s and %s: give one of them", HeaderDelay, HeaderDeliverAt)
	case len(delay) > 1 || len(at) > 1:
		return time.Time{}, true, fmt.Errorf("more than one %s or %s: a message is delivered once", HeaderDelay, HeaderDeliverAt)
	case len(delay) == 1:
		d, err := ParseDelay(delay[0])
		if err != nil {
			return time.Time{}, true, err
		}
		return now.Add(d).UTC(), true, nil
	}
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(at[0]))
	if err != nil {
		return time.Time{}, true, fmt.Errorf("%s %q is not an RFC 3339 time, such as 2026-05-01T08:00:00Z", HeaderDeliverAt, at[0])
	}
	return t.UTC(), true, nil
}

// ParseDelay reads a Courier-Delay value: a Go duration (90s, 15m, 1h30m)
// or whole seconds (90); not negative.
func ParseDelay(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	var d time.Duration
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n > int64(maxDelay/time.Second) {
			return 0, fmt.Errorf("%s %q: more seconds than a delay may be (%s)", HeaderDelay, v, maxDelay)
		}
		d = time.Duration(n) * time.Second
	} else if d, err = time.ParseDuration(v); err != nil {
		return 0, fmt.Errorf("%s %q is neither a duration (90s, 15m, 1h30m) nor whole seconds", HeaderDelay, v)
	}
	if d < 0 {
		return 0, fmt.Errorf("%s %q is negative: a message cannot be delivered before it is published", HeaderDelay, v)
	}
	return d, nil
}

// maxDelay bounds a delay given in seconds, so that it fits a
// time.Duration (about 292 years).
const maxDelay = 100 * 365 * 24 * time.Hour
