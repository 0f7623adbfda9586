package promqlcheck

import (
	"fmt"
	"regexp"
	"strings"
)

// kind is a token's kind.
type kind int

const (
	tEOF kind = iota
	tIdent
	tNumber
	tDuration
	tString
	tOp // binary or matcher operator, text in tok.text
	tLParen
	tRParen
	tLBrace
	tRBrace
	tLBrack
	tRBrack
	tComma
	tColon
	tAt
)

type token struct {
	kind kind
	text string
	pos  int
}

var (
	durationRe = regexp.MustCompile(`^([0-9]+(ms|[smhdwy]))+`)
	numberRe   = regexp.MustCompile(`^(0[xX][0-9a-fA-F]+|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?)`)
	identRe    = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*`)
)

// operators, longest first so that "<=" wins over "<".
var operators = []string{"==", "!=", "<=", ">=", "=~", "!~", "+", "-", "*", "/", "%", "^", "<", ">", "="}

// lex splits src into tokens; comments (# to the end of the line) and
// white space are dropped.
func lex(src string) ([]token, error) {
	var toks []token
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
			continue
		case c == '#':
			for i < len(src) && src[i] != '\n' {
				i++
			}
			continue
		}
		rest := src[i:]
		if k, ok := punct[c]; ok {
			toks = append(toks, token{k, string(c), i})
			i++
			continue
		}
		if c == '"' || c == '\'' || c == '`' {
			n, err := stringEnd(rest)
			if err != nil {
				return nil, fmt.Errorf("at %d: %w", i, err)
			}
			toks = append(toks, token{tString, rest[:n], i})
			i += n
			continue
		}
		if c >= '0' && c <= '9' || c == '.' {
			if m := durationRe.FindString(rest); m != "" && !identChar(rest, len(m)) {
				toks = append(toks, token{tDuration, m, i})
				i += len(m)
				continue
			}
			m := numberRe.FindString(rest)
			if m == "" || identChar(rest, len(m)) {
				return nil, fmt.Errorf("at %d: bad number or duration %q", i, head(rest))
			}
			toks = append(toks, token{tNumber, m, i})
			i += len(m)
			continue
		}
		if m := identRe.FindString(rest); m != "" {
			toks = append(toks, token{tIdent, m, i})
			i += len(m)
			continue
		}
		op := ""
		for _, o := range operators {
			if strings.HasPrefix(rest, o) {
				op = o
				break
			}
		}
		if op == "" {
			return nil, fmt.Errorf("at %d: unexpected character %q", i, c)
		}
		toks = append(toks, token{tOp, op, i})
		i += len(op)
	}
	return append(toks, token{tEOF, "", len(src)}), nil
}

var punct = map[byte]kind{
	'(': tLParen, ')': tRParen, '{': tLBrace, '}': tRBrace, '[': tLBrack, ']': tRBrack,
	',': tComma, ':': tColon, '@': tAt,
}

// identChar reports whether s[i] continues an identifier (so a number or
// duration before it is not one).
func identChar(s string, i int) bool {
	if i >= len(s) {
		return false
	}
	c := s[i]
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// stringEnd returns the length of the quoted string at the start of s.
func stringEnd(s string) (int, error) {
	q := s[0]
	for i := 1; i < len(s); i++ {
		switch {
		case s[i] == '\\' && q != '`':
			i++
		case s[i] == '\n' && q != '`':
			return 0, fmt.Errorf("unterminated string %q", head(s))
		case s[i] == q:
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string %q", head(s))
}

func head(s string) string {
	if len(s) > 20 {
		return s[:20] + "..."
	}
	return s
}
