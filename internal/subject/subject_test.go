package subject_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/courierhq/courier/internal/subject"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		s       string
		why     string // part of the reason; "" = valid
		literal bool   // valid for CheckLiteral too
	}{
		{"orders", "", true},
		{"orders.created", "", true},
		{"orders.*.paid", "", false},
		{"orders.>", "", false},
		{">", "", false},
		{"*", "", false},
		{"$JS.API.STREAM.NAMES", "", true},
		{"orders.café", "", true},
		{"", "is empty", false},
		{"orders..created", "empty token", false},
		{".orders", "empty token", false},
		{"orders.", "empty token", false},
		{"a.>.b", "'>' can only be the last token", false},
		{"orders*", "wildcards only as whole tokens", false},
		{"orders.a>", "wildcards only as whole tokens", false},
		{"a b.c", "whitespace", false},
		{"a\tb", "whitespace", false},
		{"a\nb", "whitespace", false},
		{"a\x01b", "non-printable", false},
		{"orders.caf\xe9", "not valid UTF-8", false},
	}
	for _, tt := range tests {
		err := subject.Check(tt.s)
		switch {
		case tt.why == "" && err != nil:
			t.Errorf("Check(%q) = %v, want nil", tt.s, err)
		case tt.why != "" && (err == nil || !strings.Contains(err.Error(), tt.why)):
			t.Errorf("Check(%q) = %v, want an error saying %q", tt.s, err, tt.why)
		}
		if err != nil {
			var serr *subject.Error
			if !errors.As(err, &serr) || serr.Subject != tt.s || !strings.HasPrefix(err.Error(), `"`) {
				t.Errorf("Check(%q) = %#v, want a *subject.Error naming the subject first", tt.s, err)
			}
		}
		if lerr := subject.CheckLiteral(tt.s); (lerr == nil) != tt.literal {
			t.Errorf("CheckLiteral(%q) = %v, want ok=%v", tt.s, lerr, tt.literal)
		}
	}
}

func TestMatches(t *testing.T) {
	tests := []struct {
		filter, subject string
		want            bool
	}{
		{"a.b.c", "a.b.c", true},
		{"a.b.c", "a.b", false},
		{"a.b", "a.b.c", false},
		{"a.*.c", "a.b.c", true},
		{"a.*.c", "a.b.d", false},
		{"a.*", "a.b.c", false},
		{"*", "a", true},
		{"*", "a.b", false},
		{"*.*.*", "a.b.c", true},
		{">", "a", true},
		{">", "a.b.c", true},
		{"a.>", "a", false},
		{"a.>", "a.b", true},
		{"a.>", "a.b.c", true},
		{"a.>", "b.c", false},
		{"*.b.>", "a.b.c.d", true},
		{"*.b.>", "a.b", false},
		{"a.b", "A.b", false}, // subjects are case-sensitive
		{"a.*", "a.*", true},  // a wildcard in the subject is a literal token
		{"a.b", "a.*", false},
		{"orders.>", "orders.caf\xe9", true}, // not UTF-8: compared as bytes
		{"orders.caf\xe9", "orders.caf\uFFFD", false},
	}
	for _, tt := range tests {
		if got := subject.Matches(tt.filter, tt.subject); got != tt.want {
			t.Errorf("Matches(%q, %q) = %v, want %v", tt.filter, tt.subject, got, tt.want)
		}
	}
}

func TestOverlap(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"a.b", "a.b", true},
		{"a.b", "a.c", false},
		{"a.*", "a.b", true},
		{"a.*", "*.b", true},
		{"a.*", "a.b.c", false},
		{"a.>", "a.b.c", true},
		{"a.>", "a", false},
		{"a.>", "b.>", false},
		{">", "x.y", true},
		{"*.x", "y.*", true},
		{"*.x", "y.z", false},
		{"a.*.c", "a.>", true},
	}
	for _, tt := range tests {
		for _, pair := range [][2]string{{tt.a, tt.b}, {tt.b, tt.a}} {
			if got := subject.Overlap(pair[0], pair[1]); got != tt.want {
				t.Errorf("Overlap(%q, %q) = %v, want %v", pair[0], pair[1], got, tt.want)
			}
		}
	}
}

func TestWithin(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"a.b", "a.b", true},
		{"a.b", "a.*", true},
		{"a.*", "a.b", false},
		{"a.*", "a.>", true},
		{"a.>", "a.*", false},
		{"a.b.c", "a.>", true},
		{"a", "a.>", false},
		{"a.>", "a.>", true},
		{"a.>", ">", true},
		{">", "a.>", false},
		{"_sched.ORDERS.>", "_sched.>", true},
		{"_sched.>", "_sched.ORDERS.>", false},
		{"a.b", "a.b.c", false},
		{"a.b.c", "a.b", false},
		{"*.b", "a.b", false},
	}
	for _, tt := range tests {
		if got := subject.Within(tt.a, tt.b); got != tt.want {
			t.Errorf("Within(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestMeet(t *testing.T) {
	tests := []struct {
		a, b string
		want string // "" for none
	}{
		{"a.b", "a.b", "a.b"},
		{"a.b", "a.c", ""},
		{"a.*", "*.b", "a.b"},
		{">", "orders.>", "orders.>"},
		{"orders.>", "*.paid", "orders.paid"},
		{"a.*.c", "a.>", "a.*.c"},
		{"a.>", "a.b.>", "a.b.>"},
		{"*.>", "a", ""},
		{"*.*", "a.>", "a.*"},
	}
	for _, tt := range tests {
		for _, pair := range [][2]string{{tt.a, tt.b}, {tt.b, tt.a}} {
			got, ok := subject.Meet(pair[0], pair[1])
			if got != tt.want || ok != (tt.want != "") {
				t.Errorf("Meet(%q, %q) = %q, %v, want %q", pair[0], pair[1], got, ok, tt.want)
			}
		}
	}
}
