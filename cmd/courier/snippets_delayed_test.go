package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/schedule"
)

// The snippets of docs/delayed-delivery.md, run against a real courier
// whose stream holds schedules (TestSnippets).

// delayedSetup starts a courier with the publish API beside a stream that
// holds schedules, and returns the harness and the API's address.
func delayedSetup(t *testing.T) (*harness, string) {
	t.Helper()
	h := newHarness(t, withSchedules)
	app := newApp(t, nil)
	c := start(t, h.env(app.URL, "COURIER_PUBLISH_ADDR=127.0.0.1:0", "COURIER_PUBLISH_SUBJECTS=orders.>"))
	return h, publishAddr(t, c)
}

// waitingAbout checks that schedule id waits, due about d from now.
func waitingAbout(t *testing.T, h *harness, id string, d time.Duration) {
	t.Helper()
	sid, err := schedule.ParseID(id)
	if err != nil {
		t.Fatalf("schedule %q: %v", id, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := schedule.Lookup(ctx, h.js, schedule.DefaultPrefix, sid)
	if err != nil {
		t.Fatalf("schedule %s not waiting: %v", id, err)
	}
	if in := time.Until(info.DeliverAt); in < d-time.Minute || in > d {
		t.Errorf("schedule %s due in %s, want about %s", id, in, d)
	}
}

// runDelayedClient: the Python and Node delayed publishes are answered 202
// with the schedule and time the page shows (the time aside), and the
// schedule waits, due in fifteen minutes.
func runDelayedClient(t *testing.T, s, shown snippet) {
	bin, file := "python3", "publish.py"
	if s.lang != "python" {
		bin, file = "node", "publish.mjs"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		t.Skipf("%s is not installed: %s is not run", bin, s.where)
	}
	h, addr := delayedSetup(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strings.ReplaceAll(s.code, "127.0.0.1:7416", addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, file)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("%s: %v\n%s", s.where, err, ee.Stderr)
		}
		t.Fatalf("%s: %v", s.where, err)
	}
	got, want := shownLines(strings.Split(strings.TrimSpace(string(out)), "\n")), shownLines(strings.Split(strings.TrimSpace(shown.code), "\n"))
	if !slices.Equal(got, want) {
		t.Errorf("%s printed\n%s\n%s shows\n%s", s.where, out, shown.where, shown.code)
	}
	waitingAbout(t, h, strings.Fields(string(out))[1], 15*time.Minute)
}

// runDelayedCurl: the page's curl publish is answered as it shows (the
// sequence and time aside) and its schedule waits; its curl cancel is
// answered 204, and the schedule is gone.
func runDelayedCurl(t *testing.T, publish, cancelIt snippet) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("sh is not installed")
	}
	h, addr := delayedSetup(t)
	sendIt := func(s snippet) (out []byte, want string) {
		t.Helper()
		cmdText, want := splitAnswer(t, s)
		out, err := exec.Command(sh, "-c", strings.ReplaceAll(cmdText, "127.0.0.1:7416", addr)).Output()
		if err != nil {
			t.Fatalf("%s: %v", s.where, err)
		}
		return out, want
	}
	out, want := sendIt(publish)
	var got, exp map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%s answered %q: %v", publish.where, out, err)
	}
	if err := json.Unmarshal([]byte(want), &exp); err != nil {
		t.Fatalf("%s: the answer it shows, %q: %v", publish.where, want, err)
	}
	for _, varies := range []string{"seq", "deliver_at"} {
		delete(got, varies)
		delete(exp, varies)
	}
	if !reflect.DeepEqual(got, exp) {
		t.Errorf("%s answered\n%s\nthe page shows\n%s", publish.where, out, want)
	}
	id, _ := got["schedule"].(string)
	waitingAbout(t, h, id, 15*time.Minute)

	out, want = sendIt(cancelIt)
	if strings.TrimSpace(string(out)) != want {
		t.Errorf("%s answered %q, the page shows %q", cancelIt.where, out, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sid, _ := schedule.ParseID(id)
	if _, err := schedule.Lookup(ctx, h.js, schedule.DefaultPrefix, sid); !errors.Is(err, schedule.ErrNotFound) {
		t.Errorf("after the cancel the schedule is still there: %v", err)
	}
}
