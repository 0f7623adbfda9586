// Package printable makes text from outside courier (an app's error, a
// subject, an environment variable) safe to show as one line: in a NATS
// header value, where a line break would end the header, or on an
// operator's terminal, where an escape sequence or a bidirectional override
// would change what is shown.
package printable

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// CutMark ends a line that Line cut short. It is ASCII, as NATS header
// values should be (ADR-4).
const CutMark = "..."

// Line returns s as one line of printable text: invalid UTF-8 replaced by
// U+FFFD; every rune unicode.IsPrint refuses (control characters such as
// line breaks, tabs and ESC; format characters such as bidirectional
// overrides; spaces other than U+0020) replaced by a space; surrounding
// spaces trimmed, as the NATS header parser trims them anyway; and, when
// max > 0, cut on a rune boundary to at most max bytes, ending in CutMark.
// Text that is already such a line is returned as it is, so comparing the
// result with s tells whether s was changed.
func Line(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, s)
	s = strings.TrimSpace(s)
	if max <= 0 || len(s) <= max {
		return s
	}
	cut := max - len(CutMark)
	if cut <= 0 {
		return CutMark[:min(max, len(CutMark))]
	}
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.TrimRightFunc(s[:cut], unicode.IsSpace) + CutMark
}
