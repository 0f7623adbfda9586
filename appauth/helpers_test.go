package appauth

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/courierhq/courier/internal/testlog"
)

// newSecret returns a fresh Standard Webhooks secret as a file lists it.
func newSecret(t testing.TB) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return secretPrefix + base64.StdEncoding.EncodeToString(b)
}

// writeFile writes content to path atomically (as a Kubernetes Secret
// volume or an editor's save does), so that a poll never reads half of it.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// jsonLogger returns a logger writing JSON lines to a buffer the test reads.
func jsonLogger() (*slog.Logger, *testlog.Buffer) {
	buf := &testlog.Buffer{}
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// count is how many lines of logs hold s.
func count(logs, s string) int {
	n := 0
	for line := range strings.Lines(logs) {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// leaks fails t if text holds any of the secrets: as listed, or decoded.
func leaks(t *testing.T, what, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		raw := strings.TrimPrefix(s, secretPrefix)
		key, _ := base64.StdEncoding.DecodeString(raw)
		if strings.Contains(text, raw) || (len(key) > 0 && bytes.Contains([]byte(text), key)) {
			t.Errorf("%s holds a secret:\n%s", what, text)
		}
	}
}
