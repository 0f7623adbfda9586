package apphttp

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
)

// An idle connection the app has closed (its keep-alive timeout, a restart)
// is not used: the next request goes out on a new connection and succeeds.
func TestH1SkipsConnectionsTheAppClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var accepted atomic.Int32
	closed := make(chan struct{}, 3)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				// One answer, keep-alive announced, then the app closes.
				defer func() { conn.Close(); closed <- struct{}{} }()
				req, err := http.ReadRequest(bufio.NewReader(conn))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}()
		}
	}()
	c := NewClient(ClientOptions{MaxConns: 2})
	url := "http://" + ln.Addr().String() + "/"
	for i := range 3 {
		if i > 0 {
			<-closed                          // the app has closed the last connection
			time.Sleep(10 * time.Millisecond) // and its FIN has reached courier's end
		}
		status, answer, err := h1Post(t, c, url, "x")
		if err != nil || status != 200 || answer != "ok" {
			t.Fatalf("request %d after the app closed the last connection: %d %q %v", i, status, answer, err)
		}
	}
	if n := accepted.Load(); n != 3 {
		t.Errorf("%d connections accepted, want 3 (one per request)", n)
	}
}

// Idle connections are closed after the idle timeout, and by
// CloseIdleConnections.
func TestH1ClosesIdleConnections(t *testing.T) {
	app, cc := newCountedApp(t, func(w http.ResponseWriter, r *http.Request) {})
	c := NewClient(ClientOptions{MaxConns: 2, IdleTimeout: 200 * time.Millisecond})
	if _, _, err := h1Post(t, c, app.URL+"/", "x"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 15*time.Second, "the idle connection closed after the idle timeout", func() bool { return cc.closed.Load() == 1 })

	c = NewClient(ClientOptions{MaxConns: 2})
	if _, _, err := h1Post(t, c, app.URL+"/", "x"); err != nil {
		t.Fatal(err)
	}
	c.CloseIdleConnections()
	poll.Until(t, 15*time.Second, "the idle connection closed by CloseIdleConnections", func() bool { return cc.closed.Load() == 2 })
}

// Concurrent requests each get a connection of their own; the pool keeps
// at most MaxConns idle.
func TestH1ConcurrentRequests(t *testing.T) {
	var inApp, most atomic.Int32
	app, cc := newCountedApp(t, func(w http.ResponseWriter, r *http.Request) {
		n := inApp.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(5 * time.Millisecond)
		inApp.Add(-1)
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write(b)
	})
	c := NewClient(ClientOptions{MaxConns: 4})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 20 {
				body := strings.Repeat(string(rune('a'+i)), j+1)
				status, answer, err := h1Post(t, c, app.URL+"/", body)
				if err != nil || status != 200 || answer != body {
					t.Errorf("worker %d request %d: %d %q %v", i, j, status, answer, err)
					return
				}
			}
		})
	}
	wg.Wait()
	tr := c.Transport.(*h1Transport)
	tr.mu.Lock()
	idle := len(tr.idle)
	tr.mu.Unlock()
	if idle > 4 {
		t.Errorf("%d idle connections kept, want at most MaxConns (4)", idle)
	}
	if most.Load() < 2 {
		t.Errorf("at most %d requests at the app at once: the requests did not run concurrently", most.Load())
	}
	poll.Until(t, 15*time.Second, "at most MaxConns (4) connections left open", func() bool {
		return cc.opened.Load()-cc.closed.Load() <= 4
	})
}
