package publish

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"golang.org/x/net/http/httpguts"
)

// HeaderIdempotencyKey is the request header whose value becomes the
// message's Nats-Msg-Id: JetStream stores a retried publish once within the
// stream's duplicate window (Duplicates, 2 minutes by default).
const HeaderIdempotencyKey = "Idempotency-Key"

// generatedIDPrefix starts the Nats-Msg-Id courier gives a message whose
// request carried no Idempotency-Key, so that courier's own retries of one
// request never store it twice.
const generatedIDPrefix = "courier-"

// natsNames are the Nats-* headers an app may set, by net/http's canonical
// form, with the spelling JetStream reads (header names are case-sensitive
// in NATS: "Nats-Ttl" would be ignored). The names are nats-server's
// (server/stream.go, JSExpected* and JSMessageTTL). Every other Nats-*
// header is refused: the server acts on them (Nats-Rollup purges a subject,
// Nats-Batch-* open atomic batches), and an expectation the server does not
// know would be silently unchecked.
func natsName(canon string) (string, bool) {
	switch canon {
	case "Nats-Msg-Id",
		"Nats-Expected-Stream",
		"Nats-Expected-Last-Sequence",
		"Nats-Expected-Last-Subject-Sequence",
		"Nats-Expected-Last-Subject-Sequence-Subject",
		"Nats-Expected-Last-Msg-Id":
		return canon, true
	case "Nats-Ttl":
		return "Nats-TTL", true
	}
	return "", false
}

// exchangeHeader reports whether a header is about this HTTP exchange rather
// than the message: hop-by-hop headers (RFC 9110 section 7.6.1) and framing,
// the bearer token meant for courier, and what the client accepts or says of
// itself to courier (content negotiation, user agent, a browser's fetch
// metadata). They are not stored with the message.
func exchangeHeader(canon string) bool {
	switch canon {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Expect", "Host",
		"Authorization", "Accept", "Accept-Encoding", "Accept-Language", "User-Agent":
		return true
	}
	return strings.HasPrefix(canon, "Sec-Fetch-")
}

// messageHeaders returns the message headers for a request's: every header
// but those about the exchange (and any the Connection header names), W3C
// trace context under its lower-case names, Nats-* names spelt as JetStream
// reads them, and Nats-Msg-Id from Idempotency-Key, else from the request's
// own Nats-Msg-Id, else generated. The second result says whether the id
// was generated. A Nats-* header courier does not pass, or an ambiguous id,
// is a 400 refusal.
func messageHeaders(src http.Header) (nats.Header, bool, error) {
	var hop map[string]bool // those the Connection header names; nil reads as none
	for _, v := range src.Values("Connection") {
		if hop == nil {
			hop = map[string]bool{}
		}
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				hop[http.CanonicalHeaderKey(f)] = true
			}
		}
	}
	h := make(nats.Header, len(src)+1)
	for canon, vs := range src {
		if exchangeHeader(canon) || hop[canon] {
			continue
		}
		name := canon
		switch {
		case canon == "Traceparent" || canon == "Tracestate" || canon == "Baggage":
			name = strings.ToLower(canon)
		case strings.HasPrefix(canon, "Nats-"):
			n, ok := natsName(canon)
			if !ok {
				return nil, false, refuse(http.StatusBadRequest, outcomeInvalid,
					"header %s is not accepted: courier passes Nats-Expected-* and Nats-TTL (and Idempotency-Key as Nats-Msg-Id); NATS acts on the other Nats-* headers", canon)
			}
			name = n
		}
		if err := carried(name, vs); err != nil {
			return nil, false, err
		}
		h[name] = vs
	}

	keys := src.Values(HeaderIdempotencyKey)
	ids := h[nats.MsgIdHdr]
	switch {
	case len(keys) > 1 || len(ids) > 1:
		return nil, false, refuse(http.StatusBadRequest, outcomeInvalid, "more than one %s or Nats-Msg-Id: a message has one id", HeaderIdempotencyKey)
	case len(keys) == 1 && len(ids) == 1 && keys[0] != ids[0]:
		return nil, false, refuse(http.StatusBadRequest, outcomeInvalid, "%s %q and Nats-Msg-Id %q differ: send one of them", HeaderIdempotencyKey, keys[0], ids[0])
	case len(keys) == 1 && keys[0] == "", len(ids) == 1 && ids[0] == "":
		return nil, false, refuse(http.StatusBadRequest, outcomeInvalid, "an empty %s: leave it out, or give the message's id", HeaderIdempotencyKey)
	case len(keys) == 1:
		h[nats.MsgIdHdr] = []string{keys[0]}
	case len(ids) == 0:
		h[nats.MsgIdHdr] = []string{generatedIDPrefix + nuid.Next()}
		return h, true, nil
	}
	return h, false, nil
}

// carried refuses (400) a header NATS cannot carry as it is: nats.go
// fails a message, at every attempt, whose header name is not an HTTP
// token (RFC 9110 section 5.6.2: printable ASCII but for the separators,
// the names of NATS's ADR-4 that its isHeaderKeyValid takes), and writes
// a CR or LF of a value as a space (writeHeaderValue), storing another
// value than the one sent. An HTTP request's own headers always pass
// (net/http refuses such a name or value first); a batch entry's, read
// from JSON, need not.
func carried(name string, vs []string) error {
	if !httpguts.ValidHeaderFieldName(name) {
		return refuse(http.StatusBadRequest, outcomeInvalid,
			"header name %q cannot be carried by NATS: a name is one or more printable ASCII characters, none of them a space or one of \"(),/:;<=>?@[\\]{}", name)
	}
	for _, v := range vs {
		if strings.IndexByte(v, '\r') >= 0 || strings.IndexByte(v, '\n') >= 0 {
			return refuse(http.StatusBadRequest, outcomeInvalid,
				"header %s: a value holding a line break (CR or LF) cannot be carried by NATS, which would store a space in its place: %q", name, v)
		}
	}
	return nil
}

// refusal is a publish refused for good: the status to answer, the outcome
// to count and why, for the caller.
type refusal struct {
	status  int
	outcome string
	msg     string
	code    jetstream.ErrorCode // the JetStream API error refused for, if any
}

func (r *refusal) Error() string { return r.msg }

func refuse(status int, outcome, format string, args ...any) *refusal {
	return &refusal{status: status, outcome: outcome, msg: fmt.Sprintf(format, args...)}
}
