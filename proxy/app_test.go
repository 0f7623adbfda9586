package proxy

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

func retryable(s int) bool { return s == 408 || s == 429 || s == 500 || (s >= 502 && s <= 599) }

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want Class
	}{
		{"2xx", nil, Success},
		{"429", &AppError{Kind: KindStatus, Status: 429}, Transient},
		{"503", &AppError{Kind: KindStatus, Status: 503}, Transient},
		{"500", &AppError{Kind: KindStatus, Status: 500}, Transient},
		{"501 is permanent", &AppError{Kind: KindStatus, Status: 501}, Permanent},
		{"400", &AppError{Kind: KindStatus, Status: 400}, Permanent},
		{"404", &AppError{Kind: KindStatus, Status: 404}, Permanent},
		{"302 is an answer", &AppError{Kind: KindStatus, Status: 302}, Permanent},
		{"408", &AppError{Kind: KindStatus, Status: 408}, Transient},
		{"timeout", &AppError{Kind: KindTimeout, Err: context.DeadlineExceeded}, Transient},
		{"transport", &AppError{Kind: KindTransport, Err: errors.New("reset")}, Transient},
		{"unreachable", &AppError{Kind: KindUnreachable, Err: errors.New("refused")}, Unavailable},
		{"other error", errors.New("boom"), Transient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.err, retryable); got != tt.want {
				t.Fatalf("Classify = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"", 0, false},
		{"7", 7 * time.Second, true},
		{" 0 ", 0, true},
		{"-3", 0, false},
		{"abc", 0, false},
		{"99999999999", time.Minute, true},
		{"99999999999999999999999", time.Minute, true}, // past int64: still capped, not ignored
		{now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{now.Add(time.Hour).Format(http.TimeFormat), time.Minute, true},
	}
	for _, tt := range tests {
		got, ok := RetryAfter(tt.in, now, time.Minute)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("RetryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestDelayFullJitter(t *testing.T) {
	// rnd returning n-1 shows the ceiling; returning 0 shows the floor.
	top := func(n int64) int64 { return n - 1 }
	for attempt, want := range map[int]time.Duration{
		1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 8 * time.Second, 5: 10 * time.Second, 40: 10 * time.Second,
	} {
		if got := Delay(attempt, time.Second, 10*time.Second, 2, top); got != want {
			t.Errorf("Delay ceiling at attempt %d = %v, want %v", attempt, got, want)
		}
		if got := Delay(attempt, time.Second, 10*time.Second, 2, func(int64) int64 { return 0 }); got != 0 {
			t.Errorf("Delay floor at attempt %d = %v, want 0", attempt, got)
		}
	}
	if got := Delay(3, 100*time.Millisecond, time.Minute, 3, top); got != 900*time.Millisecond {
		t.Errorf("multiplier 3 at attempt 3 = %v, want 900ms", got)
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

	if err := Post(ctx, c, app.URL+"/ok", http.Header{}, []byte("x")); err != nil {
		t.Fatalf("2xx: %v", err)
	}
	var ae *AppError
	err := Post(ctx, c, app.URL+"/redirect", http.Header{}, []byte("x"))
	if !errors.As(err, &ae) || ae.Status != 302 {
		t.Fatalf("redirect: want the 302 itself, got %v", err)
	}
	err = Post(ctx, c, app.URL+"/busy", http.Header{}, []byte("x"))
	if !errors.As(err, &ae) || ae.Status != 503 || ae.RetryAfter != "3" || ae.Body != "try later" {
		t.Fatalf("busy: got %#v", err)
	}
	err = Post(ctx, c, app.URL+"/huge", http.Header{}, []byte("x"))
	if !errors.As(err, &ae) || ae.Status != 500 || len(ae.Body) != maxBodySnippet {
		t.Fatalf("huge: got status %d body %d bytes", ae.Status, len(ae.Body))
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	err = Post(tctx, c, app.URL+"/slow", http.Header{}, []byte("x"))
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
	err = Post(context.Background(), NewClient(ClientOptions{}), "http://"+addr+"/", http.Header{}, nil)
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
			if err := Post(context.Background(), c, app.URL, h, tt.first); err != nil {
				t.Fatal(err)
			}
			err := Post(context.Background(), c, app.URL, h, tt.second)
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
	err := Post(context.Background(), NewClient(ClientOptions{}), app.URL, http.Header{}, []byte("x"))
	var ae *AppError
	if !errors.As(err, &ae) || ae.Kind != KindTransport {
		t.Fatalf("want a transport error, got %v", err)
	}
	if !strings.Contains(err.Error(), "certificate") {
		t.Errorf("error should name the certificate problem: %v", err)
	}
}
