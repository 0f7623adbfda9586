// Package natshdr reads NATS message headers the way courier needs: NATS
// header names are case-sensitive, but publishers write them in any case
// ("traceparent", "content-type") and HTTP, where they end up, ignores case.
package natshdr

import (
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
