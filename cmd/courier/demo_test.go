package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestDemoPassesLogVariables: the demo's sidecar logs as the COURIER_LOG_*
// variables courier was started with say (JSON here, where the demo's own
// default is text), read from the environment run is given.
func TestDemoPassesLogVariables(t *testing.T) {
	if testing.Short() {
		t.Skip("demo takes a few seconds")
	}
	_, logs := runDemoForTest(t, []string{"COURIER_LOG_FORMAT=json"})
	lines := 0
	for line := range strings.Lines(logs) {
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
