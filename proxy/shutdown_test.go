package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/proxy"
)

// An app that answered 2xx acted: if the grace period ends while courier is
// still reading the rest of that answer, the message must be acked, not given
// back for a second delivery.
func TestGraceEndingWhileReading2xxBodyStillAcks(t *testing.T) {
	e := setup(t)
	answered := make(chan struct{}, 1)
	release := make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok, and more to come"))
		w.(http.Flusher).Flush()
		answered <- struct{}{}
		select { // a slow tail to the answer
		case <-release:
		case <-time.After(5 * time.Second):
		}
	}))
	defer func() { close(release); app.Close() }()
	r, err := proxy.New(e.cons, dlq.NewPublisher(e.js, "dlq.s"), nil, proxy.Options{
		AppURL: app.URL, Stream: "S", Consumer: "c", MaxDeliver: 5, AckWait: 5 * time.Second,
		ShutdownGrace: 300 * time.Millisecond, Registerer: e.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	if _, err := e.js.Publish(context.Background(), "s.x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("app never called")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the 2xx'd message acked", func() bool { return e.settled(t) })
}
