// Package admin serves courier's operator endpoints: /healthz (liveness,
// never dependent on NATS or the app), /readyz (readiness) and /metrics
// (docs/behaviour.md#liveness-is-not-readiness).
package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check reports nil when healthy, else why not. It must be fast and safe for
// concurrent use.
type Check func() error

// Server is the admin HTTP server. Create it with Listen; call Start once
// and Shutdown to stop it.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	done chan error
}

// Listen binds addr (":7415" form) and prepares the handlers. live decides
// /healthz, ready decides /readyz (either may be nil for "always ok"), and
// gatherer backs /metrics.
func Listen(addr string, live, ready Check, gatherer prometheus.Gatherer, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin server cannot listen on COURIER_ADMIN_ADDR %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", checkHandler(live))
	mux.Handle("GET /readyz", checkHandler(ready))
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "courier admin: /healthz /readyz /metrics")
	})
	return &Server{
		ln: ln,
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 5 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		},
		done: make(chan error, 1),
	}, nil
}

// Addr is the address actually bound (useful with port 0).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Start serves in a goroutine owned by the server; Shutdown stops and waits
// for it.
func (s *Server) Start() {
	go func() {
		err := s.srv.Serve(s.ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
}

// Shutdown stops the server, waiting up to ctx for open requests.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; err == nil {
		err = serr
	}
	return err
}

func checkHandler(c Check) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if c != nil {
			if err := c(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "not ok: %v\n", err)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
}
