// Package dlq owns courier's dead letters: the envelope of headers a dead
// letter carries (envelope.go, deadletter.go), publishing it with a
// JetStream acknowledgement (publish.go), making sure a stream captures the
// dead-letter subject and will keep what it receives (stream.go), the tools
// that list, show, replay and purge them (tools.go, replay.go), and the
// gauge of those waiting (depth.go). It does not decide what is terminal;
// callers hand it a Letter. A message is terminated only once its dead
// letter is stored (docs/behaviour.md#every-message-ends-one-way).
package dlq

import (
	"encoding/base64"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/internal/printable"
)

// Header names of the dead-letter envelope. Every header of a dead letter
// whose name starts with "Courier-" and not with OriginalPrefix is courier's
// own; the original message's headers are either kept as they were or moved
// under OriginalPrefix (see Envelope).
const (
	// HeaderReason says why the message was dead-lettered: one of the
	// Reason constants, or another word that explains itself.
	HeaderReason = "Courier-Reason"
	// HeaderStatus is the app's last HTTP status; absent when there was none.
	HeaderStatus = "Courier-Status"
	// HeaderError is the last error, bounded to MaxErrorLen bytes; absent
	// when there was none.
	HeaderError = "Courier-Error"
	// HeaderAttempts is the number of delivery attempts made.
	HeaderAttempts = "Courier-Attempts"
	// HeaderOrderKey is the original's ordering key (COURIER_ORDER_KEY),
	// and HeaderOrderWaiting how many later messages of that key courier
	// held waiting for it (those it had fetched; more may follow in the
	// stream); both only on an ordered message's dead letter.
	HeaderOrderKey     = "Courier-Order-Key"
	HeaderOrderWaiting = "Courier-Order-Waiting"
	// HeaderReplay is the id of the rewind (courier rewind) whose
	// delivery of the original failed; only on such a dead letter.
	HeaderReplay = "Courier-Replay"
	// HeaderSubject is the original message's subject, made a readable
	// header value (see HeaderSubjectBase64 for the exact one).
	HeaderSubject = "Courier-Subject"
	// HeaderSubjectBase64 is the original's exact subject, base64 (standard
	// encoding, padded), present only when HeaderSubject differs from it: a
	// subject that is not valid UTF-8 or holds what is not printable
	// (control or format characters, spaces other than U+0020), which a
	// header value cannot carry, or a terminal show, as they are. Replay
	// publishes to this one.
	HeaderSubjectBase64 = "Courier-Subject-Base64"
	// HeaderStream is the stream the original was consumed from.
	HeaderStream = "Courier-Stream"
	// HeaderStreamCreated is HeaderStream's creation time, RFC 3339 with
	// nanoseconds, UTC. With HeaderStream and HeaderSequence it reproduces
	// the key courier derived for an original that had neither an
	// idempotency header nor a Nats-Msg-Id (DerivedKey).
	HeaderStreamCreated = "Courier-Stream-Created"
	// HeaderSequence is the original's sequence in HeaderStream.
	HeaderSequence = "Courier-Sequence"
	// HeaderConsumer is the durable consumer that gave up on the original.
	HeaderConsumer = "Courier-Consumer"
	// HeaderFailedAt is when the message was dead-lettered, RFC 3339 with
	// nanoseconds, UTC.
	HeaderFailedAt = "Courier-Failed-At"
	// HeaderPublished is the original's stream timestamp, RFC 3339 with
	// nanoseconds, UTC.
	HeaderPublished = "Courier-Published"
	// HeaderBody, when present, says the dead letter does not carry the
	// original's body: BodyOmittedTooLarge. The original was then left in
	// its stream (HeaderStream, HeaderSequence), where replay fetches it.
	HeaderBody = "Courier-Body"
	// HeaderBodySize is the original body's size in bytes, present with
	// HeaderBody.
	HeaderBodySize = "Courier-Body-Size"
	// HeaderHeaders, when present, says the dead letter does not carry the
	// original's headers either (BodyOmittedTooLarge): they were too large
	// even without the body.
	HeaderHeaders = "Courier-Headers"
	// OriginalPrefix prefixes the name of every original header that could
	// act on the dead-letter stream ("Nats-*") or be mistaken for courier's
	// own ("Courier-*"): Nats-Msg-Id is kept as Courier-Original-Nats-Msg-Id.
	OriginalPrefix = "Courier-Original-"
)

// BodyOmittedTooLarge is the value of HeaderBody (and HeaderHeaders) in a
// reference dead letter: with its envelope the original would not fit in a
// message the server accepts (its max_payload).
const BodyOmittedTooLarge = "omitted-too-large"

