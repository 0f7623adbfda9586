package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
)

// messages returns the msg of every JSON log line, in order.
func messages(logs *testlog.Buffer) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var rec struct{ Msg string }
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg != "" {
			out = append(out, rec.Msg)
		}
	}
	return out
}

// A real SIGTERM to a courier with its publish API on: the log says a stop
// signal came; the API, with no publish going on, closes without waiting
// out the grace period (60s here); "courier stopped" is the last line.
func TestSIGTERMWithPublishAPI(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	ch := startChild(t, h.env(a.URL, append(publishEnv, "COURIER_SHUTDOWN_GRACE=60s")...))
	poll.Until(t, 20*time.Second, "the child consuming", func() bool { return len(logLines(ch.asCourier(), "consuming")) > 0 })
	if err := ch.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ch.done:
		ch.once.Do(func() {}) // it has exited: nothing to kill
		if err != nil {
			t.Fatalf("courier exited with %v", err)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("courier still running 45s after SIGTERM: the publish API held it for the grace period (60s) with nothing to publish")
	}
	msgs := messages(ch.logs)
	if len(msgs) == 0 || msgs[len(msgs)-1] != "courier stopped" {
		t.Errorf("the last line is not \"courier stopped\": %q", msgs)
	}
	for _, want := range []string{"stop signal received: no more fetching", "publish API: no publish for a while", "publish API stopped"} {
		if len(logLines(ch.asCourier(), want)) == 0 {
			t.Errorf("no line %q: %q", want, msgs)
		}
	}
}

// "courier stopped" comes last whatever runs, and "stop signal received"
// is said only when a signal came.
func TestStoppedIsTheLastLine(t *testing.T) {
	for _, tc := range []struct {
		name   string
		extra  []string
		signal bool
		want   []string // lines there must be
	}{
		{"stopped by its caller", nil, false, []string{"stopping: no more fetching"}},
		{"SIGTERM", nil, true, []string{"stop signal received: no more fetching"}},
		{"reply only", []string{"COURIER_STREAM=", "COURIER_REPLY_SUBJECTS=quotes.get"}, true, []string{"serving requests only"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			a := newApp(t, nil)
			c := start(t, h.env(a.URL, tc.extra...))
			waitReady(t, c)
			if tc.signal {
				c.sigterm()
			}
			if err := c.stop(); err != nil {
				t.Fatal(err)
			}
			msgs := messages(c.logs)
			if len(msgs) == 0 || msgs[len(msgs)-1] != "courier stopped" {
				t.Errorf("the last line is not \"courier stopped\": %q", msgs)
			}
			for _, want := range tc.want {
				if len(logLines(c, want)) == 0 {
					t.Errorf("no line %q: %q", want, msgs)
				}
			}
			if said := len(logLines(c, "stop signal received")) > 0; said != tc.signal {
				t.Errorf("\"stop signal received\" said: %v, a signal came: %v", said, tc.signal)
			}
		})
	}
}
