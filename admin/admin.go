// Package admin serves courier's operator endpoints: /healthz (liveness,
// never dependent on NATS or the app), /readyz (readiness), /metrics
// (docs/behaviour.md#liveness-is-not-readiness) and /v1/state, the
// courier's own view of what it is doing, as JSON (`courier status` reads
// it).
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/courierhq/courier/internal/connlimit"
)

// Check reports nil when healthy, else why not. It must be fast and safe for
// concurrent use.
type Check func() error

// Server is the admin HTTP server. Create it with Listen; call Start once
// and Shutdown to stop it.
type Server struct {
	ln    net.Listener
	srv   *http.Server
	conns *connlimit.Limiter
	done  chan error
}

// Options bound what a client of the admin port may hold: any peer that
// reaches the port may connect (it listens on every interface by
// default), and its clients, the kubelet's probes and Prometheus, send a
// small request at once. State adds /v1/state. Zero values take the
// defaults stated.
type Options struct {
	// MaxConns bounds the connections held at once; past it the one
	// longest without a request in progress is closed to make room
	// (internal/connlimit). Default 64.
	MaxConns int
	// IdleTimeout closes a keep-alive connection after this long without
	// a request. Default 30s.
	IdleTimeout time.Duration
	// ReadHeaderTimeout bounds the reading of a request's headers, and
	// ReadTimeout of the whole request. Defaults 5s and 10s.
	ReadHeaderTimeout, ReadTimeout time.Duration
	// WriteTimeout bounds the writing of an answer (a large /metrics to a
	// client that does not read). Default 30s.
	WriteTimeout time.Duration
	// State, when set, answers /v1/state: its value as JSON. It must be
	// fast and safe for concurrent use. Nil: /v1/state is not served.
	State func() any
}

// maxHeaderBytes bounds a request's headers: a probe's or a scrape's are
// a few hundred bytes, and net/http's default would let each connection
// hold a megabyte.
const maxHeaderBytes = 16 << 10

func (o *Options) defaults() {
	if o.MaxConns <= 0 {
		o.MaxConns = 64
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 30 * time.Second
	}
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = 5 * time.Second
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = 10 * time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 30 * time.Second
	}
}

// Listen binds addr (":7415" form) and prepares the handlers with the
// default Options. live decides /healthz, ready decides /readyz (either
// may be nil for "always ok"), and gatherer backs /metrics.
func Listen(addr string, live, ready Check, gatherer prometheus.Gatherer, log *slog.Logger) (*Server, error) {
	return ListenWith(addr, live, ready, gatherer, log, Options{})
}

// ListenWith is Listen with Options.
func ListenWith(addr string, live, ready Check, gatherer prometheus.Gatherer, log *slog.Logger, o Options) (*Server, error) {
	o.defaults()
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
	index := "courier admin: /healthz /readyz /metrics"
	if o.State != nil {
		mux.Handle("GET "+StatePath, stateHandler(o.State, log))
		index += " " + StatePath
	}
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, index)
	})
	conns := connlimit.New(o.MaxConns)
	return &Server{
		ln: ln,
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: o.ReadHeaderTimeout,
			ReadTimeout:       o.ReadTimeout,
			WriteTimeout:      o.WriteTimeout,
			IdleTimeout:       o.IdleTimeout,
			MaxHeaderBytes:    maxHeaderBytes,
			ConnState:         conns.ConnState,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		},
		conns: conns,
		done:  make(chan error, 1),
	}, nil
}

// Conns returns the number of connections the server holds.
func (s *Server) Conns() int { return s.conns.Open() }

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

// StatePath is where the courier's own state is served (Options.State).
const StatePath = "/v1/state"

func stateHandler(state func() any, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		b, err := json.MarshalIndent(state(), "", "  ")
		if err != nil {
			log.Warn("cannot encode the state for "+StatePath, "error", err)
			http.Error(w, "cannot encode the state", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(append(b, '\n'))
	})
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
