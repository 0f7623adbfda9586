package main

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/courierhq/courier/config"
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

// `courier config` fits 100 columns: the meaning and default wrap below
// the variable and its value; a value is never cut.
func TestConfigFitsWidth(t *testing.T) {
	env := []string{"COURIER_STREAM=ORDERS", "COURIER_APP_URL=http://127.0.0.1:8080/messages", "COURIER_MAX_INFLIGHT=auto:16", "COURIER_ACK_WAIT=banana"}
	var stdout, stderr bytes.Buffer
	err := runConfigArgs(nil, env, &stdout, &stderr)
	if code := exitCode(err, &stderr); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	for _, l := range lines {
		if n := utf8.RuneCountInString(l); n > configWidth {
			t.Errorf("a line of %d columns: %q", n, l)
		}
	}
	vars := config.Variables()
	starts := map[string]string{}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 1 && !strings.HasPrefix(l, " ") {
			starts[f[0]] = strings.Join(f[1:], " ")
		}
	}
	for _, v := range vars {
		if _, ok := starts[v.Name]; !ok {
			t.Errorf("no line starts with %s", v.Name)
		}
	}
	for name, want := range map[string]string{"COURIER_MAX_INFLIGHT": "auto:16", "COURIER_ACK_WAIT": "banana (invalid)", "COURIER_STREAM": "ORDERS", "COURIER_BATCH_MAX": "1"} {
		if starts[name] != want {
			t.Errorf("%s shown as %q, want %q", name, starts[name], want)
		}
	}
	// Every word of a meaning is there, wrapped.
	text := strings.Join(strings.Fields(stdout.String()), " ")
	for _, v := range vars {
		if want := strings.Join(strings.Fields(v.Meaning), " ") + ". Default: " + v.Default; !strings.Contains(text, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
}

// `courier config --wide`: one line a variable, the meaning last.
func TestConfigWide(t *testing.T) {
	env := []string{"COURIER_STREAM=ORDERS", "COURIER_APP_URL=http://127.0.0.1:8080/messages"}
	var stdout, stderr bytes.Buffer
	if err := runConfigArgs([]string{"--wide"}, env, &stdout, &stderr); err != nil {
		t.Fatalf("courier config --wide: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	vars := config.Variables()
	if len(lines) != len(vars)+1 || !strings.HasPrefix(lines[0], "VARIABLE") {
		t.Fatalf("%d lines for %d variables:\n%s", len(lines), len(vars), stdout.String())
	}
	for i, v := range vars {
		if l := lines[i+1]; !strings.HasPrefix(l, v.Name+" ") || !strings.HasSuffix(l, v.Meaning) {
			t.Errorf("line %q, want %s ... %s", l, v.Name, v.Meaning)
		}
	}

	for _, args := range [][]string{{"--narrow"}, {"extra"}} {
		err := runConfigArgs(args, env, io.Discard, io.Discard)
		if code := exitCode(err, io.Discard); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	stdout.Reset()
	if err := runConfigArgs([]string{"--help"}, env, &stdout, io.Discard); err != nil || !strings.Contains(stdout.String(), "--wide") {
		t.Errorf("--help: %v\n%s", err, stdout.String())
	}
}

// With COURIER_SUBSCRIPTIONS, `courier config` shows each subscription's
// values and where each came from: its own variable, the plain one or the
// default; a wrong one as given, with the problem on stderr.
func TestConfigSubscriptions(t *testing.T) {
	env := []string{
		"COURIER_SUBSCRIPTIONS=orders,payments", "COURIER_APP_URL=http://127.0.0.1:8080/messages",
		"COURIER_SUB_ORDERS_STREAM=ORDERS", "COURIER_SUB_PAYMENTS_STREAM=PAYMENTS",
		"COURIER_BATCH_MAX=10", "COURIER_SUB_PAYMENTS_BATCH_MAX=1", "COURIER_SUB_ORDERS_MAX_INFLIGHT=auto",
		"COURIER_SUB_PAYMENTS_APP_URL=http://u:hunter2@127.0.0.1:9090/p",
	}
	rows := func(out string) map[string][]string {
		m := map[string][]string{} // "sub VARIABLE" → from, value
		sub := ""
		for l := range strings.Lines(out) {
			f := strings.Fields(l)
			switch {
			case len(f) == 2 && f[0] == "subscription":
				sub = f[1]
			case sub != "" && len(f) >= 3:
				m[sub+" "+f[0]] = []string{f[1], strings.Join(f[2:], " ")}
			}
		}
		return m
	}
	var stdout, stderr bytes.Buffer
	if err := runConfigArgs(nil, env, &stdout, &stderr); err != nil {
		t.Fatalf("courier config: %v\n%s", err, stderr.String())
	}
	got := rows(stdout.String())
	for key, want := range map[string][]string{
		"orders COURIER_STREAM":         {"COURIER_SUB_ORDERS_STREAM", "ORDERS"},
		"orders COURIER_BATCH_MAX":      {"COURIER_BATCH_MAX", "10"},
		"orders COURIER_MAX_INFLIGHT":   {"COURIER_SUB_ORDERS_MAX_INFLIGHT", "auto"},
		"orders COURIER_DLQ_SUBJECT":    {"default", "dlq.ORDERS.courier"},
		"orders COURIER_APP_URL":        {"COURIER_APP_URL", "http://127.0.0.1:8080/messages"},
		"payments COURIER_BATCH_MAX":    {"COURIER_SUB_PAYMENTS_BATCH_MAX", "1"},
		"payments COURIER_MAX_INFLIGHT": {"default", "8"},
		"payments COURIER_APP_URL":      {"COURIER_SUB_PAYMENTS_APP_URL", "http://u:[redacted]@127.0.0.1:9090/p"},
	} {
		if g := got[key]; len(g) != 2 || g[0] != want[0] || g[1] != want[1] {
			t.Errorf("%s: %q, want %q", key, g, want)
		}
	}
	if _, ok := got["orders COURIER_ADMIN_ADDR"]; ok {
		t.Error("a per-process variable in a subscription's table")
	}
	if strings.Contains(stdout.String()+stderr.String(), "hunter2") {
		t.Error("a password is shown")
	}
	for l := range strings.Lines(stdout.String()) {
		if n := utf8.RuneCountInString(strings.TrimSuffix(l, "\n")); n > configWidth && !strings.Contains(l, "http") {
			t.Errorf("a line of %d columns: %q", n, l)
		}
	}

	// Invalid: shown as given, every problem named, exit 2.
	stdout.Reset()
	stderr.Reset()
	err := runConfigArgs(nil, append(env, "COURIER_SUB_PAYMENTS_ACK_WAIT=banana", "COURIER_SUB_ORDRES_STREAM=X"), &stdout, &stderr)
	if code := exitCode(err, &stderr); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	if g := rows(stdout.String())["payments COURIER_ACK_WAIT"]; len(g) != 2 || g[1] != "banana (invalid)" {
		t.Errorf("payments' COURIER_ACK_WAIT shown as %q", g)
	}
	for _, want := range []string{
		`COURIER_SUB_PAYMENTS_ACK_WAIT="banana": not a duration`,
		"COURIER_SUB_ORDRES_STREAM: ORDRES is not a subscription in COURIER_SUBSCRIPTIONS (orders,payments): did you mean COURIER_SUB_ORDERS_STREAM?",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}

// The commands that talk to the server only need no app URL, with
// subscriptions too.
func TestConfigWithoutAppSubscriptions(t *testing.T) {
	cfg, err := loadConfigWithoutApp([]string{"COURIER_SUBSCRIPTIONS=orders", "COURIER_SUB_ORDERS_STREAM=ORDERS"})
	if err != nil {
		t.Fatal(err)
	}
	if subs := cfg.Subscriptions(); len(subs) != 1 || subs[0].Config.Stream != "ORDERS" {
		t.Errorf("subscriptions %+v", subs)
	}
}

func TestConfigWrap(t *testing.T) {
	for _, tt := range []struct {
		text  string
		width int
		want  []string
	}{
		{"a bb ccc dddd", 6, []string{"a bb", "ccc", "dddd"}},
		{"a bb ccc", 8, []string{"a bb ccc"}},
		{"averyveryverylongword b", 5, []string{"averyveryverylongword", "b"}},
		{"", 5, nil},
	} {
		if got := wrap(tt.text, tt.width); !slices.Equal(got, tt.want) {
			t.Errorf("wrap(%q, %d) = %q, want %q", tt.text, tt.width, got, tt.want)
		}
	}
}
