package connlimit_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/connlimit"
	"github.com/courierhq/courier/internal/poll"
)

// serve starts an HTTP server on a loopback port with l as its ConnState
// hook and h as its handler; it is closed when the test ends. Each time a
// connection turns idle after l has seen it do so, idle (when not nil)
// receives a value.
func serve(t *testing.T, l *connlimit.Limiter, h http.Handler, idle chan<- struct{}) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hook := func(c net.Conn, s http.ConnState) {
		l.ConnState(c, s)
		if s == http.StateIdle && idle != nil {
			idle <- struct{}{}
		}
	}
	srv := &http.Server{Handler: h, ConnState: hook, ReadHeaderTimeout: time.Minute}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// get sends a GET on c and reads the answer's status line; c stays open
// (keep-alive).
func get(c net.Conn, r *bufio.Reader) (string, error) {
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Status, nil
}

// closed waits until the server closes c (a read ends with EOF or a
// reset, not a time-out).
func closed(t *testing.T, c net.Conn) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })

// Connections that send nothing, and idle keep-alive ones, make room for a
// new one, the longest waiting first; the count never passes the bound,
// and a client that sends its request is served.
func TestLimiterClosesLongestWaiting(t *testing.T) {
	l := connlimit.New(4)
	// The server marks a connection idle after it has written the answer,
	// so a client can read it and dial again first: the test waits for
	// the mark, for "idle longest" to mean the first one answered.
	turnedIdle := make(chan struct{}, 8)
	addr := serve(t, l, ok, turnedIdle)

	var silent []net.Conn // accepted in the order dialled
	for range 10 {
		silent = append(silent, dial(t, addr))
	}
	for i, c := range silent[:6] {
		if !closed(t, c) {
			t.Errorf("silent connection %d of 10 left open past the bound of 4", i+1)
		}
	}
	if n := l.Open(); n > 4 {
		t.Errorf("Open() = %d, want at most 4", n)
	}

	// Four idle keep-alive connections, then a fifth client: served.
	var idle []net.Conn
	for range 4 {
		c := dial(t, addr)
		if status, err := get(c, bufio.NewReader(c)); err != nil || !strings.HasPrefix(status, "200") {
			t.Fatalf("GET: %q, %v", status, err)
		}
		<-turnedIdle
		idle = append(idle, c)
	}
	c := dial(t, addr)
	if status, err := get(c, bufio.NewReader(c)); err != nil || !strings.HasPrefix(status, "200") {
		t.Fatalf("GET past the bound: %q, %v", status, err)
	}
	if !closed(t, idle[0]) {
		t.Error("the connection idle longest was not closed to make room")
	}
	if n := l.Open(); n > 4 {
		t.Errorf("Open() = %d, want at most 4", n)
	}
}

// When every connection is in the middle of a request, a new one is closed
// at once, and those requests are answered.
func TestLimiterRefusesWhenAllBusy(t *testing.T) {
	l := connlimit.New(2)
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	addr := serve(t, l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		started <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "ok")
	}), nil)
	var busy []net.Conn
	for range 2 {
		c := dial(t, addr)
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		<-started
		busy = append(busy, c)
	}
	if !closed(t, dial(t, addr)) {
		t.Error("a connection past the bound was kept while every other was in a request")
	}
	close(release)
	for i, c := range busy {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("busy request %d: %v, %v", i+1, resp, err)
		}
	}
	poll.Until(t, 10*time.Second, "two connections held", func() bool { return l.Open() == 2 })
}
