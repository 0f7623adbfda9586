// Package natshdr reads NATS message headers the way courier needs: NATS
// header names are case-sensitive, but publishers write them in any case
// ("traceparent", "content-type") and HTTP, where they end up, ignores case.
// It also counts what headers cost on the wire (Size), which the server's
// max_payload counts with the body.
package natshdr

import (
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

// Get returns the first value of the header name as sent, else of a header
// whose name matches name in any case, else "".
func Get(h nats.Header, name string) string {
	if vs := h[name]; len(vs) > 0 {
		return vs[0]
	}
	for k, vs := range h {
		if len(vs) > 0 && strings.EqualFold(k, name) {
			return vs[0]
		}
	}
	return ""
}

// SourceHeader is the header the server adds to each message a stream
// sources from another: "<stream> <seq> <filters> <destinations> <subject>
// [<id>]", the filters and destinations of several transforms joined by form
// feeds (nats-server stream.go, genSourceHeader).
const SourceHeader = "Nats-Stream-Source"

// Source reads h's SourceHeader: the stream, sequence and subject of the
// message the sourced one copies; ok is false without a header in that form.
func Source(h nats.Header) (stream string, seq uint64, subject string, ok bool) {
	f := strings.Split(h.Get(SourceHeader), " ")
	if len(f) < 5 || f[0] == "" || f[4] == "" {
		return "", 0, "", false
	}
	seq, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return "", 0, "", false
	}
	return f[0], seq, f[4], true
}

// SourceDestinations is the transform destinations h's SourceHeader names,
// several joined by form feeds: those of the source that copied the
// message. "" without a header in that form.
func SourceDestinations(h nats.Header) string {
	if _, _, _, ok := Source(h); !ok {
		return ""
	}
	return strings.Split(h.Get(SourceHeader), " ")[3]
}
