package appauth

import (
	"errors"
	"strings"
)

// ParseToken reads a token file: the token, surrounding spaces and newlines
// trimmed (a file written with echo ends in one). It must be printable
// ASCII without spaces, as a bearer token is (RFC 6750 section 2.1), so that
// it travels in a header unchanged. Errors never quote the file.
func ParseToken(b []byte) (string, error) {
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", errors.New("the file is empty: want the token")
	}
	for i := 0; i < len(tok); i++ {
		if c := tok[i]; c <= ' ' || c >= 0x7f {
			return "", errors.New("the token must be one line of printable ASCII without spaces")
		}
	}
	return tok, nil
}
