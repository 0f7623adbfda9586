package apphttp

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
)

// Requests one after another share one keep-alive connection, and the app
// receives each whole, headers and body.
func TestH1KeepsConnectionsAlive(t *testing.T) {
	var got []string
	var mu sync.Mutex
	app, cc := newCountedApp(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" "+r.Header.Get("Idempotency-Key")+" "+string(b))
		mu.Unlock()
		_, _ = io.WriteString(w, "ok "+string(b))
	})
	c := NewClient(ClientOptions{MaxConns: 2})
	if _, ok := c.Transport.(*h1Transport); !ok {
		t.Fatalf("NewClient's transport is %T, want *h1Transport", c.Transport)
	}
	for i, body := range []string{"a", "bb", "ccc", ""} {
		status, answer, err := h1Post(t, c, app.URL+"/in", body)
		if err != nil || status != 200 || answer != "ok "+body {
			t.Fatalf("request %d: %d %q %v", i, status, answer, err)
		}
	}
	if n := cc.opened.Load(); n != 1 {
		t.Errorf("%d connections for 4 requests in turn, want 1", n)
	}
	want := []string{"POST /in k a", "POST /in k bb", "POST /in k ccc", "POST /in k "}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("the app received %q, want %q", got, want)
	}
}

// Bodies that fit in the connection's buffer beside the head and bodies
// that do not (written with the head in one writev) arrive whole, in turn,
// on one keep-alive connection, over TCP and over a Unix socket: each
// leaves the connection ready for the next.
func TestH1LargeBodiesShareAConnection(t *testing.T) {
	handler := func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = io.WriteString(w, r.Header.Get("Idempotency-Key")+" "+strconv.Itoa(len(b))+" "+string(b[len(b)/2:]))
	}
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			var cc connCounter
			app := httptest.NewUnstartedServer(http.HandlerFunc(handler))
			app.Config.ConnState = cc.hook
			url := ""
			if network == "unix" {
				path := filepath.Join(t.TempDir(), "app.sock")
				ln, err := net.Listen("unix", path)
				if err != nil {
					t.Fatal(err)
				}
				app.Listener.Close()
				app.Listener = ln
				url = "unix://" + path + ":/in"
			}
			app.Start()
			t.Cleanup(app.Close)
			if url == "" {
				url = app.URL + "/in"
			}
			c := NewClient(ClientOptions{MaxConns: 1})
			for i, n := range []int{0, 17 << 10, 1, 3900, 4096 - 200, 4096, 5000, 1 << 20, 100} {
				body := strings.Repeat(string(rune('a'+i)), n/2) + strings.Repeat(string(rune('A'+i)), n-n/2)
				status, answer, err := h1Post(t, c, url, body)
				want := "k " + strconv.Itoa(n) + " " + body[n/2:]
				if err != nil || status != 200 || answer != want {
					t.Fatalf("a %d-byte body: %d, answer of %d bytes (%.40q), %v; want 200 and %.40q", n, status, len(answer), answer, err, want)
				}
			}
			if n := cc.opened.Load(); n != 1 {
				t.Errorf("%d connections for requests in turn, want 1", n)
			}
		})
	}
}

// An answer with Connection: close, or one from an HTTP/1.0 app without
// keep-alive, leaves its connection closed; an answer not read to its end
// closes its connection too.
func TestH1ClosesConnectionsThatCannotBeReused(t *testing.T) {
	app, cc := newCountedApp(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("close") != "" {
			w.Header().Set("Connection", "close")
		}
		_, _ = io.WriteString(w, strings.Repeat("x", 100))
	})
	c := NewClient(ClientOptions{MaxConns: 2})
	if _, _, err := h1Post(t, c, app.URL+"/?close=1", "x"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 15*time.Second, "the app to see the connection closed", func() bool { return cc.closed.Load() == 1 })

	resp, err, _ := exchange(context.Background(), c, c.Transport, app.URL+"/", http.Header{}, []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // 90 bytes unread
	poll.Until(t, 15*time.Second, "the connection of an answer not read whole closed", func() bool { return cc.closed.Load() == 2 })
	if _, _, err := h1Post(t, c, app.URL+"/", "x"); err != nil {
		t.Fatal(err)
	}
	if n := cc.opened.Load(); n != 3 {
		t.Errorf("%d connections, want 3", n)
	}
}

// Interim answers (103 Early Hints) are skipped; a chunked answer is read
// whole, and its connection reused.
func TestH1InterimAndChunkedAnswers(t *testing.T) {
	app, cc := newCountedApp(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusAccepted)
		for i := range 3 {
			_, _ = io.WriteString(w, strings.Repeat(string(rune('a'+i)), 10))
			w.(http.Flusher).Flush() // chunked: no Content-Length
		}
	})
	c := NewClient(ClientOptions{MaxConns: 2})
	for range 2 {
		status, answer, err := h1Post(t, c, app.URL+"/", "x")
		if err != nil || status != http.StatusAccepted || answer != strings.Repeat("a", 10)+strings.Repeat("b", 10)+strings.Repeat("c", 10) {
			t.Fatalf("got %d %q %v, want 202 and the three chunks", status, answer, err)
		}
	}
	if n := cc.opened.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// The context ends a request at any point: while the app has not answered,
