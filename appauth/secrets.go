package appauth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
)

// secretPrefix starts a symmetric Standard Webhooks secret as the
// specification serializes it.
const secretPrefix = "whsec_"

// Secret sizes the specification allows: at least 24 bytes, at most 64
// (512 bits).
const (
	minSecret = 24
	maxSecret = 64
)

// ParseSecrets reads a secrets file: one "whsec_<base64>" a line (standard
// base64, padded, as the reference libraries decode it), each secret 24 to
// 64 bytes. Blank lines and lines starting with '#' are skipped, and
// surrounding spaces trimmed; the same secret twice counts once. A file
// listing none is an error: it would sign nothing. Errors give the line
// number and the problem, never the line.
//
// Several secrets are how one is rotated: list the new one beside the old,
// let the app trust the new one, then remove the old (docs/operations.md).
func ParseSecrets(b []byte) ([][]byte, error) {
	var keys [][]byte
	for n, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		key, err := parseSecret(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n+1, err)
		}
		dup := false
		for _, k := range keys {
			dup = dup || bytes.Equal(k, key)
		}
		if !dup {
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("no secret in the file: want one whsec_<base64> a line")
	}
	return keys, nil
}

func parseSecret(line []byte) ([]byte, error) {
	enc, ok := bytes.CutPrefix(line, []byte(secretPrefix))
	if !ok {
		return nil, errors.New("not a Standard Webhooks secret: want whsec_ followed by the secret in base64")
	}
	key := make([]byte, base64.StdEncoding.DecodedLen(len(enc)))
	n, err := base64.StdEncoding.Decode(key, enc)
	if err != nil {
		return nil, errors.New("the part after whsec_ is not base64 (standard alphabet, with padding)")
	}
	key = key[:n]
	if len(key) < minSecret || len(key) > maxSecret {
		return nil, fmt.Errorf("a secret of %d bytes: Standard Webhooks asks for %d to %d random bytes", len(key), minSecret, maxSecret)
	}
	return key, nil
}

// Sign returns the webhook-signature value of a request with id, sent at
// Unix second ts, with body: "v1,<base64 HMAC-SHA256 of id.ts.body>" for
// each key, space separated, in the order of the file.
func Sign(keys [][]byte, id string, ts int64, body []byte) string {
	return newKeyring(keys).sign(id, ts, body)
}

// keyring is the secrets of one read of the file, each as an HMAC already
// keyed: a signature clones it rather than hashing the key's pads again.
// Immutable once made, so safe for concurrent use.
type keyring struct {
	macs []hash.Cloner
}

func newKeyring(keys [][]byte) *keyring {
	k := &keyring{macs: make([]hash.Cloner, len(keys))}
	for i, key := range keys {
		k.macs[i] = hmac.New(sha256.New, key).(hash.Cloner) // every standard library hash is one
	}
	return k
}

// parseKeyring is ParseSecrets, keyed for signing.
func parseKeyring(b []byte) (*keyring, error) {
	keys, err := ParseSecrets(b)
	if err != nil {
		return nil, err
	}
	return newKeyring(keys), nil
}

func (k *keyring) sign(id string, ts int64, body []byte) string {
	var tsBuf [20]byte
	stamp := strconv.AppendInt(tsBuf[:0], ts, 10)
	out := make([]byte, 0, len(k.macs)*(len("v1,")+base64.StdEncoding.EncodedLen(sha256.Size)+1))
	var sum [sha256.Size]byte
	for i, keyed := range k.macs {
		c, err := keyed.Clone()
		if err != nil {
			panic("appauth: cloning an HMAC-SHA256: " + err.Error()) // the standard library's never fails
		}
		m := c.(hash.Hash)
		_, _ = io.WriteString(m, id)
		m.Write([]byte{'.'})
		m.Write(stamp)
		m.Write([]byte{'.'})
		m.Write(body)
		if i > 0 {
			out = append(out, ' ')
		}
		out = append(out, "v1,"...)
		out = base64.StdEncoding.AppendEncode(out, m.Sum(sum[:0]))
	}
	return string(out)
}
