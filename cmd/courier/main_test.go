package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// A misspelt command is refused (exit 2) with the closest command's name,
// and the usage after it.
func TestRunUnknownCommandSuggests(t *testing.T) {
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"statsu"}, nil, io.Discard, &stderr)
	if code := exitCode(err, &stderr); code != 2 {
		t.Errorf("courier statsu: exit %d, want 2", code)
	}
	for _, want := range []string{`unknown command "statsu": did you mean "status"?`, "Usage:"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("courier statsu: stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}
