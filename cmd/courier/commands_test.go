package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
)

// Every command of the table is in the help, and dispatched by its name.
func TestCommandTable(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"help"}, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, c := range commands() {
		if !strings.Contains(out.String(), strings.TrimSpace("courier "+c.name+" "+c.args)) || !strings.Contains(out.String(), c.summary) {
			t.Errorf("help lacks %q:\n%s", c.name, out.String())
		}
		if got, ok := lookup(c.name); !ok || got.name != c.name {
			t.Errorf("lookup(%q) = %q, %v", c.name, got.name, ok)
		}
		for _, a := range c.aliases {
			if got, _ := lookup(a); got.name != c.name {
				t.Errorf("alias %q finds %q, want %q", a, got.name, c.name)
			}
		}
	}
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"frobnicate"}, nil, io.Discard, &stderr)
	if code := exitCode(err, &stderr); code != 2 || !strings.Contains(stderr.String(), `unknown command "frobnicate"`) {
		t.Errorf("unknown command: exit %d\n%s", code, stderr.String())
	}
	err = run(context.Background(), []string{"version", "extra"}, nil, io.Discard, io.Discard)
	if code := exitCode(err, io.Discard); code != 2 {
		t.Errorf("version with an argument: exit %d, want 2", code)
	}
}

// A name no command has is refused (exit 2) with the closest command's,
// when one is close enough to be what was meant.
func TestUnknownCommandSuggests(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"statsu", `unknown command "statsu": did you mean "status"?`},
		{"Cleanup", `unknown command "Cleanup": did you mean "cleanup"?`},
		{"resum", `unknown command "resum": did you mean "resume"?`},
		{"frobnicate", `unknown command "frobnicate"`},
	} {
		err := unknownCommand(tc.name)
		if code := exitCode(err, io.Discard); code != 2 || err.Error() != tc.want {
			t.Errorf("courier %s: exit %d, %q; want exit 2, %q", tc.name, code, err, tc.want)
		}
	}
}

func TestVersionCommand(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--version"}, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if !strings.HasPrefix(got, "courier "+readBuild().version+" (") || !strings.Contains(got, runtime.Version()) || strings.Contains(got, "unknown") {
		t.Errorf("version = %q", got)
	}
}

// `courier config` (#16): an invalid value as given, unknown variables
// with the closest name, MAX_DELIVER=1 warned, exit 2 with every problem.
func TestConfigCommandShowsWhatWasGiven(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"config"}, []string{
		"COURIER_STREAM=ORDERS", "COURIER_APP_URL=http://127.0.0.1:8080/",
		"COURIER_ACK_WAIT=banana", "COURIER_MAX_INFLIGT=4", "COURIER_MAX_DELIVER=1",
	}, &stdout, &stderr)
	code := exitCode(err, &stderr)
	if code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	table := stdout.String()
	var ackWait string
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, "COURIER_ACK_WAIT ") {
			ackWait = line
		}
	}
	if !strings.Contains(ackWait, "banana (invalid)") {
		t.Errorf("COURIER_ACK_WAIT line %q, want the value as given", ackWait)
	}
	for _, want := range []string{
		"did you mean COURIER_MAX_INFLIGHT?",
		"COURIER_MAX_DELIVER=1 allows no retry",
		`COURIER_ACK_WAIT="banana": not a duration`,
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}

// An unencoded ',' in NATS_URL's password leaks no part of it (#17.10),
// neither in `courier config` nor in the sidecar's configuration error.
func TestCommaInNATSPasswordNotShown(t *testing.T) {
	const pass = "leftpart,rightpart"
	env := []string{"COURIER_STREAM=ORDERS", "COURIER_APP_URL=http://127.0.0.1:8080/", "NATS_URL=nats://u:" + pass + "@nats:4222"}
	for _, args := range [][]string{{"config"}, nil} {
		var stdout, stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := run(ctx, args, append(env, "COURIER_ADMIN_ADDR=127.0.0.1:0"), &stdout, &stderr)
		cancel()
		if code := exitCode(err, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
		out := stdout.String() + stderr.String()
		assertNoSecrets(t, out, []string{"leftpart", "rightpart"})
		if !strings.Contains(out, "%2C") {
			t.Errorf("%q: the problem is not named:\n%s", args, out)
		}
	}
}

// The stop signal is logged when it arrives, and the last line says how many
// messages were given back for redelivery (#16).
func TestStopSignalLogged(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		<-release
		w.WriteHeader(http.StatusOK)
	})
	t.Cleanup(func() { close(release) })
	for i := range 3 {
		h.publish("orders.created", fmt.Sprint(i), nil)
	}
	c := start(t, h.env(a.URL, "COURIER_MAX_INFLIGHT=1", "COURIER_SHUTDOWN_GRACE=100ms"))
	poll.Until(t, 10*time.Second, "a request in flight", func() bool { return a.count() == 1 })
	c.sigterm()
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	logs := c.logs.String()
	signal := strings.Index(logs, `"msg":"stop signal received`)
	grace := strings.Index(logs, "shutdown grace period over")
	if signal < 0 || grace < 0 || signal > grace {
		t.Errorf("the stop signal is not logged before the grace period ends:\n%s", logs)
	}
	if !strings.Contains(logs, `"msg":"courier stopped","released":3`) {
		t.Errorf("the last line does not count the 3 messages given back:\n%s", logs)
	}
}
