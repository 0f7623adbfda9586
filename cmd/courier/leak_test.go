package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

// Nothing leaks: secrets stay out of `courier config`, the logs and the
// admin server; the dedup directory is the owner's alone.

const (
	leakURLPass  = "urlpw-Hq7Lx2Vn9Tb4"
	leakPassword = "natspw-Rk3Wd8Zs1Mf6"
	leakToken    = "natstok-Ye5Pc0Ju7Ga2"
	leakAppPass  = "apppw-Nb6Qt4Xo8Kc3"
)

func TestSecretsNotInConfigOutput(t *testing.T) {
	creds := writeFile(t, t.TempDir(), "user.creds", "not read by courier config")
	for _, tc := range []struct {
		name     string
		env      []string
		wantCode int
	}{
		{"UserPassword", []string{
			"NATS_URL=nats://orders:" + leakURLPass + "@nats-1:4222,nats://orders:" + leakURLPass + "@nats-2:4222",
			"NATS_USER=orders", "NATS_PASSWORD=" + leakPassword,
			"COURIER_APP_URL=http://app:" + leakAppPass + "@127.0.0.1:8080/orders",
			"COURIER_APP_HEALTH_URL=http://app:" + leakAppPass + "@127.0.0.1:8080/health",
		}, 0},
		{"Token", []string{
			"NATS_URL=tls://" + leakToken + "@nats:4222",
			"NATS_TOKEN=" + leakToken,
			"COURIER_APP_URL=http://127.0.0.1:8080/orders",
		}, 0},
		// Invalid: every problem is listed, and still no secret.
		{"InvalidEverythingSet", []string{
			"NATS_URL=nats://orders:" + leakURLPass + "@:4222",
			"NATS_USER=orders", "NATS_PASSWORD=" + leakPassword,
			"NATS_TOKEN=" + leakToken,
			"NATS_CREDS=" + creds,
			"COURIER_APP_URL=ftp://app:" + leakAppPass + "@127.0.0.1/orders",
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := append([]string{"COURIER_STREAM=ORDERS"}, tc.env...)
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), []string{"config"}, env, &stdout, &stderr)
			if code := exitCode(err, &stderr); code != tc.wantCode {
				t.Errorf("exit status %d, want %d\n%s%s", code, tc.wantCode, stdout.String(), stderr.String())
			}
			out := stdout.String() + stderr.String()
			if !strings.Contains(stdout.String(), "[redacted]") {
				t.Errorf("no [redacted] value in the table:\n%s", stdout.String())
			}
			assertNoSecrets(t, out, []string{leakURLPass, leakPassword, leakToken, leakAppPass})
		})
	}
}

