package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

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
