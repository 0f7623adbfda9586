package apphttp

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestPostDirectAnswersAsClientDo: an endpoint of a client NewClient made
// (own) sends straight to its transport; every outcome must read as it would
// through Client.Do, redirects and failures included.
func TestPostDirectAnswersAsClientDo(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if loc := r.URL.Query().Get("loc"); loc != "" {
			w.Header().Set("Location", loc)
		}
		switch r.URL.Query().Get("status") {
		case "302":
			w.WriteHeader(http.StatusFound)
		case "307":
			w.WriteHeader(http.StatusTemporaryRedirect)
		case "500":
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(app.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/"
	ln.Close()

	for _, tc := range []struct {
		name string
		url  string
		body []byte
	}{
		{"2xx", app.URL + "/", []byte("x")},
		{"500", app.URL + "/?status=500", []byte("x")},
		{"302 with Location", app.URL + "/?status=302&loc=/elsewhere", []byte("x")},
		{"302 with a Location that cannot be parsed", app.URL + "/?status=302&loc=%25zz%3A%2F%2F", []byte("x")},
		{"307 with a body, bad Location", app.URL + "/?status=307&loc=%25zz%3A%2F%2F", []byte("x")},
		{"307 without a body, bad Location", app.URL + "/?status=307&loc=%25zz%3A%2F%2F", nil},
		{"nothing listening", closed, []byte("x")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewClient(ClientOptions{MaxConns: 2})
			send := func(own bool) (*Answer, error) {
				e, err := NewEndpoint(c, tc.url, own)
				if err != nil {
					t.Fatal(err)
				}
				return e.Post(context.Background(), http.Header{"Idempotency-Key": {"k"}}, tc.body, 1<<10)
			}
			viaDo, errDo := send(false)
			direct, errDirect := send(true)
			t.Logf("Client.Do: %v, %v", viaDo != nil, errDo)
			if (viaDo == nil) != (direct == nil) || (viaDo != nil && viaDo.Status != direct.Status) {
				t.Errorf("answer: Client.Do %+v, direct %+v", viaDo, direct)
			}
			if es := func(err error) string {
				if err == nil {
					return ""
				}
				return err.Error() + " / " + Classify(err, func(int) bool { return true }).String()
			}; es(errDo) != es(errDirect) {
				t.Errorf("error: Client.Do %q, direct %q", es(errDo), es(errDirect))
			}
		})
	}
}

func TestPostStatusKinds(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(204)
		case "/redirect":
			http.Redirect(w, r, "/ok", http.StatusFound)
		case "/busy":
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(503)
			w.Write([]byte("try\nlater"))
		case "/huge":
			w.WriteHeader(500)
			big := strings.Repeat("x", 1<<20)
			w.Write([]byte(big))
		case "/slow":
			time.Sleep(300 * time.Millisecond)
		}
	}))
	defer app.Close()
	c := NewClient(ClientOptions{MaxConns: 2})
	ctx := context.Background()

	if err := post(ctx, c, app.URL+"/ok", http.Header{}, []byte("x")); err != nil {
		t.Fatalf("2xx: %v", err)
	}
	var ae *AppError
	err := post(ctx, c, app.URL+"/redirect", http.Header{}, []byte("x"))
	if !errors.As(err, &ae) || ae.Status != 302 {
		t.Fatalf("redirect: want the 302 itself, got %v", err)
	}
	err = post(ctx, c, app.URL+"/busy", http.Header{}, []byte("x"))
	if !errors.As(err, &ae) || ae.Status != 503 || ae.RetryAfter != "3" || ae.Body != "try later" {
		t.Fatalf("busy: got %#v", err)
	}
	err = post(ctx, c, app.URL+"/huge", http.Header{}, []byte("x"))
	if !errors.As(err, &ae) || ae.Status != 500 || len(ae.Body) != maxBodySnippet {
		t.Fatalf("huge: got status %d body %d bytes", ae.Status, len(ae.Body))
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	err = post(tctx, c, app.URL+"/slow", http.Header{}, []byte("x"))
	if !errors.As(err, &ae) || ae.Kind != KindTimeout {
		t.Fatalf("slow: want timeout, got %v", err)
	}
}

func TestPostUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	err = post(context.Background(), NewClient(ClientOptions{}), "http://"+addr+"/", http.Header{}, nil)
	var ae *AppError
	if !errors.As(err, &ae) || ae.Kind != KindUnreachable {
		t.Fatalf("want unreachable, got %v", err)
	}
	if Classify(err, retryable) != Unavailable {
		t.Fatalf("unreachable must classify as Unavailable")
	}
}

// An app that reads the request and then drops the connection must not get a
// second copy from the HTTP client, even on a reused keep-alive connection.
// An empty body is an http.NoBody request, which net/http deems replayable
// when it carries an Idempotency-Key: it must not be resent either.
func TestPostNoSilentResend(t *testing.T) {
	for _, tt := range []struct {
		name          string
		first, second []byte
	}{
		{"body", []byte("a"), []byte("b")},
		{"empty body", nil, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var n atomic.Int32
			app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1) == 1 {
					w.WriteHeader(204) // first request establishes a keep-alive connection
					return
				}
				hj, _ := w.(http.Hijacker)
				conn, _, _ := hj.Hijack()
				conn.Close()
			}))
			defer app.Close()
			c := NewClient(ClientOptions{MaxConns: 1})
			h := http.Header{HeaderIdempotencyKey: {"k"}}
			if err := post(context.Background(), c, app.URL, h, tt.first); err != nil {
				t.Fatal(err)
			}
			err := post(context.Background(), c, app.URL, h, tt.second)
			var ae *AppError
			if !errors.As(err, &ae) || ae.Kind != KindTransport {
				t.Fatalf("want a transport error, got %v", err)
			}
			if got := n.Load(); got != 2 {
				t.Fatalf("app saw %d requests, want 2 (no resend)", got)
			}
		})
	}
}

// A TLS app whose certificate courier does not trust answered the
// connection: that is not an outage (the probe would call it back at once).
func TestPostTLSHandshakeFailureIsNotUnreachable(t *testing.T) {
	app := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer app.Close()
	err := post(context.Background(), NewClient(ClientOptions{}), app.URL, http.Header{}, []byte("x"))
	var ae *AppError
	if !errors.As(err, &ae) || ae.Kind != KindTransport {
		t.Fatalf("want a transport error, got %v", err)
	}
	if !strings.Contains(err.Error(), "certificate") {
		t.Errorf("error should name the certificate problem: %v", err)
	}
}

// The empty-body workaround still delivers the key to the app.
func TestPostEmptyBodyKeepsKey(t *testing.T) {
	var got string
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Get(HeaderIdempotencyKey)
	}))
	defer app.Close()
	h := http.Header{HeaderIdempotencyKey: {"k1"}}
	if err := post(context.Background(), NewClient(ClientOptions{}), app.URL, h, nil); err != nil {
		t.Fatal(err)
	}
	if got != "k1" {
		t.Fatalf("app got Idempotency-Key %q, want k1", got)
	}
	if h.Get(HeaderIdempotencyKey) != "k1" {
		t.Fatal("caller's header changed")
	}
}

// A request the transport refuses to send (a header value HTTP cannot carry)
// is not an app outage: classifying it Unavailable would hold the message
// forever and flap the gate.
func TestPostInvalidHeaderIsNotUnreachable(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer app.Close()
	err := post(context.Background(), NewClient(ClientOptions{}), app.URL, http.Header{"X-Bad": {"a\x01b"}}, []byte("x"))
	if c := Classify(err, retryable); c == Unavailable || c == Success {
		t.Fatalf("invalid header classified %v (%v), want a failure of the message", c, err)
	}
}