func TestSecretsNotInSidecarLogs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		configure func(*server.Options)
		client    nats.Option
		url       func(hostport string) string
		env       []string
	}{
		{
			name:      "PasswordInURL",
			configure: func(o *server.Options) { o.Username, o.Password = "orders", leakURLPass },
			client:    nats.UserInfo("orders", leakURLPass),
			url:       func(hp string) string { return "nats://orders:" + leakURLPass + "@" + hp },
		},
		{
			name:      "UserPassword",
			configure: func(o *server.Options) { o.Username, o.Password = "orders", leakPassword },
			client:    nats.UserInfo("orders", leakPassword),
			url:       func(hp string) string { return "nats://" + hp },
			env:       []string{"NATS_USER=orders", "NATS_PASSWORD=" + leakPassword},
		},
		{
			name:      "Token",
			configure: func(o *server.Options) { o.Authorization = leakToken },
			client:    nats.Token(leakToken),
			url:       func(hp string) string { return "nats://" + hp },
			env:       []string{"NATS_TOKEN=" + leakToken},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// courier starts first, so the "unreachable" lines, which
			// name the URL, are logged too.
			host, port := freePort(t)
			hostport := net.JoinHostPort(host, strconv.Itoa(port))
			a := newApp(t, func(w http.ResponseWriter, _ *http.Request, n int) {
				if n == 1 {
					w.WriteHeader(http.StatusServiceUnavailable) // a retry, logged with the URL's error
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			appURL := strings.Replace(a.URL, "http://", "http://app:"+leakAppPass+"@", 1) + "/orders"
			dedupDir := filepath.Join(t.TempDir(), "state", "dedup")
			h := &harness{t: t, stream: "ORDERS", dir: dedupDir}
			env := append([]string{
				"NATS_URL=" + tc.url(hostport),
				"COURIER_STREAM=ORDERS",
				"COURIER_APP_URL=" + appURL,
				"COURIER_APP_HEALTH_URL=" + appURL,
				"COURIER_ADMIN_ADDR=127.0.0.1:0",
				"COURIER_DEDUP_DIR=" + dedupDir,
				"COURIER_BACKOFF_INITIAL=50ms",
				"COURIER_BACKOFF_MAX=100ms",
				"COURIER_SHUTDOWN_GRACE=2s",
				"COURIER_LOG_LEVEL=debug",
				"COURIER_LOG_FORMAT=json",
			}, tc.env...)
			c := start(t, env)
			poll.Until(t, 10*time.Second, "an unreachable-server log line", func() bool {
				return len(logLines(c, "NATS unreachable")) > 0
			})

			h.srv = natstest.Start(t, natstest.Options{Port: port, Configure: func(o *server.Options) {
				o.Host = host
				if tc.configure != nil {
					tc.configure(o)
				}
			}})
			h.nc, h.js = connectWith(t, h.srv, tc.client)
			createStream(t, h)
			h.publish("orders.leak", "hello", nil)
			poll.Until(t, 15*time.Second, "the message delivered after a retry", func() bool { return a.count() >= 2 })
			poll.Until(t, 15*time.Second, "the message acked", func() bool { return h.settled("courier") })

			admin := adminAddr(t, c)
			var served strings.Builder
			for _, path := range []string{"/", "/healthz", "/readyz", "/metrics"} {
				code, body := get(t, "http://"+admin+path)
				if code != http.StatusOK {
					t.Errorf("GET %s: %d", path, code)
				}
				served.WriteString(body)
			}
			// The index names the endpoints and nothing of the
			// configuration.
			_, index := get(t, "http://"+admin+"/")
			for _, v := range []string{hostport, a.URL, "ORDERS", dedupDir, "NATS_", "COURIER_"} {
				if strings.Contains(index, v) {
					t.Errorf("GET / shows %q:\n%s", v, index)
				}
			}
			for _, path := range []string{"/config", "/env", "/vars", "/debug/vars", "/debug/pprof/", "/debug/pprof/cmdline", "/configz", "/healthz/../config"} {
				if code, body := get(t, "http://"+admin+path); code != http.StatusNotFound {
					t.Errorf("GET %s: %d, want 404:\n%s", path, code, body)
				}
			}

			// Owner-only, as dedup.Open creates it.
			fi, err := os.Stat(dedupDir)
			if err != nil {
				t.Fatal(err)
			}
			if perm := fi.Mode().Perm(); perm != 0o700 {
				t.Errorf("dedup directory mode %v, want 0700", perm)
			}

			if err := c.stop(); err != nil {
				t.Fatalf("courier stopped with %v", err)
			}
			if !strings.Contains(c.logs.String(), "[redacted]") && strings.Contains(tc.url(""), "@") {
				t.Errorf("no redacted URL in the logs:\n%s", c.logs.String())
			}
			assertNoSecrets(t, c.logs.String()+served.String(), []string{leakURLPass, leakPassword, leakToken, leakAppPass})
		})
	}
}

// freePort returns a loopback address and port nothing listens on (for a
// moment).
func freePort(t *testing.T) (host string, port int) {
	t.Helper()
	// On 127.0.0.2 where the system has it (Linux routes all of 127/8 to
	// loopback): everything else the tests start listens on 127.0.0.1:0,
	// which could take the port just released before the server does.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a := ln.Addr().(*net.TCPAddr)
	return a.IP.String(), a.Port
}

// TestSecretsNotInReplyLogs: a password in COURIER_REPLY_URL (or the
// COURIER_APP_URL it defaults to) stays out of the logs of a courier that
// answers requests, beside a stream or alone; it says once where it sends
// them.
func TestSecretsNotInReplyLogs(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  func(url string) []string
	}{
		{"WithStream", func(url string) []string { return []string{"COURIER_APP_URL=" + url} }},
		{"RequestsOnly", func(url string) []string {
			return []string{"COURIER_STREAM=", "COURIER_APP_URL=", "COURIER_REPLY_URL=" + url}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			a := newApp(t, nil)
			url := strings.Replace(a.URL, "http://", "http://app:"+leakAppPass+"@", 1) + "/quote"
			c := start(t, h.env(a.URL, append(tc.env(url), "COURIER_REPLY_SUBJECTS=quote.get")...))
			poll.Until(t, 10*time.Second, "the reply service started", func() bool {
				return len(logLines(c, "answering requests")) > 0
			})
			if err := c.stop(); err != nil {
				t.Fatalf("courier stopped with %v", err)
			}
			if n := len(logLines(c, "answering requests")); n != 1 {
				t.Errorf("%d \"answering requests\" lines, want 1:\n%s", n, c.logs.String())
			}
			assertNoSecrets(t, c.logs.String(), []string{leakAppPass})
		})
	}
}
