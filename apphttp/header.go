package apphttp

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/batch"
	"github.com/courierhq/courier/internal/printable"
)

// What HTTP can carry of a NATS message's headers: NATS allows any byte but
// ':' and line breaks in a name, and control characters in a value; HTTP
// allows a token (RFC 9110 section 5.1) and no control character but tab
// (section 5.5).

// Headers courier adds to requests to the app; a message's own are not
// passed on under these names (AppHeaders).
const (
	HeaderAttempt   = "Courier-Attempt"
	HeaderSubject   = "Courier-Subject"
	HeaderStream    = "Courier-Stream"
	HeaderSequence  = "Courier-Sequence"
	HeaderPublished = "Courier-Published"
	// HeaderReplay carries the id of the rewind that delivers a message
	// again.
	HeaderReplay = "Courier-Replay"
	// HeaderIdempotencyKey carries the resolved dedup key to the app.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderBatch marks a batch request (batch.HeaderBatch): a message's
	// own would make one message look like a batch of entries of its
	// publisher's choosing, signed by courier when signing is on.
	HeaderBatch = batch.HeaderBatch
)

// DroppedHeader is a message header that HTTP cannot carry.
type DroppedHeader struct {
	Name   string
	Reason string
}

// DroppedKind is what one log line says of the headers of one message that
// HTTP could not carry for one reason: a message with thousands of such
// values makes one line per reason, not one per value.
type DroppedKind struct {
	// Reason is DroppedHeader.Reason.
	Reason string
	// Names are the headers' names, distinct, sorted, made printable and
	// at most MaxDroppedNames of them; More counts the others.
	Names []string
	More  int
	// Values counts the DroppedHeaders of this reason.
	Values int
}

// MaxDroppedNames bounds DroppedKind.Names.
const MaxDroppedNames = 8

// DroppedKinds groups what AppHeaders dropped by reason, in the order the
// reasons first appear.
func DroppedKinds(dropped []DroppedHeader) []DroppedKind {
	var kinds []DroppedKind
	names := map[string]map[string]bool{}
	for _, d := range dropped {
		i := slices.IndexFunc(kinds, func(k DroppedKind) bool { return k.Reason == d.Reason })
		if i < 0 {
			kinds = append(kinds, DroppedKind{Reason: d.Reason})
			names[d.Reason] = map[string]bool{}
			i = len(kinds) - 1
		}
		kinds[i].Values++
		names[d.Reason][d.Name] = true
	}
	for i := range kinds {
		all := slices.Sorted(maps.Keys(names[kinds[i].Reason]))
		n := min(len(all), MaxDroppedNames)
		for _, name := range all[:n] {
			kinds[i].Names = append(kinds[i].Names, printable.Line(name, 64))
		}
		kinds[i].More = len(all) - n
	}
	return kinds
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
		if IsNATSHeader(name) {
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
			if !ValidFieldValue(v) {
				dropped = append(dropped, DroppedHeader{Name: name, Reason: "value not valid in HTTP"})
				continue
			}
			h[canon] = append(h[canon], v)
		}
	}
	return dropped
}

// IsNATSHeader reports whether name is one of NATS's own headers (Nats-*,
// in any case), which are not passed to the app.
func IsNATSHeader(name string) bool { return len(name) >= 5 && strings.EqualFold(name[:5], "Nats-") }

func isReserved(canon string) bool {
	switch canon {
	case HeaderIdempotencyKey, HeaderAttempt, HeaderSubject, HeaderStream, HeaderSequence, HeaderPublished, HeaderBatch, HeaderReplay,
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

// ValidFieldValue reports whether HTTP can carry s as a header value: no
// control characters but horizontal tab (RFC 9110 section 5.5).
func ValidFieldValue(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// checkHeader refuses a header net/http would refuse to send: a name that is
// not a token, a value with a control character (a line break would split
// the request).
func checkHeader(h http.Header) error {
	for k, vs := range h {
		if !validFieldName(k) {
			return fmt.Errorf("net/http: invalid header field name %q", k)
		}
		for _, v := range vs {
			if !ValidFieldValue(v) {
				return fmt.Errorf("net/http: invalid header field value for %q", k)
			}
		}
	}
	return nil
}
