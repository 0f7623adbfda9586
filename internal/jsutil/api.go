package jsutil

import (
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// APIPrefix is the JetStream API prefix js sends its requests to ("$JS.API."
// by default, "$JS.<domain>.API." with a domain), for the requests nats.go
// makes but whose answer it does not return whole (a purge's count, a
// message get's own error).
func APIPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		if !strings.HasSuffix(o.APIPrefix, ".") {
			return o.APIPrefix + "."
		}
		return o.APIPrefix
	}
	return jetstream.DefaultAPIPrefix
}