// and while its answer's body is being read. The connection is closed, and
// the error is the context's cause.
func TestH1ContextEndsRequest(t *testing.T) {
	release := make(chan struct{})
	app, cc := newCountedApp(t, func(w http.ResponseWriter, r *http.Request) {
		// Read whole, so that the server watches the connection and ends
		// r.Context() when courier closes it.
		_, _ = io.ReadAll(r.Body)
		if r.URL.Query().Get("body") != "" {
			w.Header().Set("Content-Length", "100")
			_, _ = io.WriteString(w, "part")
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) }) // before app.Close, which waits for the handlers
	c := NewClient(ClientOptions{MaxConns: 2})

	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(100*time.Millisecond, func() { cancel(context.DeadlineExceeded) })
	_, err, _ := exchange(ctx, c, c.Transport, app.URL+"/", http.Header{}, []byte("x"))
	var ae *AppError
	if !errors.As(err, &ae) || ae.Kind != KindTimeout {
		t.Fatalf("request ended by its context: %v, want a timeout", err)
	}

	ctx, cancel2 := context.WithCancel(context.Background())
	resp, err, _ := exchange(ctx, c, c.Transport, app.URL+"/?body=1", http.Header{}, []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(100*time.Millisecond, cancel2)
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("reading a body whose context ended: %v, want context.Canceled", err)
	}
	poll.Until(t, 15*time.Second, "both connections closed", func() bool { return cc.closed.Load() == 2 })
}

// The context ends a request whose body the app does not read: the write
// of a body larger than the connection's buffers (one writev, head and
// body) blocks until the context ends it.
func TestH1ContextEndsAWriteTheAppDoesNotRead(t *testing.T) {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	writing := make(chan struct{})
	url := rawApp(t, func(conn net.Conn) {
		// The first byte says the write is under way; nothing more is read.
		if _, err := conn.Read(make([]byte, 1)); err == nil {
			close(writing)
		}
		<-stop
	})
	c := NewClient(ClientOptions{MaxConns: 1})
	body := make([]byte, 64<<20)
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		select {
		case <-writing:
			cancel(context.DeadlineExceeded)
		case <-stop:
		}
	}()
	_, err, _ := exchange(ctx, c, c.Transport, url+"/", http.Header{}, body)
	select {
	case <-writing:
	default:
		t.Fatalf("the request ended before the app received any of it: %v", err)
	}
	var ae *AppError
	if !errors.As(err, &ae) || ae.Kind != KindTimeout {
		t.Fatalf("a write the app does not read, ended by its context: %v, want a timeout", err)
	}
}

// An app that answers before reading the whole request (413) and closes its
// end: its answer is the outcome, not a failed write.
func TestH1EarlyAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		_, _ = io.WriteString(conn, "HTTP/1.1 413 Request Entity Too Large\r\nConnection: close\r\nContent-Length: 8\r\n\r\ntoo big!")
		// Close with most of the body unread: a reset for the writer.
	}()
	c := NewClient(ClientOptions{MaxConns: 2})
	status, answer, err := h1Post(t, c, "http://"+ln.Addr().String()+"/", strings.Repeat("x", 32<<20))
	if err != nil || status != http.StatusRequestEntityTooLarge || answer != "too big!" {
		t.Fatalf("got %d %q %v, want the app's 413", status, answer, err)
	}
}

