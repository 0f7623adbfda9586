package proxy

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courierhq/courier/apphttp"
)

// TestRequestTimer: one worker's requests share a context until one times
// out; that one ends as a timeout (context.DeadlineExceeded, KindTimeout),
// the next request gets a fresh context and goes through, and the end of
// the grace period (the parent) ends requests as a cancel, not a timeout.
func TestRequestTimer(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 2: // outlives the timeout
			select {
			case <-r.Context().Done():
			case <-release:
			}
		case 4: // outlives the grace period
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}
	}))
	t.Cleanup(app.Close)
	defer close(release)
	c := apphttp.NewClient(apphttp.ClientOptions{MaxConns: 1})
	ep, err := apphttp.NewEndpoint(c, app.URL, true)
	if err != nil {
		t.Fatal(err)
	}
	grace, abandon := context.WithCancel(context.Background())
	defer abandon()
	rt := newRequestTimer(grace, time.Second)
	defer rt.close()
	send := func() (context.Context, error) {
		ctx := rt.start()
		defer rt.stop()
		_, err := ep.Post(ctx, http.Header{}, []byte("x"), 0)
		return ctx, err
	}

	first, err := send()
	if err != nil {
		t.Fatalf("request 1: %v", err)
	}
	second, err := send()
	var ae *apphttp.AppError
	if !errors.As(err, &ae) || ae.Kind != apphttp.KindTimeout || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("request 2 outlived the timeout: got %v, want a KindTimeout wrapping context.DeadlineExceeded", err)
	}
	if first != second {
		t.Error("a request that did not time out left its context to the next: want one context per worker")
	}
	third, err := send()
	if err != nil {
		t.Fatalf("request 3, after a timeout: %v", err)
	}
	if third == second {
		t.Error("the context of a request that timed out was used again")
	}
	if third.Err() != nil {
		t.Errorf("the new context is done: %v", third.Err())
	}

	time.AfterFunc(200*time.Millisecond, abandon)
	_, err = send()
	if err == nil {
		t.Fatal("request 4 outlived the grace period and succeeded")
	}
	if errors.As(err, &ae) && ae.Kind == apphttp.KindTimeout {
		t.Errorf("the end of the grace period read as a timeout: %v", err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("request 4: got %v, want context.Canceled", err)
	}
	if n := calls.Load(); n != 4 {
		t.Errorf("the app saw %d requests, want 4", n)
	}
}
