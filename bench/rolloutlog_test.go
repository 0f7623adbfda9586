package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWorstWaitNamesTheCouriersLinesMeanwhile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, lines string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(lines), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c0 := write("c0.log", `{"time":"2026-12-08T10:00:00.5Z","level":"INFO","msg":"courier starting","version":"dev"}
{"time":"2026-12-08T10:00:01.2Z","level":"INFO","msg":"stop signal received","grace":"25s"}
not JSON
{"time":"2026-12-08T10:00:01.3Z","level":"WARN","msg":"cannot record","error":"context canceled"}
{"time":"2026-12-08T10:00:09Z","level":"INFO","msg":"long after"}
`)
	c1 := write("c1.log", `{"time":"2026-12-08T10:00:02Z","level":"INFO","msg":"consuming again","not_consuming_for":"1s"}
{"time":"2026-12-08T10:00:02.1Z","level":"INFO","msg":"consuming","stream":"S"}
`)
	logs := []courierLog{readCourierLog(c0), readCourierLog(c1)}

	start := time.Date(2026, 12, 8, 10, 0, 1, 0, time.UTC)
	sent := []time.Time{start.Add(-time.Second), start.Add(500 * time.Millisecond), start.Add(time.Second)}
	tl := newTally(1, len(sent))
	for id, lat := range []time.Duration{5 * time.Second, 2 * time.Second, time.Millisecond} {
		tl.seen[id].Store(true)
		tl.lat[id].Store(int64(lat))
	}
	name, cause := worstWait(tl, sent, start, start.Add(2*time.Second), logs)
	if !strings.HasPrefix(name, "message 1 (entity e1), published +0.500s into the event, waited 2.00 s") {
		t.Errorf("worst = %q, want message 1", name)
	}
	want := []string{
		"-0.300s c0 INFO stop signal received grace=25s",
		"-0.200s c0 WARN cannot record error=context canceled",
		"+0.500s c1 INFO consuming again not_consuming_for=1s",
	}
	if strings.Join(cause, "\n") != strings.Join(want, "\n") {
		t.Errorf("cause =\n%s\nwant\n%s", strings.Join(cause, "\n"), strings.Join(want, "\n"))
	}
	if n, first := warnings(logs); n != 1 || first != "c0 WARN cannot record error=context canceled" {
		t.Errorf("warnings = %d, %q", n, first)
	}
}
