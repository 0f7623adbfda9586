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

// natsSubjectMatches reports whether the filter (wildcards allowed) matches
// the literal subject s (internal/subject's rules).
func natsSubjectMatches(filter, s string) bool { return subject.Matches(filter, s) }

// subjectsCollide reports whether some literal subject matches both
// patterns.
func subjectsCollide(a, b string) bool { return subject.Overlap(a, b) }

// reservedPrefix returns the start of s that NATS keeps for itself, or ""
// (internal/subject's Reserved): what courier publishes there would be API
// calls, system traffic or replies, not stored messages.
func reservedPrefix(s string) string { return subject.Reserved(s) }
