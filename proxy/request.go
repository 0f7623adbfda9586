package proxy

import (
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natshdr"
)

// Headers courier adds to every request to the app (apphttp names them:
// its header rules keep a message's own from posing as them).
const (
	HeaderAttempt   = apphttp.HeaderAttempt
	HeaderSubject   = apphttp.HeaderSubject
	HeaderStream    = apphttp.HeaderStream
	HeaderSequence  = apphttp.HeaderSequence
	HeaderPublished = apphttp.HeaderPublished
	// HeaderIdempotencyKey carries the resolved dedup key to the app.
	HeaderIdempotencyKey = apphttp.HeaderIdempotencyKey
	// HeaderReplay carries the id of the rewind that delivers a message
	// again (courier rewind).
	HeaderReplay = apphttp.HeaderReplay
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

// BuildHeaders returns the HTTP headers for a message: its application
// headers (not NATS's own Nats-* headers, not names or values HTTP cannot
// carry, which are returned as dropped), then courier's own.
func BuildHeaders(m jetstream.Msg, meta *jetstream.MsgMetadata, key string) (http.Header, []apphttp.DroppedHeader) {
	src := m.Headers()
	// Sized for what it will hold: up to 8 entries fit a map's first group.
	n := len(ownHeaders)
	for name := range src {
		if !apphttp.IsNATSHeader(name) {
			n++
		}
	}
	h := make(http.Header, n)
	dropped := apphttp.AppHeaders(h, src, false)
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
	if apphttp.ValidFieldValue(key) {
		set(0, key)
	} else {
		set(0, strconv.Quote(key))
	}
	set(1, strconv.FormatUint(meta.NumDelivered, 10))
	// NATS allows control characters in a subject; HTTP does not in a value.
	if subj := m.Subject(); apphttp.ValidFieldValue(subj) {
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

// replayHeader marks h (nil: none yet) as a request of d, a message a
// rewind delivers again (HeaderReplay), if it is one, and returns it.
func replayHeader(h http.Header, d *delivery) http.Header {
	if d.replay == "" {
		return h
	}
	if h == nil {
		h = make(http.Header, 1)
	}
	h[HeaderReplay] = []string{d.replay}
	return h
}

// ownHeaders are the headers BuildHeaders sets, by index.
var ownHeaders = [...]string{HeaderIdempotencyKey, HeaderAttempt, HeaderSubject, HeaderStream, HeaderSequence,
	HeaderPublished, "Content-Type"}

// result is what one request to the app returns: its answer, how long it
// took and its error; for a batch's entry, its part of its batch's answer.
type result struct {
	answer *apphttp.Answer
	took   time.Duration
	err    error
}
