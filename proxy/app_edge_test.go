package proxy

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// An empty message body is an http.NoBody request, which net/http deems
// replayable when it carries an Idempotency-Key: the transport must still not
// resend it after the app read it and dropped the connection.
func TestPostNoSilentResendEmptyBody(t *testing.T) {
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
	if err := Post(context.Background(), c, app.URL, h, nil); err != nil {
		t.Fatal(err)
	}
	err := Post(context.Background(), c, app.URL, h, nil)
	var ae *AppError
	if !errors.As(err, &ae) || ae.Kind != KindTransport {
		t.Fatalf("want a transport error, got %v", err)
	}
	if got := n.Load(); got != 2 {
		t.Fatalf("app saw %d requests, want 2 (no resend)", got)
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
	if err := Post(context.Background(), NewClient(ClientOptions{}), app.URL, h, nil); err != nil {
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
	err := Post(context.Background(), NewClient(ClientOptions{}), app.URL, http.Header{"X-Bad": {"a\x01b"}}, []byte("x"))
	if c := Classify(err, retryable); c == Unavailable || c == Success {
		t.Fatalf("invalid header classified %v (%v), want a failure of the message", c, err)
	}
}
