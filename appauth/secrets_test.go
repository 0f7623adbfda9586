package appauth

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// TestParseSecrets: a file of secrets is read as the reference libraries
// decode a secret, and every bad line is refused with its number and the
// problem, never its content.
func TestParseSecrets(t *testing.T) {
	a, b := newSecret(t), newSecret(t)
	short := secretPrefix + base64.StdEncoding.EncodeToString(make([]byte, 16))
	long := secretPrefix + base64.StdEncoding.EncodeToString(make([]byte, 65))
	tests := []struct {
		name    string
		file    string
		want    int    // secrets read
		wantErr string // a part of the error
	}{
		{"one", a + "\n", 1, ""},
		{"two, CRLF, blank and comment lines", "# rotation: new first\r\n" + b + "\r\n\r\n  " + a + "  \r\n", 2, ""},
		{"the same twice", a + "\n" + a + "\n", 1, ""},
		{"no prefix", a + "\n" + strings.TrimPrefix(b, secretPrefix) + "\n", 0, "line 2: not a Standard Webhooks secret"},
		{"not base64", secretPrefix + "not*base64!\n", 0, "line 1: the part after whsec_ is not base64"},
		{"unpadded", strings.TrimRight(secretPrefix+base64.StdEncoding.EncodeToString(make([]byte, 32)), "="), 0, "not base64"},
		{"too short", short, 0, "line 1: a secret of 16 bytes: Standard Webhooks asks for 24 to 64"},
		{"too long", long, 0, "a secret of 65 bytes"},
		{"empty", "\n\n# nothing\n", 0, "no secret in the file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys, err := ParseSecrets([]byte(tt.file))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				leaks(t, "the error", err.Error(), a, b)
				if raw := strings.TrimPrefix(strings.TrimSpace(tt.file), secretPrefix); len(raw) > 8 && strings.Contains(err.Error(), raw) {
					t.Errorf("the error quotes the line: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) != tt.want {
				t.Errorf("%d secrets, want %d", len(keys), tt.want)
			}
		})
	}
}

// TestSignVerifiedByGoLibrary: the Standard Webhooks Go library accepts
// every signature, each secret alone (as an app that knows only the new, or
// only the old, secret during a rotation), for a body of any bytes; and
// refuses a changed body, id or timestamp, and a secret not listed.
func TestSignVerifiedByGoLibrary(t *testing.T) {
	secrets := []string{newSecret(t), newSecret(t)}
	keys, err := ParseSecrets([]byte(strings.Join(secrets, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	body := []byte("{\"order\":1}\x00\xff binary too")
	id, ts := "ORDERS:1700000000000000000:42", time.Now().Unix()
	sig := Sign(keys, id, ts, body)
	if n := len(strings.Split(sig, " ")); n != 2 {
		t.Fatalf("%d signatures in %q, want one per secret", n, sig)
	}
	headers := func(id string, ts int64) http.Header {
		h := http.Header{}
		h.Set(HeaderID, id)
		h.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
		h.Set(HeaderSignature, sig)
		return h
	}
	for i, s := range secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := wh.Verify(body, headers(id, ts)); err != nil {
			t.Errorf("secret %d: %v", i+1, err)
		}
		if err := wh.Verify(append(bytes.Clone(body), ' '), headers(id, ts)); err == nil {
			t.Errorf("secret %d: a changed body verifies", i+1)
		}
		if err := wh.Verify(body, headers(id+"x", ts)); err == nil {
			t.Errorf("secret %d: another id verifies", i+1)
		}
		if err := wh.VerifyIgnoringTimestamp(body, headers(id, ts+1)); err == nil {
			t.Errorf("secret %d: another timestamp verifies", i+1)
		}
	}
	other, _ := standardwebhooks.NewWebhook(newSecret(t))
	if err := other.Verify(body, headers(id, ts)); err == nil {
		t.Error("a secret not listed verifies")
	}
}
