package printable

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestLine(t *testing.T) {
	tests := []struct {
		name, in string
		max      int
		want     string
	}{
		{"plain", "boom", 0, "boom"},
		{"empty", "", 0, ""},
		{"only spaces", " \t\r\n", 0, ""},
		{"newlines", "line one\r\nline two\n", 0, "line one  line two"},
		{"control", "a\x00b\tc\x7fd\u0085e", 0, "a b c d e"},
		{"terminal escape", "\x1b[31mred\x1b[0m", 0, "[31mred [0m"},
		{"bidirectional override", "abc\u202edcba\u2066x\u2069", 0, "abc dcba x"},
		{"other spaces and separators", "a\u00a0b\u2028c\u3000d\u200be", 0, "a b c d e"},
		{"invalid utf8", "bad\xffbyte", 0, "bad\uFFFDbyte"},
		{"surrounding space", "  \x00 padded \t", 0, "padded"},
		{"multi-byte kept", "café € 日本", 0, "café € 日本"},
		{"exactly max", strings.Repeat("x", 16), 16, strings.Repeat("x", 16)},
		{"one over max", strings.Repeat("x", 17), 16, strings.Repeat("x", 13) + "..."},
		{"space before the cut", "0123456789 bcdefg", 14, "0123456789..."},
		// "é" is 2 bytes, "€" 3: the cut falls between runes.
		{"two-byte runes", strings.Repeat("é", 10), 16, strings.Repeat("é", 6) + "..."},
		{"three-byte runes", strings.Repeat("€", 10), 16, strings.Repeat("€", 4) + "..."},
		{"max within the mark", "abcdef", 2, ".."},
		{"max of the mark", "abcdef", 3, "..."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Line(tt.in, tt.max)
			if got != tt.want {
				t.Errorf("Line(%q, %d) = %q, want %q", tt.in, tt.max, got, tt.want)
			}
			if !utf8.ValidString(got) || strings.ContainsFunc(got, func(r rune) bool { return !unicode.IsPrint(r) }) {
				t.Errorf("Line(%q, %d) = %q, not printable", tt.in, tt.max, got)
			}
			if tt.max > 0 && len(got) > tt.max {
				t.Errorf("Line(%q, %d) = %q, %d bytes", tt.in, tt.max, got, len(got))
			}
			if again := Line(got, tt.max); again != got {
				t.Errorf("Line of its own result %q = %q, want it unchanged", got, again)
			}
		})
	}
}