// appendHead and writeRest write what Request.Write writes: read back by the server's
// parser, the two give the same method, target, host, header and body.
func TestH1WritesRequestsAsNetHTTP(t *testing.T) {
	for _, tc := range []struct {
		name, url string
		header    http.Header
		body      string
		close     bool
	}{
		{"body and headers", "http://127.0.0.1:8080/in?x=1&y=%2F", http.Header{
			"idempotency-key": {"k"}, "X-Multi": {"a", "b"}, "Content-Type": {"application/json"}}, `{"a":1}`, false},
		{"empty body", "http://app/", http.Header{"Idempotency-Key": {"k"}}, "", false},
		{"own user agent, connection close", "http://app:81/p", http.Header{"User-Agent": {"mine"}}, "x", true},
		{"no user agent", "http://app/", http.Header{"User-Agent": {""}}, "x", false},
		{"unix socket host", "unix:///run/app.sock/in", http.Header{}, "x", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep, err := NewEndpoint(nil, tc.url, false)
			if err != nil {
				t.Fatal(err)
			}
			read := func(write func(*bufio.Writer, *http.Request) error) (*http.Request, string) {
				req := ep.newRequest(context.Background(), tc.header.Clone(), []byte(tc.body))
				req.Close = tc.close
				var buf strings.Builder
				w := bufio.NewWriter(&buf)
				if err := write(w, req); err != nil {
					t.Fatal(err)
				}
				if err := w.Flush(); err != nil {
					t.Fatal(err)
				}
				got, err := http.ReadRequest(bufio.NewReader(strings.NewReader(buf.String())))
				if err != nil {
					t.Fatalf("%v in %q", err, buf.String())
				}
				b, err := io.ReadAll(got.Body)
				if err != nil {
					t.Fatal(err)
				}
				return got, string(b)
			}
			ours, ourBody := read(func(w *bufio.Writer, req *http.Request) error {
				r := h1RequestOf(req)
				return writeRest(w, appendHead(nil, &r), &r)
			})
			theirs, theirBody := read(func(w *bufio.Writer, r *http.Request) error { return r.Write(w) })
			if ours.Method != theirs.Method || ours.RequestURI != theirs.RequestURI || ours.Host != theirs.Host ||
				ours.ContentLength != theirs.ContentLength || ours.Close != theirs.Close || ourBody != theirBody {
				t.Errorf("ours: %s %s host %q length %d close %v body %q; Request.Write: %s %s host %q length %d close %v body %q",
					ours.Method, ours.RequestURI, ours.Host, ours.ContentLength, ours.Close, ourBody,
					theirs.Method, theirs.RequestURI, theirs.Host, theirs.ContentLength, theirs.Close, theirBody)
			}
			if len(ours.Header) != len(theirs.Header) {
				t.Errorf("header %v, Request.Write's %v", ours.Header, theirs.Header)
			}
			for k, vs := range theirs.Header {
				if strings.Join(ours.Header[k], "|") != strings.Join(vs, "|") {
					t.Errorf("%s: %q, Request.Write's %q", k, ours.Header[k], vs)
				}
			}
			if ourBody != tc.body {
				t.Errorf("body %q, want %q", ourBody, tc.body)
			}
		})
	}
}

// A request whose context ended before it was sent fails without a
// connection, and not as an unreachable app (which would hold messages and
// call the app unavailable): a deadline as a timeout, as when it passes
// during the write or the wait for an answer, a cancel as a transport
// error, as with net/http's Transport.
func TestH1ContextEndedBeforeSending(t *testing.T) {
	app, cc := newCountedApp(t, func(w http.ResponseWriter, r *http.Request) {})
	c := NewClient(ClientOptions{MaxConns: 2})
	for cause, kind := range map[error]ErrorKind{context.Canceled: KindTransport, context.DeadlineExceeded: KindTimeout} {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(cause)
		for _, tc := range []struct {
			name string
			rt   http.RoundTripper // nil: Client.Do, through RoundTrip
		}{
			{"exchange", c.Transport},
			{"RoundTrip", nil},
			{"net/http's Transport", c.Transport.(*h1Transport).next},
		} {
			_, err, resend := exchange(ctx, c, tc.rt, app.URL+"/", http.Header{}, []byte("x"))
			var ae *AppError
			if !errors.As(err, &ae) || ae.Kind != kind || resend || !errors.Is(err, cause) {
				t.Errorf("%s, context ended (%v): %v (resend %v), want a %v error of the context's cause", tc.name, cause, err, resend, kind)
			}
		}
	}
	if n := cc.opened.Load(); n != 0 {
		t.Errorf("%d connections for requests whose context had ended, want 0", n)
	}
}

// An app may send interim answers (102 Processing) while it works, as many
// as it likes: net/http's Transport bounds their size, not their number.
// The answer that follows is the outcome, on both transports.
func TestH1ManyInterimAnswers(t *testing.T) {
	url := rawApp(t, func(conn net.Conn) {
		br := bufio.NewReader(conn)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			_, _ = io.WriteString(conn, strings.Repeat("HTTP/1.1 102 Processing\r\n\r\n", 20)+
				"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	c := NewClient(ClientOptions{MaxConns: 2})
	for _, rt := range []http.RoundTripper{c.Transport, c.Transport.(*h1Transport).next} {
		for i := range 2 {
			resp, err, _ := exchange(context.Background(), c, rt, url, http.Header{}, []byte("x"))
			if err != nil {
				t.Fatalf("%T, request %d: %v, want the 200 after 20 interim answers", rt, i, err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(b) != "ok" || err != nil {
				t.Fatalf("%T, request %d: %d %q %v, want 200 \"ok\"", rt, i, resp.StatusCode, b, err)
			}
		}
	}
}

// An answer whose header does not end is cut off once it passes net/http's
// limit: a transport error, not memory growing until the request times out.
func TestH1BoundsAnswerHeaders(t *testing.T) {
	url := rawApp(t, func(conn net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(conn))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nX-Endless: ")
		line := strings.Repeat("a", 64<<10)
		for range (maxHeaderBytes >> 16) + 16 {
			if _, err := io.WriteString(conn, line); err != nil {
				return
			}
		}
	})
	c := NewClient(ClientOptions{MaxConns: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err, _ := exchange(ctx, c, c.Transport, url, http.Header{}, []byte("x"))
	var ae *AppError
	if !errors.As(err, &ae) || ae.Kind != KindTransport || !strings.Contains(err.Error(), "exceeded") {
		t.Fatalf("an endless answer header: %v, want a transport error saying it exceeded the limit", err)
	}
}
