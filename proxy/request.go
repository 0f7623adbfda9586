package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natshdr"
)

// Headers courier adds to every request to the app.
const (
	HeaderAttempt   = "Courier-Attempt"
	HeaderSubject   = "Courier-Subject"
	HeaderStream    = "Courier-Stream"
	HeaderSequence  = "Courier-Sequence"
	HeaderPublished = "Courier-Published"
	// HeaderIdempotencyKey carries the resolved dedup key to the app.
	HeaderIdempotencyKey = "Idempotency-Key"
)

// ResolveKey returns a message's dedup key: the value of the header named
// header, else its Nats-Msg-Id, else one derived from the stream, the
// stream's creation time and the sequence. The creation time keeps the key
// unique when a stream is deleted and created again and sequences restart.
func ResolveKey(h nats.Header, header string, stream string, created time.Time, seq uint64) string {
	if header != "" {
		if v := natshdr.Get(h, header); v != "" {
			return v
		}
	}
	if v := h.Get(nats.MsgIdHdr); v != "" {
		return v
	}
	return dlq.DerivedKey(stream, created, seq)
}

// DroppedHeader is a message header that HTTP cannot carry.
type DroppedHeader struct {
	Name   string
	Reason string
}

// AppHeaders copies a message's application headers into h as HTTP carries
// them: not NATS's own Nats-* headers, nor a copy of courier's own (a
// publisher's Courier-Attempt must not be mistaken for courier's) or of
// HTTP's framing headers; names or values HTTP cannot carry are returned as
// dropped. The message's Idempotency-Key is kept only with keepKey (a
// delivery replaces it with the resolved key).
func AppHeaders(h http.Header, src nats.Header, keepKey bool) []DroppedHeader {
	var dropped []DroppedHeader
	for name, vs := range src {
		if isNatsHeader(name) {
			continue
		}
		if !validFieldName(name) {
			dropped = append(dropped, DroppedHeader{Name: name, Reason: "not a valid HTTP header name"})
			continue
		}
		canon := http.CanonicalHeaderKey(name)
		if canon == HeaderIdempotencyKey && !keepKey {
			continue // replaced by the resolved key
		}
		if canon != HeaderIdempotencyKey && isReserved(canon) {
			dropped = append(dropped, DroppedHeader{Name: name, Reason: "reserved for courier or HTTP"})
			continue
		}
		for _, v := range vs {
			if !validFieldValue(v) {
				dropped = append(dropped, DroppedHeader{Name: name, Reason: "value not valid in HTTP"})
				continue
			}
			h[canon] = append(h[canon], v)
		}
	}
	return dropped
}

// ValidFieldValue reports whether HTTP can carry v as a header value.
func ValidFieldValue(v string) bool { return validFieldValue(v) }

// BuildHeaders returns the HTTP headers for a message: its application
// headers (not NATS's own Nats-* headers, not names or values HTTP cannot
// carry, which are returned as dropped), then courier's own.
func BuildHeaders(m jetstream.Msg, meta *jetstream.MsgMetadata, key string) (http.Header, []DroppedHeader) {
	src := m.Headers()
	// Sized for what it will hold: up to 8 entries fit a map's first group.
	n := len(ownHeaders)
	for name := range src {
		if !isNatsHeader(name) {
			n++
		}
	}
	h := make(http.Header, n)
	dropped := AppHeaders(h, src, false)
	// courier's own values share one array (h.Set would allocate a slice
	// for each); each slice's capacity is its length, so an append to one
	// copies it rather than overwriting the next.
	vals := make([]string, len(ownHeaders))
	set := func(i int, v string) {
		vals[i] = v
		h[ownHeaders[i]] = vals[i : i+1 : i+1]
	}
	// A key that HTTP cannot carry cannot be sent; the stream-derived form
	// always can, so this only happens for a publisher's odd header.
	if validFieldValue(key) {
		set(0, key)
	} else {
		set(0, strconv.Quote(key))
	}
	set(1, strconv.FormatUint(meta.NumDelivered, 10))
	// NATS allows control characters in a subject; HTTP does not in a value.
	if subj := m.Subject(); validFieldValue(subj) {
		set(2, subj)
	} else {
		set(2, strconv.Quote(subj))
	}
	set(3, meta.Stream)
	// The sequence and the publish time as one string, cut in two.
	var buf [64]byte
	b := strconv.AppendUint(buf[:0], meta.Sequence.Stream, 10)
	cut := len(b)
	b = meta.Timestamp.UTC().AppendFormat(b, time.RFC3339Nano)
	both := string(b)
	set(4, both[:cut])
	set(5, both[cut:])
	// Copied above under its canonical name if the message had one, in
	// whatever case its publisher wrote it.
	if ct := h.Get("Content-Type"); ct == "" {
		set(6, "application/octet-stream")
	}
	return h, dropped
}

// ownHeaders are the headers BuildHeaders sets, by index.
var ownHeaders = [...]string{HeaderIdempotencyKey, HeaderAttempt, HeaderSubject, HeaderStream, HeaderSequence,
	HeaderPublished, "Content-Type"}

// isNatsHeader reports whether name is one of NATS's own headers (Nats-*,
// in any case), which are not passed to the app.
func isNatsHeader(name string) bool { return len(name) >= 5 && strings.EqualFold(name[:5], "Nats-") }

func isReserved(canon string) bool {
	switch canon {
	case HeaderIdempotencyKey, HeaderAttempt, HeaderSubject, HeaderStream, HeaderSequence, HeaderPublished,
		"Content-Length", "Transfer-Encoding", "Host", "Connection", "Te", "Trailer", "Upgrade", "Keep-Alive", "Proxy-Connection":
		return true
	}
	return false
}

// validFieldName reports whether s is an HTTP token (RFC 9110 section 5.1).
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isTokenChar(s[i]) {
			return false
		}
	}
	return true
}

func isTokenChar(c byte) bool { return tokenChars[c] }

// tokenChars are the bytes of an HTTP token: letters, digits and
// !#$%&'*+-.^_`|~ (checked for every header field of every request).
var tokenChars = func() (t [256]bool) {
	for c := 0; c < 256; c++ {
		b := byte(c)
		t[c] = b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0
	}
	return t
}()

// validFieldValue reports whether s can be sent as an HTTP field value: no
// control characters but horizontal tab (RFC 9110 section 5.5).
func validFieldValue(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// Delay returns the full-jitter backoff before attempt+1: a random duration
// in [0, min(max, initial*multiplier^(attempt-1))]. rnd(n) returns a value in
// [0, n).
func Delay(attempt int, initial, max time.Duration, multiplier float64, rnd func(n int64) int64) time.Duration {
	ceil := scheduleAt(attempt, initial, max, multiplier)
	if ceil <= 0 {
		return 0
	}
	return time.Duration(rnd(int64(ceil) + 1))
}
