package main

import (
	"runtime/debug"
	"testing"
)

func TestTuneGC(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })

	env := map[string]string{}
	getenv := func(k string) string { return env[k] }

	tuneGC(getenv)
	if got := debug.SetGCPercent(100); got != defaultGCPercent {
		t.Errorf("GOGC unset: GC percent %d, want %d", got, defaultGCPercent)
	}

	// GOGC set: the runtime has applied it; courier leaves it alone.
	env["GOGC"] = "200"
	debug.SetGCPercent(200)
	tuneGC(getenv)
	if got := debug.SetGCPercent(100); got != 200 {
		t.Errorf("GOGC=200: GC percent %d, want 200 left as set", got)
	}
}
