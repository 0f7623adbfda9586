package natshdr

import (
	"net/textproto"

	"github.com/nats-io/nats.go"
)

// Size is the size of h as nats.go sends it (Msg.headerBytes): "NATS/1.0\r\n",
// a LineSize for each value, and a closing "\r\n"; 0 when h is empty, as
// then no header block is sent. The server counts it with the body against
// max_payload.
func Size(h nats.Header) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += LineSize(k, v)
		}
	}
	return n
}

// LineSize is what one value of the header name adds to Size: the line
// "name: value\r\n", where nats.go trims the value's surrounding ASCII
// spaces (writeHeaderValue) and sends a CR or LF inside it as a space, of
// the same size.
func LineSize(name, value string) int {
	return len(name) + len(": ") + len(textproto.TrimString(value)) + len("\r\n")
}
