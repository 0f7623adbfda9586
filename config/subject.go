package config

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxNameLen is JetStream's limit on stream and consumer names.
const maxNameLen = 255

// checkName explains why name is not a valid JetStream stream or consumer
// name, or returns "". The rules are the server's and the client's: no
// whitespace, '.', '*', '>', path separators or non-printable characters.
func checkName(name string) string {
	const rule = "whitespace, '.', '*', '>', '/', '\\' and non-printable characters are not allowed"
	switch {
	case name == "":
		return "must not be empty"
	case len(name) > maxNameLen:
		return fmt.Sprintf("longer than %d bytes, JetStream's limit", maxNameLen)
	case !utf8.ValidString(name):
		return "not valid UTF-8"
	}
	for _, r := range name {
		switch {
		case unicode.IsSpace(r) || !unicode.IsPrint(r):
			return "not a valid JetStream name: " + rule
		case strings.ContainsRune(".*>/\\", r):
			return fmt.Sprintf("not a valid JetStream name: it contains %q (%s)", r, rule)
		}
	}
	return ""
}

// checkSubject explains why s is not a valid NATS subject (wildcards
// allowed), or returns "".
func checkSubject(s string) string {
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
			// NATS would take such a token literally; that is never what
			// was meant.
			return "is not a valid subject: '*' and '>' are wildcards only as whole tokens, such as orders.*.created or orders.>"
		}
	}
	return ""
}

// isLiteral reports whether a valid subject has no wildcard token.
func isLiteral(s string) bool {
	for t := range strings.SplitSeq(s, ".") {
		if t == "*" || t == ">" {
			return false
		}
	}
	return true
}

// SubjectMatches reports whether the NATS subject filter pattern, which may
// hold wildcards ('*' for one token, '>' as the last token for one or more),
// matches the literal subject. Tokens of subject are compared literally,
// wildcards included. The runtime uses it to check the stream's subjects
// against COURIER_DLQ_SUBJECT when COURIER_SUBJECTS is empty.
func SubjectMatches(pattern, subject string) bool {
	pt := strings.Split(pattern, ".")
	st := strings.Split(subject, ".")
	for i, p := range pt {
		if p == ">" {
			return len(st) > i
		}
		if i >= len(st) || (p != "*" && p != st[i]) {
			return false
		}
	}
	return len(pt) == len(st)
}

// subjectsCollide reports whether some literal subject matches both
// patterns.
func subjectsCollide(a, b string) bool {
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
