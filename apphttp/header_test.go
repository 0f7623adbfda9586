package apphttp

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/nats-io/nats.go"
	"golang.org/x/net/http/httpguts"
)

// validFieldName and ValidFieldValue agree with net/http's own rules
// (golang.org/x/net/http/httpguts) on every byte: what courier lets through
// the transport's own check would not refuse, and what it drops would be.
func TestFieldRulesAgreeWithNetHTTP(t *testing.T) {
	for c := 0; c < 256; c++ {
		s := "a" + string([]byte{byte(c)}) + "b"
		if got, want := validFieldName(s), httpguts.ValidHeaderFieldName(s); got != want {
			t.Errorf("validFieldName(%q) = %v, net/http says %v", s, got, want)
		}
		if got, want := ValidFieldValue(s), httpguts.ValidHeaderFieldValue(s); got != want {
			t.Errorf("ValidFieldValue(%q) = %v, net/http says %v", s, got, want)
		}
	}
}

// A message's own headers never pose as courier's: not the ones it sets on
// every request, nor Courier-Batch, which would make one message look like
// a batch of entries of its publisher's choosing to the app.
func TestAppHeadersReserved(t *testing.T) {
	src := nats.Header{
		"Courier-Batch":    {"3"},
		"courier-batch":    {"2"},
		"Courier-Attempt":  {"9"},
		"Courier-Subject":  {"elsewhere"},
		"Courier-Sequence": {"1"},
		"Idempotency-Key":  {"k"},
		"X-Tenant":         {"acme"},
	}
	h := http.Header{}
	dropped := AppHeaders(h, src, false)
	if len(h) != 1 || h.Get("X-Tenant") != "acme" {
		t.Errorf("passed on %v, want X-Tenant alone", h)
	}
	reserved := 0
	for _, d := range dropped {
		if d.Reason == "reserved for courier or HTTP" {
			reserved++
		}
	}
	if reserved != 5 {
		t.Errorf("dropped %v, want the five Courier-* headers as reserved", dropped)
	}
}

// DroppedKinds makes one kind per reason, its names distinct, sorted,
// printable and bounded, its values all counted.
func TestDroppedKinds(t *testing.T) {
	var dropped []DroppedHeader
	for i := range 20 {
		for range 3 {
			dropped = append(dropped, DroppedHeader{Name: fmt.Sprintf("X-%02d", i), Reason: "value not valid in HTTP"})
		}
	}
	dropped = append(dropped, DroppedHeader{Name: "Bad\x1b[2JName", Reason: "not a valid HTTP header name"})
	kinds := DroppedKinds(dropped)
	if len(kinds) != 2 {
		t.Fatalf("DroppedKinds = %+v, want two kinds", kinds)
	}
	v := kinds[0]
	if v.Reason != "value not valid in HTTP" || v.Values != 60 || len(v.Names) != MaxDroppedNames || v.More != 12 || v.Names[0] != "X-00" || v.Names[7] != "X-07" {
		t.Errorf("values kind = %+v", v)
	}
	if n := kinds[1]; n.Values != 1 || len(n.Names) != 1 || n.Names[0] != "Bad [2JName" || n.More != 0 {
		t.Errorf("names kind = %+v", n)
	}
	if DroppedKinds(nil) != nil {
		t.Error("DroppedKinds(nil) is not nil")
	}
}
