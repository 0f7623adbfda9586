package admin

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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
