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

func TestSource(t *testing.T) {
	h := nats.Header{SourceHeader: {"ORDERS 42 orders.*.>\forders.* {{partition(4,1)}}.orders.{{wildcard(1)}}.>\f{{partition(4,1)}}.orders.{{wildcard(1)}} orders.o1.paid Qsb5Ci"}}
	stream, seq, subject, ok := Source(h)
	if !ok || stream != "ORDERS" || seq != 42 || subject != "orders.o1.paid" {
		t.Errorf("Source = %q %d %q %v, want ORDERS 42 orders.o1.paid", stream, seq, subject, ok)
	}
	if d := SourceDestinations(h); d != "{{partition(4,1)}}.orders.{{wildcard(1)}}.>\f{{partition(4,1)}}.orders.{{wildcard(1)}}" {
		t.Errorf("SourceDestinations = %q", d)
	}
	if d := SourceDestinations(nats.Header{SourceHeader: {"ORDERS 42"}}); d != "" {
		t.Errorf("SourceDestinations of a header not in form = %q, want none", d)
	}
	for _, v := range []string{"", "ORDERS 42", "ORDERS x a b orders.x", "ORDERS 1 a b"} {
		if _, _, _, ok := Source(nats.Header{SourceHeader: {v}}); ok {
			t.Errorf("Source(%q) reports an origin", v)
		}
	}
}
