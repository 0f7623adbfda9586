package apphttp

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
)

// The path of a request that does not go to NewClient's HTTP/1.1 transport
// directly: https, a URL with a user, a client of the caller's own. It goes
// through net/http (Client.Do, or the client's transport), and httptrace
// tells how far it got, for classifying a failure.

// connTrace is what one request learns of its connection, for classifying
// a failure: the state and the hooks that set it in one allocation, read
// once Do has returned. Its hooks are all of httptrace's ClientTrace: a
// ConnectDone hook would also make httptrace add a net-level trace to every
// request's context.
type connTrace struct {
	askedConn       bool // the transport went for a connection
	gotConn, reused bool
	wroteErr        error
	wrote           bool
	// handshaking: a connection was made and its TLS handshake began. It
	// is set from the dialling goroutine, which may outlive Do when the
	// request is cancelled mid-dial: hence atomic.
	handshaking atomic.Bool
	hooks       httptrace.ClientTrace
}

func newConnTrace() *connTrace {
	t := &connTrace{}
	t.hooks = httptrace.ClientTrace{
		GetConn:           func(string) { t.askedConn = true },
		TLSHandshakeStart: func() { t.handshaking.Store(true) },
		GotConn:           func(i httptrace.GotConnInfo) { t.gotConn, t.reused = true, i.Reused },
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			t.wrote, t.wroteErr = true, i.Err
		},
	}
	return t
}

// exchangeNetHTTP sends one request through net/http and returns the app's
// response, or an *AppError saying how it failed: whether a connection was
// ever made (the app never saw the request), and whether the request may be
// sent again (resend: it never left courier whole, on a reused keep-alive
// connection found closed while writing).
func (e *Endpoint) exchangeNetHTTP(ctx context.Context, h http.Header, body []byte) (resp *http.Response, err error, resend bool) {
	t := newConnTrace()
	req := e.newRequest(httptrace.WithClientTrace(ctx, &t.hooks), h, body)
	if req.Body == http.NoBody {
		// An empty body is http.NoBody, which the transport deems replayable
		// when an Idempotency-Key header is present, GetBody or not, and would
		// then resend after the app read the request and dropped the
		// connection. Field names are case-insensitive: sent in lower case,
		// the transport's exact-name check does not see them.
		req.Header = hideReplayKeys(h)
	}
	resp, err = roundTrip(e.client, e.rt, req)
	if err != nil {
		// The trace callbacks ran on this goroutine's request before Do
		// returned, so reading them here is ordered after their writes.
		err, resend := exchangeError(ctx, err, t)
		return nil, err, resend
	}
	return resp, nil, false
}

// roundTrip is c.Do(req) for a client NewClient made, whose transport is rt
// (nil: call c.Do): the same answer and the same errors, without the copy of
// the request's headers that Client.Do makes for redirects, which that
// client never follows.
func roundTrip(c *http.Client, rt http.RoundTripper, req *http.Request) (*http.Response, error) {
	if rt == nil {
		return c.Do(req)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		// As Client.Do reports it.
		if tlsErr, ok := err.(tls.RecordHeaderError); ok && string(tlsErr.RecordHeader[:]) == "HTTP/" {
			err = http.ErrSchemeMismatch
		}
		return nil, &url.Error{Op: "Post", URL: req.URL.String(), Err: err}
	}
	if err := badLocation(req.URL, req.ContentLength, resp); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// badLocation is the error Client.Do returns for resp, an answer to a
// request to u with a body of length bytes: Client.Do parses the Location
// of a redirect it could follow before asking CheckRedirect (NewClient's
// refuses every one), and fails on one it cannot parse. A 307 or 308 it
// could follow only without a body, having no GetBody to send it again.
func badLocation(u *url.URL, length int64, resp *http.Response) error {
	switch resp.StatusCode {
	case 301, 302, 303, 307, 308:
		if resp.StatusCode >= 307 && length != 0 {
			return nil
		}
		if loc := resp.Header.Get("Location"); loc != "" {
			if _, perr := u.Parse(loc); perr != nil {
				return &url.Error{Op: "Post", URL: u.String(),
					Err: fmt.Errorf("failed to parse Location header %q: %v", loc, perr)}
			}
		}
	}
	return nil
}

// hideReplayKeys returns h with the header names that make net/http resend a
// body-less POST on its own written in lower case.
func hideReplayKeys(h http.Header) http.Header {
	keys := []string{"Idempotency-Key", "X-Idempotency-Key"}
	var out http.Header
	for _, k := range keys {
		if vs, ok := h[k]; ok {
			if out == nil {
				out = h.Clone()
			}
			delete(out, k)
			out[strings.ToLower(k)] = vs
		}
	}
	if out == nil {
		return h
	}
	return out
}
