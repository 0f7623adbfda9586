package natshdr

import (
	"testing"

	"github.com/nats-io/nats.go"
)

func TestGet(t *testing.T) {
	h := nats.Header{"traceparent": {"lower"}, "Content-Type": {"canon"}, "X-Two": {"first", "second"}, "Empty": {}}
	for _, tc := range []struct{ name, want string }{
		{"traceparent", "lower"}, {"Traceparent", "lower"}, {"content-type", "canon"},
		{"X-Two", "first"}, {"Empty", ""}, {"Missing", ""},
	} {
		if got := Get(h, tc.name); got != tc.want {
			t.Errorf("Get(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}
