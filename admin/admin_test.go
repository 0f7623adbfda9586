package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/internal/poll"
)

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "courier_test_total", Help: "x"})
	reg.MustRegister(c)
	c.Inc()
	var notReady atomic.Bool
	ready := func() error {
		if notReady.Load() {
			return errors.New("app unavailable: refused")
		}
		return nil
	}
	s, err := Listen("127.0.0.1:0", nil, ready, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + s.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tt := range []struct {
		path, want string
		code       int
	}{
		{"/healthz", "ok", 200},
		{"/readyz", "ok", 200},
		{"/metrics", "courier_test_total 1", 200},
		{"/nope", "", 404},
	} {
		code, body := get(tt.path)
		if code != tt.code || !strings.Contains(body, tt.want) {
			t.Errorf("GET %s = %d %q, want %d containing %q", tt.path, code, body, tt.code, tt.want)
		}
	}
	notReady.Store(true)
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "app unavailable") {
		t.Errorf("not ready: %d %q", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("liveness must not follow readiness: %d", code)
	}
}

// /v1/state answers Options.State as JSON, read anew at each request, and
// is not served without it.
func TestStateEndpoint(t *testing.T) {
	var n atomic.Int32
	state := func() any {
		return map[string]any{"subscriptions": []map[string]any{{"stream": "ORDERS", "held": n.Add(1)}}}
	}
	s, err := ListenWith("127.0.0.1:0", nil, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), Options{State: state})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	for want := int32(1); want <= 2; want++ {
		resp, err := http.Get("http://" + s.Addr() + StatePath)
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Subscriptions []struct {
				Stream string `json:"stream"`
				Held   int32  `json:"held"`
			} `json:"subscriptions"`
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("GET %s = %d %s: %v", StatePath, resp.StatusCode, resp.Header.Get("Content-Type"), err)
		}
		if len(got.Subscriptions) != 1 || got.Subscriptions[0].Stream != "ORDERS" || got.Subscriptions[0].Held != want {
			t.Errorf("GET %s = %+v, want ORDERS held %d", StatePath, got, want)
		}
	}
	if resp, err := http.Get("http://" + s.Addr() + "/"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), StatePath) {
			t.Errorf("GET / = %q, want it to name %s", b, StatePath)
		}
	}

	without, err := Listen("127.0.0.1:0", nil, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	without.Start()
	t.Cleanup(func() { _ = without.Shutdown(context.Background()) })
	resp, err := http.Get("http://" + without.Addr() + StatePath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET %s without a state = %d, want 404", StatePath, resp.StatusCode)
	}
}

func TestListenAddressInUse(t *testing.T) {
	s, err := Listen("127.0.0.1:0", nil, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	s.Start()
	_, err = Listen(s.Addr(), nil, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "COURIER_ADMIN_ADDR") {
		t.Fatalf("want an error naming COURIER_ADMIN_ADDR, got %v", err)
	}
}

// dialGet opens a connection to addr, sends GET path on it and reads the
// answer, leaving the connection open (keep-alive).
func dialGet(t *testing.T, addr, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: courier\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", path, resp.Status)
	}
	return c
}

// closedByServer waits (at most 10s) until the server closes c.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func listenTest(t *testing.T, o Options) *Server {
	t.Helper()
	s, err := ListenWith("127.0.0.1:0", nil, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), o)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// Keep-alive connections left idle, and connections that never send a
// whole request, are closed by the server after their time-outs: many of
// them cost courier nothing once those pass.
func TestIdleConnectionsClosed(t *testing.T) {
	s := listenTest(t, Options{MaxConns: 1000, IdleTimeout: 200 * time.Millisecond, ReadHeaderTimeout: 200 * time.Millisecond})
	var conns []net.Conn
	for range 100 {
		conns = append(conns, dialGet(t, s.Addr(), "/healthz"))
	}
	for range 100 {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\n"); err != nil { // and no more
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for i, c := range conns {
		if !closedByServer(c) {
			t.Fatalf("connection %d of %d still open 10s after its time-out", i+1, len(conns))
		}
	}
	poll.Until(t, 10*time.Second, "no connection held", func() bool { return s.Conns() == 0 })
}

// Past MaxConns, connections without a request in progress make room: a
// flood of idle and silent connections never holds more than the bound,
// and a probe is still answered.
func TestConnectionsBounded(t *testing.T) {
	s := listenTest(t, Options{MaxConns: 8, IdleTimeout: time.Hour, ReadHeaderTimeout: time.Hour})
	var conns []net.Conn // in the order the server accepts them
	for range 20 {
		conns = append(conns, dialGet(t, s.Addr(), "/metrics"))
	}
	for range 50 {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		conns = append(conns, c)
	}
	dialGet(t, s.Addr(), "/healthz")
	// The 7 newest and the probe's are held; every older one was closed.
	for i, c := range conns[:len(conns)-7] {
		if !closedByServer(c) {
			t.Fatalf("connection %d of %d still open past the bound of 8", i+1, len(conns)+1)
		}
	}
	if n := s.Conns(); n > 8 {
		t.Errorf("the server holds %d connections, want at most 8", n)
	}
}
