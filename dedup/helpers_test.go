package dedup

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/testlog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// stallProxy is a TCP proxy between NATS clients and one server that can
// hold back the bytes of either direction for a while: they are delivered
// afterwards, late and in order, as a stalled network (a leader election,
// a pause of the server) delivers them. Holding both directions cuts a
// client off without its connection dropping.
type stallProxy struct {
	t        *testing.T
	l        net.Listener
	target   string
	toClient gate // server → client bytes
	toServer gate // client → server bytes

	mu    sync.Mutex
	conns []net.Conn
	// armed, when set, is a pattern the client is about to send: the
	// chunk holding it is forwarded, then server → client bytes are held
	// for armedFor, and triggered is closed.
	armed     []byte
	armedFor  time.Duration
	triggered chan struct{}

	done chan struct{}
	wg   sync.WaitGroup
}

// startStallProxy listens on loopback and forwards every connection to
// target (host:port), until the test ends.
func startStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{t: t, l: l, target: target, done: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// URL is the proxy's NATS URL.
func (p *stallProxy) URL() string { return "nats://" + p.l.Addr().String() }

// connect opens a NATS connection through the proxy, closed when the test
// ends. It stays on the proxy: servers a cluster advertises are ignored.
func (p *stallProxy) connect() jetstream.JetStream {
	p.t.Helper()
	nc, err := nats.Connect(p.URL(), nats.IgnoreDiscoveredServers(),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		p.t.Fatal(err)
	}
	return js
}

// cutOff holds both directions for d from now.
func (p *stallProxy) cutOff(d time.Duration) {
	p.toClient.hold(d)
	p.toServer.hold(d)
}

// holding reports whether either direction is still held.
func (p *stallProxy) holding() bool { return p.toClient.holding() || p.toServer.holding() }

// holdAnswersAfter arms the proxy: once the client sends pattern, server →
// client bytes are held for d, so that the answer to what the client just
// sent comes d late. The returned channel is closed then.
func (p *stallProxy) holdAnswersAfter(pattern string, d time.Duration) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.armedFor, p.triggered = []byte(pattern), d, make(chan struct{})
	return p.triggered
}

// sent is called with what a client sent before it is forwarded: the end
// of its previous chunk and the new one, so that a pattern split across
// reads is seen. Only a match that ends in the new chunk counts: one wholly
// in the previous chunk was sent before (it may have been sent before the
// proxy was armed).
func (p *stallProxy) sent(prev, chunk []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed == nil {
		return
	}
	prev = prev[max(0, len(prev)-(len(p.armed)-1)):]
	if bytes.Contains(append(append([]byte(nil), prev...), chunk...), p.armed) {
		p.toClient.hold(p.armedFor)
		close(p.triggered)
		p.armed = nil
	}
}

func (p *stallProxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		select {
		case <-p.done: // closed meanwhile: close has closed the others
			_, _ = c.Close(), s.Close()
			return
		default:
		}
		p.pipe(c, s, &p.toServer, p.sent)
		p.pipe(s, c, &p.toClient, nil)
	}
}

// pipe copies from src to dst through g: a reader that never stops reading
// (so the sender is never blocked: the bytes wait here) and a writer that
// waits while g holds.
func (p *stallProxy) pipe(src, dst net.Conn, g *gate, seen func(prev, chunk []byte)) {
	chunks := make(chan []byte, 1<<14)
	p.wg.Go(func() {
		defer close(chunks)
		var tail []byte
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				if seen != nil {
					seen(tail, buf[:n])
					tail = append([]byte(nil), buf[max(0, n-256):n]...)
				}
				select {
				case chunks <- buf[:n]:
				case <-p.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	p.wg.Go(func() {
		defer func() { _ = dst.Close() }()
		for b := range chunks {
			if !g.wait(p.done) {
				return
			}
			if _, err := dst.Write(b); err != nil {
				return
			}
		}
	})
}

func (p *stallProxy) close() {
	close(p.done)
	_ = p.l.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// gate holds bytes until a time.
type gate struct{ until atomic.Int64 } // unix nanoseconds

func (g *gate) hold(d time.Duration) { g.until.Store(time.Now().Add(d).UnixNano()) }

func (g *gate) holding() bool { return time.Now().UnixNano() < g.until.Load() }

// wait returns true once g no longer holds, false if done is closed first.
func (g *gate) wait(done <-chan struct{}) bool {
	for {
		d := time.Until(time.Unix(0, g.until.Load()))
		if d <= 0 {
			return true
		}
		select {
		case <-time.After(d):
		case <-done:
			return false
		}
	}
}

// logBuffer is a slog handler's output, safe for concurrent use.
type logBuffer struct{ testlog.Buffer }

// logger logs to b, in text, from level debug up.
func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// count is the number of lines holding every one of parts.
func (b *logBuffer) count(parts ...string) int {
	n := 0
	for line := range strings.Lines(b.String()) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// checkFor asks s about key every 100ms for d, failing the test on the
// first answer that is not want.
func checkFor(t *testing.T, s interface {
	Check(context.Context, string) (Verdict, error)
}, key string, want Verdict, d time.Duration, why string) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		v, err := s.Check(ctx, key)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Check(%q): %v", key, err)
		}
		if err == nil && v != want {
			t.Fatalf("Check(%q) = %v, want %v: %s", key, v, want, why)
		}
	}
}
