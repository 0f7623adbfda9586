package main

// `courier status` shows the running courier's own state, from its admin
// port, beside the server's view: what is happening and when it changes.

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
)

// status runs `courier status` with environ and args, and returns what it
// printed; it fails the test if the command fails.
func status(t *testing.T, environ []string, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := run(context.Background(), append([]string{"status"}, args...), environ, &out, &errOut); err != nil {
		t.Fatalf("courier status %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String()
}

// line returns the line of out that starts (after spaces) with key.
func line(out, key string) string {
	for l := range strings.Lines(out) {
		if strings.HasPrefix(strings.TrimSpace(l), key+" ") {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// During an app outage: the app unavailable since when and why, the
// messages held, and that courier sends again as soon as it answers; the
// server's view beside it. Once the app is back, it says so.
func TestStatusDuringAppOutage(t *testing.T) {
	h := newHarness(t)
	l := newLateApp(t, nil)
	env := h.env(l.url())
	bodies := publishN(h, "held", 5)
	c := start(t, env)
	admin := adminAddr(t, c)
	poll.Until(t, 10*time.Second, "courier to find the app missing", func() bool { return len(logLines(c, logAppGone)) > 0 })

	var out string
	poll.Until(t, 10*time.Second, "status to show the 5 messages held", func() bool {
		out = status(t, env, "--admin", admin)
		return strings.Contains(line(out, "held"), "5 messages")
	})
	app := line(out, "app")
	if !strings.Contains(app, "unavailable for") || !strings.Contains(app, "since ") ||
		!strings.Contains(app, "connection refused") || !strings.Contains(app, "as soon as it answers") {
		t.Errorf("app line %q, want unavailable, since when, why, and when it changes\n%s", app, out)
	}
	if !strings.Contains(line(out, "ready"), "no: app unavailable") {
		t.Errorf("ready line %q\n%s", line(out, "ready"), out)
	}
	if !strings.Contains(out, "at "+admin) {
		t.Errorf("status does not name the courier it asked (%s)\n%s", admin, out)
	}
	if line(out, "pending") == "" || line(out, "ack pending") == "" {
		t.Errorf("status lost the server's view\n%s", out)
	}

	l.up()
	poll.Until(t, 15*time.Second, "every message delivered", func() bool { return l.count() == len(bodies) && h.settled("courier") })
	out = status(t, env, "--admin", admin)
	if app := line(out, "app"); app != "app  available" && !strings.HasSuffix(app, " available") {
		t.Errorf("after the outage, app line %q\n%s", app, out)
	}
	if got := line(out, "held"); !strings.Contains(got, " 0 messages") {
		t.Errorf("after the outage, held line %q\n%s", got, out)
	}
}

// During a 503 storm: the breaker open since when, when the next probe
// goes and how often probes go after it; ready says the same.
func TestStatusDuringStorm(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusServiceUnavailable) })
	env := h.env(a.URL, "COURIER_BREAKER_FAILURES=2", "COURIER_BREAKER_PROBE=3s", "COURIER_BREAKER_PROBE_MAX=6s",
		"COURIER_MAX_DELIVER=20")
	publishN(h, "storm", 6)
	c := start(t, env)
	admin := adminAddr(t, c)
	poll.Until(t, 10*time.Second, "the breaker to open", func() bool {
		_, body := get(t, "http://"+admin+"/readyz")
		return strings.Contains(body, "breaker open")
	})
	var out string
	nextProbe := regexp.MustCompile(`open for \d+s \(since \S+\): next probe at \S+ \(in [0-9.]+m?s\), then every 3s, doubling up to 6s, while probes fail; sending resumes when one succeeds`)
	// The messages NAK'd when the breaker opened come back within
	// COURIER_BACKOFF_MAX and are held.
	poll.Until(t, 10*time.Second, "status to say when the next probe goes, with messages held", func() bool {
		out = status(t, env, "--admin", admin)
		return nextProbe.MatchString(line(out, "breaker")) && !strings.Contains(line(out, "held"), " 0 messages")
	})
	t.Logf("status during the storm:\n%s", out)
	if r := line(out, "ready"); !strings.Contains(r, "no: breaker open") || !strings.Contains(r, "next probe in") {
		t.Errorf("ready line %q\n%s", r, out)
	}
	if app := line(out, "app"); !strings.HasSuffix(app, " available") {
		t.Errorf("app line %q: the app answers, it is not unavailable\n%s", app, out)
	}
	if got := line(out, "in flight"); !strings.Contains(got, "of 8 requests at the app; limit fixed (COURIER_MAX_INFLIGHT=8)") {
		t.Errorf("in flight line %q\n%s", got, out)
	}
}

// During a pause, found by COURIER_ADMIN_ADDR as the courier has it (no
// --admin): paused until when, as the courier sees it, beside the server's
// view.
func TestStatusDuringPause(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	env := h.env(a.URL, "COURIER_ADMIN_ADDR="+freeAddr(t))
	c := start(t, env)
	admin := adminAddr(t, c)
	poll.Until(t, 10*time.Second, "ready", func() bool { code, _ := get(t, "http://"+admin+"/readyz"); return code == 200 })
	if err := run(context.Background(), []string{"pause", "--until", "2099-01-01T00:00:00Z"}, env, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 15*time.Second, "the courier to see the pause", func() bool {
		_, body := get(t, "http://"+admin+"/readyz")
		return strings.Contains(body, "consumer paused")
	})
	out := status(t, env)
	t.Logf("status during the pause:\n%s", out)
	var paused []string
	for l := range strings.Lines(out) {
		if strings.HasPrefix(strings.TrimSpace(l), "paused ") {
			paused = append(paused, strings.TrimSpace(l))
		}
	}
	// The server's line, then the courier's.
	if len(paused) != 2 || !strings.Contains(paused[0], "until 2099-01-01T00:00:00Z") ||
		!strings.Contains(paused[1], "until 2099-01-01T00:00:00Z (in ") {
		t.Errorf("paused lines %q, want the server's and the courier's, each until the pause's end\n%s", paused, out)
	}
	if r := line(out, "ready"); !strings.Contains(r, "no: consumer paused") {
		t.Errorf("ready line %q\n%s", r, out)
	}
}

// A courier that cannot be reached is said to be so plainly, and the
// server's view is printed all the same; so is an admin address without a
// fixed port.
func TestStatusWithoutCourier(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	env := h.env(a.URL)
	c := start(t, env)
	admin := adminAddr(t, c)
	poll.Until(t, 10*time.Second, "ready", func() bool { code, _ := get(t, "http://"+admin+"/readyz"); return code == 200 })

	gone := freeAddr(t)
	out := status(t, env, "--admin", gone)
	if got := line(out, "courier"); !strings.Contains(got, "not reachable at "+gone) || !strings.Contains(got, "the server's view only") {
		t.Errorf("courier line %q\n%s", got, out)
	}
	if line(out, "pending") == "" {
		t.Errorf("no server's view\n%s", out)
	}
	// The harness's COURIER_ADMIN_ADDR is 127.0.0.1:0.
	if got := line(status(t, env), "courier"); !strings.Contains(got, "no fixed port") || !strings.Contains(got, "--admin") {
		t.Errorf("courier line %q, want it to ask for --admin", got)
	}
	// And the courier that runs, to compare.
	if got := line(status(t, env, "--admin", admin), "ready"); got != "ready  yes" && !strings.HasSuffix(got, " yes") {
		t.Errorf("ready line %q", got)
	}
}

// With several subscriptions, status --subscription shows that
// subscription's delivery path: its app down, while the other's is up.
func TestStatusOfOneSubscription(t *testing.T) {
	h := newHarness(t)
	paymentsStream(t, h)
	orders := newApp(t, nil)
	env := subsEnv(h, orders.URL+"/orders", "http://"+freeAddr(t)+"/payments")
	c := start(t, env)
	admin := adminAddr(t, c)
	h.publish("payments.1", "{}", nil)
	poll.Until(t, 10*time.Second, "/readyz naming payments", func() bool {
		_, body := get(t, "http://"+admin+"/readyz")
		return strings.Contains(body, "subscription payments: app unavailable")
	})
	out := status(t, env, "--subscription", "payments", "--admin", admin)
	if got := line(out, "consumer"); !strings.Contains(got, "PAYMENTS/courier") {
		t.Errorf("consumer line %q\n%s", got, out)
	}
	if got := line(out, "app"); !strings.Contains(got, "unavailable for") {
		t.Errorf("payments' app line %q\n%s", got, out)
	}
	out = status(t, env, "--subscription", "orders", "--admin", admin)
	if got := line(out, "app"); !strings.HasSuffix(got, " available") {
		t.Errorf("orders' app line %q\n%s", got, out)
	}
}

// freeAddr is a loopback address no one listens on (now).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
