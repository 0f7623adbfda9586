package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
)

// An app that listens only on a Unix socket gets courier's messages, health
// checks and requests there, named by unix:// URLs in the environment.
func TestSidecarAppOnUnixSocket(t *testing.T) {
	h := newHarness(t)
	sock := filepath.Join(t.TempDir(), "app.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	a := &app{byKey: make(map[string]int)}
	health := make(chan struct{}, 1)
	a.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			select {
			case health <- struct{}{}:
			default:
			}
		case "/rpc":
			_, _ = w.Write([]byte("hello " + r.Host))
		case "/messages":
			a.serve(w, r)
		default:
			http.NotFound(w, r)
		}
	}))
	a.Listener = ln
	a.Start()
	t.Cleanup(a.Close)

	c := start(t, h.env("unix://"+sock+":/messages",
		"COURIER_APP_HEALTH_URL=unix://"+sock+":/healthz",
		"COURIER_REPLY_SUBJECTS=svc.hello",
		"COURIER_REPLY_URL=unix://"+sock+":/rpc"))
	for i := range 5 {
		h.publish("orders.created", "m"+string(rune('0'+i)), nil)
	}
	poll.Until(t, 10*time.Second, "5 messages delivered over the socket", func() bool {
		return a.count() == 5 && h.settled("courier")
	})
	select {
	case <-health:
	default:
		t.Error("the health URL on the socket was never asked")
	}
	resp, err := h.nc.Request("svc.hello", []byte("x"), 5*time.Second)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	if string(resp.Data) != "hello localhost" || resp.Header.Get("Courier-Status") != "200" {
		t.Errorf("reply %q (Courier-Status %q), want the socket app's answer", resp.Data, resp.Header.Get("Courier-Status"))
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
	if logs := c.logs.String(); !strings.Contains(logs, "unix://"+sock) {
		t.Errorf("the start-up line does not name the socket URL:\n%s", logs)
	}
}
