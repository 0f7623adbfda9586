// Package natstest starts an embedded JetStream-enabled nats-server, or a
// cluster of them, for courier's tests. Its helpers take a testing.TB and
// stop the servers when the test ends, so the bench (bench/broker.go) and
// the demo (demo/demo.go) start their own servers.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options adjusts the embedded server. The zero value is a loopback server on
// a random port with JetStream in dir.
type Options struct {
	// Port is the listen port; 0 picks a random one (server.RANDOM_PORT).
	Port int
	// StoreDir holds JetStream's files; empty uses a fresh t.TempDir().
	StoreDir string
	// Configure, when set, is called on the server options before start
	// (authentication, TLS).
	Configure func(*server.Options)
}

// NewServer starts an embedded server with JetStream enabled and returns it
// once it accepts connections. It never registers a cleanup: use Start for
// that, or call Shutdown yourself.
func NewServer(tb testing.TB, o Options) *server.Server {
	tb.Helper()
	port := o.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	dir := o.StoreDir
	if dir == "" {
		dir = tb.TempDir()
	}
	opts := &server.Options{
		Host:               "127.0.0.1",
		Port:               port,
		JetStream:          true,
		StoreDir:           dir,
		JetStreamMaxMemory: 256 << 20,
		JetStreamMaxStore:  1 << 30,
		NoLog:              true,
		NoSigs:             true,
	}
	if o.Configure != nil {
		o.Configure(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("natstest: new server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		tb.Fatalf("natstest: server not ready")
	}
	return s
}

// Start starts an embedded server and shuts it down when the test ends.
func Start(tb testing.TB, o Options) *server.Server {
	tb.Helper()
	s := NewServer(tb, o)
	tb.Cleanup(func() { Stop(s) })
	return s
}

// Stop shuts the server down and waits for it; it is safe to call twice.
func Stop(s *server.Server) {
	s.Shutdown()
	s.WaitForShutdown()
}

// Connect returns a connection and a JetStream handle to s, closed when the
// test ends.
func Connect(tb testing.TB, s *server.Server) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	return ConnectURL(tb, s.ClientURL())
}

// ConnectURL is Connect to url (a comma-separated list fails over, as with
// Cluster.URL), reconnecting without limit.
func ConnectURL(tb testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		tb.Fatalf("natstest: connect: %v", err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}
