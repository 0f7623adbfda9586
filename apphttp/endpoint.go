package apphttp

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"

	"github.com/courierhq/courier/internal/appurl"
)

// Endpoint is the app's URL parsed once, as http.NewRequest parses it, and
// the client that sends requests to it, so that each request is built
// without parsing the URL again. It is safe for concurrent use: requests
// share its URL and template, which neither the client nor the transport
// modifies.
type Endpoint struct {
	client *http.Client
	// rt, when not nil, is the client's transport, to which requests go
	// straight (a client NewClient made, and a URL without a user).
	rt http.RoundTripper
	// h1 is rt when it is NewClient's HTTP/1.1 transport and the URL plain
	// http (or unix://): requests go to its exchange, without an
	// http.Request of their own.
	h1  *h1Transport
	url *url.URL
	// tmpl is a request to url with no header nor body, which each request
	// copies.
	tmpl *http.Request
	// uri and addr are the request target and the host:port dialled (an
	// address standing for the socket of a unix:// URL).
	uri, addr string
}

// NewEndpoint parses raw (an http, https or unix:// URL: internal/appurl)
// for requests that c sends. With own, c is a client NewClient made and not
// changed since: requests go straight to its transport, without the copy of
// their header that Client.Do makes for redirects, which that client never
// follows; their outcomes read as through Client.Do. Otherwise they go
// through c.Do, so that c's own Timeout, CheckRedirect and Jar apply.
func NewEndpoint(c *http.Client, raw string, own bool) (*Endpoint, error) {
	t, err := appurl.Parse(raw)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(http.MethodPost, t.URL.String(), nil)
	if err != nil {
		return nil, err
	}
	// A unix:// URL's requests go to a host standing for the socket, which
	// NewClient's dialer connects to it, with the Host header appurl gives.
	req.Host = t.Host
	req.Header = nil
	e := &Endpoint{client: c, url: req.URL, tmpl: req, uri: req.URL.RequestURI(), addr: canonicalAddr(req.URL)}
	// Client.Do turns the URL's user into an Authorization header.
	if own && req.URL.User == nil {
		e.rt = c.Transport
		if h1, ok := e.rt.(*h1Transport); ok && req.URL.Scheme == "http" {
			e.h1 = h1
		}
	}
	return e, nil
}

// BodyDone reports whether Send has finished with its body when it
// returns, so that the caller may reuse it: true on NewClient's HTTP/1.1
// transport (h1.go writes the whole request before it reads the answer).
// Through net/http a transport may go on reading a body after RoundTrip
// returns (http.RoundTripper's contract), so the body must stay untouched.
func (e *Endpoint) BodyDone() bool { return e.h1 != nil }

// canonicalAddr is the host and port a request to u goes to, port 80 by
// default.
func canonicalAddr(u *url.URL) string {
	if port := u.Port(); port != "" {
		return u.Host
	}
	return net.JoinHostPort(u.Hostname(), "80")
}

// newRequest is http.NewRequestWithContext(ctx, POST, e, bytes.NewReader(body))
// without parsing the URL, and without GetBody: without it the transport
// never resends on its own (it would, for a POST carrying an
// Idempotency-Key, after the app may have read it). The body stays a
// NopCloser around a bytes.Reader: the transport sends the headers and a
// body it knows to be in memory in one write.
func (e *Endpoint) newRequest(ctx context.Context, h http.Header, body []byte) *http.Request {
	req := e.tmpl.WithContext(ctx) // a copy
	req.Header, req.Body, req.ContentLength = h, http.NoBody, int64(len(body))
	if len(body) > 0 {
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	return req
}
