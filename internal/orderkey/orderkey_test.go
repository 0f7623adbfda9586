package orderkey

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

func TestParse(t *testing.T) {
	h := nats.Header{"Order-Id": {"o-7"}, "empty": {""}}
	for _, c := range []struct {
		spec, subject string
		key           string
		ok            bool
	}{
		{"subject:2", "orders.o-1.paid", "o-1", true},
		{"subject:1", "orders", "orders", true},
		{"subject:3", "orders.o-1", "", false},
		{"SUBJECT:3", "orders.o-1.paid", "paid", true},
		{"header:Order-Id", "x", "o-7", true},
		{"header:order-id", "x", "o-7", true}, // NATS header names in any case
		{"header:Missing", "x", "", false},
		{"header:empty", "x", "", false},
	} {
		k, err := Parse(c.spec)
		if err != nil {
			t.Fatalf("%s: %v", c.spec, err)
		}
		if key, ok := k(c.subject, h); key != c.key || ok != c.ok {
			t.Errorf("%s of %s = %q %v, want %q %v", c.spec, c.subject, key, ok, c.key, c.ok)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for spec, want := range map[string]string{
		"order":        `must be "subject:N"`,
		"subject:0":    "whole number from 1",
		"subject:x":    "whole number from 1",
		"header:":      "not a header name",
		"header:a b":   "not a header name",
		"body:$.id":    `the key is "subject:N" or "header:NAME"`,
		"subject:-1.5": "whole number from 1",
	} {
		if _, err := Parse(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error saying %q", spec, err, want)
		}
	}
}

func TestSubjectToken(t *testing.T) {
	for spec, want := range map[string]int{"subject:2": 2, "Subject:7": 7, "header:Order-Id": 0, "subject:0": 0, "subject:x": 0, "x": 0} {
		n, ok := SubjectToken(spec)
		if n != want && ok || ok != (want > 0) {
			t.Errorf("SubjectToken(%q) = %d %v, want %d", spec, n, ok, want)
		}
	}
}
