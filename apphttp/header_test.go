package apphttp

import (
	"testing"

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
