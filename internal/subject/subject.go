// Package subject holds NATS's subject rules, written once for courier:
// what a valid subject or subject filter is, whether a filter matches a
// subject, and whether two filters overlap. It imports nothing of courier's.
//
// A subject is tokens separated by '.'; a filter may use '*' for one token
// and '>' as its last token for one or more. The rules here are stricter
// than the server's in one way: a token such as "orders*", which NATS takes
// literally, is refused, since it is never what was meant.
package subject

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Error says why a subject is not valid.
type Error struct {
	// Subject is the subject as given.
	Subject string
	// Why completes a sentence starting with the subject, such as "is not
	// a valid subject: it has an empty token (...)".
	Why string
}

func (e *Error) Error() string { return fmt.Sprintf("%q %s", e.Subject, e.Why) }

// Check explains why s is not a valid subject filter (a subject, wildcards
// allowed): empty, not UTF-8, an empty token (a leading, trailing or doubled
// '.'), whitespace or a non-printable character, '>' before the last token,
// or '*' or '>' inside a token. It returns nil for a valid one, else an
// *Error.
func Check(s string) error {
	if why := check(s); why != "" {
		return &Error{Subject: s, Why: why}
	}
	return nil
}

// CheckLiteral is Check for a subject to publish to: it also refuses the
// wildcards '*' and '>'.
func CheckLiteral(s string) error {
	if err := Check(s); err != nil {
		return err
	}
	if !IsLiteral(s) {
		return &Error{Subject: s, Why: "is not a literal subject: '*' and '>' are wildcards, and a message cannot be published to one"}
	}
	return nil
}

func check(s string) string {
	if s == "" {
		return "is empty"
	}
	if !utf8.ValidString(s) {
		return "is not valid UTF-8"
	}
	tokens := strings.Split(s, ".")
	for i, t := range tokens {
		switch {
		case t == "":
			return "is not a valid subject: it has an empty token (a leading, trailing or doubled '.')"
		case strings.ContainsFunc(t, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }):
			return "is not a valid subject: it contains whitespace or a non-printable character"
		case t == ">" && i != len(tokens)-1:
			return "is not a valid subject: '>' can only be the last token"
		case t != "*" && t != ">" && strings.ContainsAny(t, "*>"):
			return "is not a valid subject: '*' and '>' are wildcards only as whole tokens, such as orders.*.created or orders.>"
		}
	}
	return ""
}

// IsLiteral reports whether a valid subject has no wildcard token.
func IsLiteral(s string) bool {
	for t := range strings.SplitSeq(s, ".") {
		if t == "*" || t == ">" {
			return false
		}
	}
	return true
}

// Matches reports whether filter, which may hold wildcards, matches subject.
// Tokens of subject are compared literally, wildcards included, and byte for
// byte (subjects are case-sensitive and need not be UTF-8).
func Matches(filter, subject string) bool {
	for {
		ft, frest, fmore := strings.Cut(filter, ".")
		st, srest, smore := strings.Cut(subject, ".")
		switch {
		case ft == ">" && !fmore:
			return true // one or more tokens: st is at least one
		case ft != "*" && ft != st:
			return false
		case fmore != smore:
			return false
		case !fmore:
			return true
		}
		filter, subject = frest, srest
	}
}

// Overlap reports whether some subject matches both filters a and b (a
// consumer's filter subjects must not overlap).
func Overlap(a, b string) bool {
	at := strings.Split(a, ".")
	bt := strings.Split(b, ".")
	for i := range min(len(at), len(bt)) {
		x, y := at[i], bt[i]
		if x == ">" || y == ">" {
			return true
		}
		if x != "*" && y != "*" && x != y {
			return false
		}
	}
	return len(at) == len(bt)
}

// Within reports whether every subject filter a matches is matched by b
// too: a is b itself or narrower ("orders.*" is within "orders.>", and
// "orders.>" is not within "orders.*").
func Within(a, b string) bool {
	at := strings.Split(a, ".")
	bt := strings.Split(b, ".")
	for i, y := range bt {
		if i >= len(at) {
			return false
		}
		x := at[i]
		switch {
		case y == ">":
			return true // x is one token or more, as '>' takes
		case x == ">":
			return false
		case y == "*" || x == y:
			continue
		}
		return false
	}
	return len(at) == len(bt)
}

// Meet returns the filter that matches exactly the subjects both a and b
// match, and false when they have none in common (they do not Overlap):
// a token of each, the narrower of the two ("orders.>" and "*.paid" meet
// in "orders.paid").
func Meet(a, b string) (string, bool) {
	if !Overlap(a, b) {
		return "", false
	}
	at := strings.Split(a, ".")
	bt := strings.Split(b, ".")
	out := make([]string, 0, max(len(at), len(bt)))
	for i := 0; ; i++ {
		x, y := at[i], bt[i]
		switch {
		case x == ">":
			return strings.Join(append(out, bt[i:]...), "."), true
		case y == ">":
			return strings.Join(append(out, at[i:]...), "."), true
		case x == "*":
			out = append(out, y)
		default:
			out = append(out, x)
		}
		if i == len(at)-1 { // Overlap: as many tokens in both
			return strings.Join(out, "."), true
		}
	}
}