// Values of HeaderReason used by courier. Other words are allowed.
const (
	// ReasonRejected: the app answered with a permanent error.
	ReasonRejected = "rejected"
	// ReasonExhausted: the last allowed attempt failed transiently.
	ReasonExhausted = "exhausted"
	// ReasonExpired: the message was older than the configured maximum age.
	ReasonExpired = "expired"
	// ReasonMaxDeliveries: JetStream gave up on the message (its
	// max-deliveries advisory) without courier seeing the last attempt.
	ReasonMaxDeliveries = "max-deliveries"
	// ReasonAppUnavailable: courier stopped during an app outage while it
	// held a message on its last allowed delivery, which a NAK would lose.
	ReasonAppUnavailable = "app-unavailable"
	// ReasonNotAttempted: the message's last allowed delivery was spent
	// without calling the app (courier stopped, or the app was unreachable,
	// while it held the message).
	ReasonNotAttempted = "not-attempted"
	// ReasonUnknown is written when a Letter gives no reason.
	ReasonUnknown = "unknown"
)

// Reasons returns the reasons courier writes, in the order of the
// constants above, ReasonUnknown last: what the dlq CLI lists in its help
// and accepts as --reason. It returns a new slice each time.
func Reasons() []string {
	return []string{ReasonRejected, ReasonExhausted, ReasonExpired, ReasonMaxDeliveries,
		ReasonAppUnavailable, ReasonNotAttempted, ReasonUnknown}
}

// MaxErrorLen bounds HeaderError, in bytes.
const MaxErrorLen = 1024

// msgIDHeader is JetStream's dedup header (jetstream.MsgIDHeader), and
// ttlHeader its per-message TTL (jetstream.MsgTTLHeader).
const (
	msgIDHeader = "Nats-Msg-Id"
	ttlHeader   = "Nats-TTL"
)

// Letter is one dead letter: the original message as it was stored, where it
// came from, and why courier gave up on it. It is what the delivery loop
// (proxy) and the max-deliveries catch (giveup) hand to Publisher.DeadLetter.
type Letter struct {
	// Subject is the original message's subject, exactly (it need not be
	// valid UTF-8).
	Subject string
	// Data is the original body; the dead letter carries it unchanged.
	Data []byte
	// Header holds the original's headers as stored, Nats-* included.
	Header nats.Header
	// Stream is the stream the original was consumed from.
	Stream string
	// StreamCreated is that stream's creation time; with Sequence it
	// identifies the original even if the stream is deleted and created
	// again (sequences restart).
	StreamCreated time.Time
	// Sequence is the original's stream sequence.
	Sequence uint64
	// Published is the original's stream timestamp.
	Published time.Time
	// Consumer is the durable consumer's name.
	Consumer string
	// Reason is why the message was dead-lettered (the Reason constants);
	// empty is written as ReasonUnknown.
	Reason string
	// Status is the app's last HTTP status; 0 means none.
	Status int
	// Error is the last error; empty means none.
	Error string
	// Attempts is the number of delivery attempts made.
	Attempts int
	// FailedAt is when courier gave up; Publisher.Publish fills it with the
	// current time when zero.
	//
	// Fields may be added (trace context); those above keep their names.
	FailedAt time.Time
	// OrderKey is the original's ordering key (COURIER_ORDER_KEY), "" when
	// it has none; OrderWaiting is how many later messages of that key were
	// waiting for it when it was dead-lettered (they go on now).
	OrderKey     string
	OrderWaiting int
	// Replay is the rewind that delivered the original again, "" if none.
	Replay string
}

