package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// An invalid configuration stops every command that loads it (the sidecar
// first) with exit status 2, listing every problem and, with them, the
// warnings `courier config` prints: a misspelt variable is often why a
// required one is missing.
func TestInvalidConfigAlsoWarns(t *testing.T) {
	env := []string{
		"COURIER_APP_URL=http://127.0.0.1:8080/", "COURIER_STRAEM=ORDERS", // misspelt: COURIER_STREAM unset
		"COURIER_ACK_WAIT=banana", "COURIER_ADMIN_ADDR=127.0.0.1:0",
	}
	for _, args := range [][]string{nil, {"dlq", "ls"}, {"status"}} {
		var stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := run(ctx, args, env, io.Discard, &stderr)
		cancel()
		if code := exitCode(err, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2\n%s", args, code, stderr.String())
		}
		for _, want := range []string{
			"invalid configuration",
			"COURIER_STREAM",
			`COURIER_ACK_WAIT="banana": not a duration`,
			"COURIER_STRAEM is not a courier variable and is ignored: did you mean COURIER_STREAM?",
		} {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("%q: stderr lacks %q:\n%s", args, want, stderr.String())
			}
		}
	}
}
