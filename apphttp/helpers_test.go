package apphttp

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

func retryable(s int) bool { return s == 408 || s == 429 || s == 500 || (s >= 502 && s <= 599) }

// post sends one request to url with c (through Client.Do) and reads its
// answer, not kept: nil for a 2xx, else the *AppError.
func post(ctx context.Context, c *http.Client, url string, h http.Header, body []byte) error {
	e, err := NewEndpoint(c, url, false)
	if err != nil {
		return err
	}
	_, err = e.Post(ctx, h, body, 0)
	return err
}

// endpointVia is the endpoint of url for c, its requests sent through rt:
// c.Transport (straight to NewClient's transport, its HTTP/1.1 exchange for
// a plain http URL), nil (Client.Do), or another transport.
func endpointVia(c *http.Client, rt http.RoundTripper, url string) (*Endpoint, error) {
	e, err := NewEndpoint(c, url, rt != nil)
	if err != nil {
		return nil, err
	}
	if rt != nil && rt != c.Transport {
		e.rt, e.h1 = rt, nil
	}
	return e, nil
}

// exchange is one try of Send to url through rt (as endpointVia), without
// Send's resend: what it answered, and whether Send would send it again.
func exchange(ctx context.Context, c *http.Client, rt http.RoundTripper, url string, h http.Header, body []byte) (*http.Response, error, bool) {
	e, err := endpointVia(c, rt, url)
	if err != nil {
		return nil, err, false
	}
	if e.h1 != nil {
		return e.h1.exchange(ctx, e, h, body)
	}
	return e.exchangeNetHTTP(ctx, h, body)
}

// connCounter counts the connections an httptest server accepted and the
// ones closed since.
type connCounter struct{ opened, closed atomic.Int32 }

func (c *connCounter) hook(_ net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		c.opened.Add(1)
	case http.StateClosed, http.StateHijacked:
		c.closed.Add(1)
	}
}

func newCountedApp(t *testing.T, h http.HandlerFunc) (*httptest.Server, *connCounter) {
	t.Helper()
	var cc connCounter
	app := httptest.NewUnstartedServer(h)
	app.Config.ConnState = cc.hook
	app.Start()
	t.Cleanup(app.Close)
	return app, &cc
}

func h1Post(t *testing.T, c *http.Client, url string, body string) (int, string, error) {
	t.Helper()
	resp, err, _ := exchange(context.Background(), c, c.Transport, url, http.Header{"Idempotency-Key": {"k"}}, []byte(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// rawApp serves each connection accepted on a TCP listener with serve, and
// returns the listener's URL.
func rawApp(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				serve(conn)
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/"
}