// Envelope returns the headers of l's dead letter:
//   - the original's application headers, kept as they were;
//   - every original header whose name starts with "Nats-" or "Courier-"
//     (in any case), kept under OriginalPrefix+name: left as they were,
//     Nats-Msg-Id, Nats-Expected-*, Nats-Rollup or Nats-TTL would act on the
//     dead-letter stream, and a Courier-* header would be confused with the
//     envelope's own. Original reverses this;
//   - the Courier-* fields of l (HeaderStatus only when Status is not 0,
//     HeaderError only when Error is not empty, times only when not zero,
//     HeaderSubjectBase64 only when the subject is not a clean header
//     value);
//   - Nats-Msg-Id set to MsgID(l), so the same dead letter is stored once.
//
// Envelope does not modify l.
func Envelope(l Letter) nats.Header {
	h := make(nats.Header, len(l.Header)+12)
	for name, values := range l.Header {
		if isReserved(name) {
			name = OriginalPrefix + name
		}
		h[name] = append([]string(nil), values...)
	}

	reason := l.Reason
	if reason == "" {
		reason = ReasonUnknown
	}
	h.Set(HeaderReason, printable.Line(reason, MaxErrorLen))
	if l.Status != 0 {
		h.Set(HeaderStatus, strconv.Itoa(l.Status))
	}
	if l.Error != "" {
		h.Set(HeaderError, printable.Line(l.Error, MaxErrorLen))
	}
	h.Set(HeaderAttempts, strconv.Itoa(l.Attempts))
	if l.OrderKey != "" {
		h.Set(HeaderOrderKey, l.OrderKey)
		h.Set(HeaderOrderWaiting, strconv.Itoa(l.OrderWaiting))
	}
	if l.Replay != "" {
		h.Set(HeaderReplay, printable.Line(l.Replay, 0))
	}
	subject := printable.Line(l.Subject, 0)
	h.Set(HeaderSubject, subject)
	if subject != l.Subject {
		h.Set(HeaderSubjectBase64, base64.StdEncoding.EncodeToString([]byte(l.Subject)))
	}
	h.Set(HeaderStream, printable.Line(l.Stream, 0))
	if !l.StreamCreated.IsZero() {
		h.Set(HeaderStreamCreated, formatTime(l.StreamCreated))
	}
	h.Set(HeaderSequence, strconv.FormatUint(l.Sequence, 10))
	h.Set(HeaderConsumer, printable.Line(l.Consumer, 0))
	if !l.FailedAt.IsZero() {
		h.Set(HeaderFailedAt, formatTime(l.FailedAt))
	}
	if !l.Published.IsZero() {
		h.Set(HeaderPublished, formatTime(l.Published))
	}
	h.Set(msgIDHeader, MsgID(l))
	return h
}

// Original returns the headers of the original message as stored, from the
// headers of its dead letter: the names Envelope moved under OriginalPrefix
// are restored, and the envelope's own headers (Courier-*), its Nats-Msg-Id
// and the server's Nats-* headers of the stored dead letter are left out.
// Deciding which restored headers to republish (Nats-Expected-* made sense
// only at the first publish) is the caller's.
func Original(h nats.Header) nats.Header {
	out := make(nats.Header, len(h))
	for name, values := range h {
		switch {
		case strings.HasPrefix(name, OriginalPrefix):
			name = name[len(OriginalPrefix):]
		case isReserved(name):
			continue
		}
		out[name] = append([]string(nil), values...)
	}
	return out
}

// msgIDPrefix begins every MsgID.
const msgIDPrefix = "courier-dlq:"

// MsgID returns the Nats-Msg-Id of l's dead letter. It is unique per original
// message and consumer: consumer, stream, the stream's creation time and the
// sequence (the creation time keeps it unique when a stream is deleted and
// created again and its sequences restart). Publishing the same dead letter
// again within the dead-letter stream's duplicate window stores it once.
func MsgID(l Letter) string {
	var created int64
	if !l.StreamCreated.IsZero() {
		created = l.StreamCreated.UnixNano()
	}
	return msgIDPrefix + l.Consumer + ":" + l.Stream + ":" +
		strconv.FormatInt(created, 10) + ":" + strconv.FormatUint(l.Sequence, 10)
}

// Subject returns the original's exact subject from the headers of its dead
// letter: HeaderSubjectBase64 decoded when present, else HeaderSubject. It
// returns "" when neither is there or HeaderSubjectBase64 is unreadable.
func Subject(h nats.Header) string {
	if enc := h.Get(HeaderSubjectBase64); enc != "" {
		b, err := base64.StdEncoding.DecodeString(enc)
		if err != nil {
			return ""
		}
		return string(b)
	}
	return h.Get(HeaderSubject)
}

// DerivedKey returns the dedup key courier derives for a message that has
// neither an idempotency header nor a Nats-Msg-Id: its stream, the stream's
// creation time and its sequence. It must stay equal to the key the delivery
// loop derives (proxy.ResolveKey), which the app received as
// Idempotency-Key: replay republishes it so the app sees the same key.
func DerivedKey(stream string, created time.Time, seq uint64) string {
	// Appended in place: one allocation, the string itself.
	var buf [128]byte
	b := append(buf[:0], stream...)
	b = append(b, ':')
	b = strconv.AppendInt(b, created.UnixNano(), 10)
	b = append(b, ':')
	b = strconv.AppendUint(b, seq, 10)
	return string(b)
}

// isReserved reports whether an original header name must be moved under
// OriginalPrefix. NATS header names are case-sensitive and other clients may
// send "nats-msg-id", so the prefixes match in any case.
func isReserved(name string) bool {
	return hasPrefixFold(name, "Nats-") || hasPrefixFold(name, "Courier-")
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

func formatTime(t time.Time) string {
	return t.UTC().Format(time.RFC3339Nano)
}
