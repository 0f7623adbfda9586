package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/testlog"
)

// TestDemoPassesLogVariables: the demo's sidecar logs as the COURIER_LOG_*
// variables courier was started with say (JSON here, where the demo's own
// default is text), read from the environment run is given.
func TestDemoPassesLogVariables(t *testing.T) {
	if testing.Short() {
		t.Skip("demo takes a few seconds")
	}
	var stdout, stderr testlog.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), []string{"demo"}, []string{"COURIER_LOG_FORMAT=json"}, &stdout, &stderr)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo: %v\n%s\n%s", err, stdout.String(), stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("demo did not stop by itself")
	}
	lines := 0
	for line := range strings.Lines(stderr.String()) {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil || entry["msg"] == nil {
			t.Errorf("log line is not a JSON entry: %q", line)
		}
		lines++
	}
	if lines == 0 {
		t.Fatal("the demo's sidecar logged nothing")
	}
}
