package config

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/courierhq/courier/internal/subject"
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
	var serr *subject.Error
	if errors.As(subject.Check(s), &serr) {
		return serr.Why
	}
	return ""
}

// isLiteral reports whether a valid subject has no wildcard token.
func isLiteral(s string) bool { return subject.IsLiteral(s) }

// SubjectMatches reports whether the NATS subject filter pattern, which may
// hold wildcards ('*' for one token, '>' as the last token for one or more),
// matches the literal subject. Tokens of subject are compared literally,
// wildcards included. The runtime uses it to check the stream's subjects
// against COURIER_DLQ_SUBJECT when COURIER_SUBJECTS is empty.
func SubjectMatches(pattern, s string) bool { return subject.Matches(pattern, s) }

// subjectsCollide reports whether some literal subject matches both
// patterns.
func subjectsCollide(a, b string) bool { return subject.Overlap(a, b) }
