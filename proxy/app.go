package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/courierhq/courier/internal/appurl"
)

// ClientOptions tunes the HTTP client for one local upstream.
type ClientOptions struct {
	// MaxConns bounds connections to the app; it should equal the in-flight
	// limit. Default 8.
	MaxConns int
	// DialTimeout bounds connecting; a connect that takes longer means the
	// app is unreachable. Default 5s.
	DialTimeout time.Duration
	// IdleTimeout closes idle keep-alive connections. Default 4s: shorter
	// than common app servers' own keep-alive timeouts (Node's is 5s), so
	// courier rarely reuses a connection the app is closing at that moment.
	IdleTimeout time.Duration
}

// NewClient returns an HTTP client for one local app: keep-alive connections
// sized to the in-flight limit, no redirects followed (a 3xx is the app's
// answer: a redirected POST would become a GET), no proxy from the
// environment, and no resends of its own (Post decides resends). It sends
// requests for a unix:// URL to its socket.
func NewClient(o ClientOptions) *http.Client {
	if o.MaxConns <= 0 {
		o.MaxConns = 8
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 4 * time.Second
	}
	d := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		Proxy:                 nil,                        // a sidecar talks to its app directly
		DialContext:           appurl.Dial(d.DialContext), // unix:// URLs to their socket
		MaxIdleConns:          o.MaxConns,
		MaxIdleConnsPerHost:   o.MaxConns,
		MaxConnsPerHost:       o.MaxConns,
		IdleConnTimeout:       o.IdleTimeout,
		TLSHandshakeTimeout:   o.DialTimeout,
		ExpectContinueTimeout: 0,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}
	return &http.Client{
		Transport: &h1Transport{dial: t.DialContext, maxIdle: o.MaxConns, idleTime: o.IdleTimeout, next: t},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// maxDrain is how much of an answer courier reads so that the connection can
// be reused; a longer answer is cut off and its connection closed.
const maxDrain = 64 << 10

// maxBodySnippet is how much of a failed answer is kept for logs and dead
// letters.
const maxBodySnippet = 512

// Post sends one attempt to the app: exactly one request reaches it. The only
// resend is of a request that never left courier whole (a reused keep-alive
// connection found closed while writing), which the app cannot have acted
// on. It returns nil for a 2xx, else an *AppError.
func Post(ctx context.Context, c *http.Client, url string, h http.Header, body []byte) error {
	_, err := PostAnswer(ctx, c, url, h, body, 0)
	return err
}

// Send is one attempt of a request whose whole answer the caller reads (the
// request/reply service): exactly one request reaches the app, as with
// Post. It returns the response (the caller closes its body), or an
// *AppError for a request that got none.
func Send(ctx context.Context, c *http.Client, url string, h http.Header, body []byte) (*http.Response, error) {
	ep, err := parseEndpoint(url)
	if err != nil {
		return nil, &AppError{Kind: KindTransport, Err: err}
	}
	for try := 0; ; try++ {
		resp, err, resend := exchange(ctx, c, nil, ep, h, body)
		if !resend || try > 0 || ctx.Err() != nil {
			return resp, err
		}
	}
}

// Answer is the app's answer to a 2xx, as far as it was read.
type Answer struct {
	Status int
	Header http.Header
	// Body is the start of the answer: at most the limit PostAnswer was
	// given; Cut says there was more (Size counts what was read).
	Body []byte
	Cut  bool
	Size int64
}

// PostAnswer is Post that also returns a 2xx answer, its body read up to
// limit bytes (0: the answer is not kept, only drained).
func PostAnswer(ctx context.Context, c *http.Client, url string, h http.Header, body []byte, limit int64) (*Answer, error) {
	ep, err := parseEndpoint(url)
	if err != nil {
		return nil, &AppError{Kind: KindTransport, Err: err}
	}
	return postAnswer(ctx, c, ep, h, body, limit)
}

func postAnswer(ctx context.Context, c *http.Client, ep endpoint, h http.Header, body []byte, limit int64) (*Answer, error) {
	for try := 0; ; try++ {
		a, err, resend := post(ctx, c, nil, ep, h, body, limit)
		if !resend || try > 0 || ctx.Err() != nil {
			return a, err
		}
	}
}

// postDirect is postAnswer with a client NewClient made: its requests go
// straight to rt, its transport (roundTrip).
func postDirect(ctx context.Context, c *http.Client, rt http.RoundTripper, ep endpoint, h http.Header, body []byte, limit int64) (*Answer, error) {
	if ep.url.User != nil {
		rt = nil // Client.Do turns the URL's user into an Authorization header
	}
	for try := 0; ; try++ {
		a, err, resend := post(ctx, c, rt, ep, h, body, limit)
		if !resend || try > 0 || ctx.Err() != nil {
			return a, err
		}
	}
}

// endpoint is the app's URL parsed once, as http.NewRequest parses it, so
// that each request is built without parsing it again: tmpl is a request to
// it with no header nor body, which each request copies. Requests share the
// URL: neither the client nor the transport modifies a request's URL.
type endpoint struct {
	url  *url.URL
	tmpl *http.Request
	// uri and addr are the request target and the host:port dialled (an
	// address standing for the socket of a unix:// URL).
	uri, addr string
}

// A unix:// URL names an app on a Unix socket (internal/appurl): its
// requests go to a host standing for the socket, which NewClient's dialer
// connects to it.
func parseEndpoint(raw string) (endpoint, error) {
	t, err := appurl.Parse(raw)
	if err != nil {
		return endpoint{}, err
	}
	req, err := http.NewRequest(http.MethodPost, t.URL.String(), nil)
	if err != nil {
		return endpoint{}, err
	}
	req.Host = t.Host
	req.Header = nil
	return endpoint{url: req.URL, tmpl: req, uri: req.URL.RequestURI(), addr: canonicalAddr(req.URL)}, nil
}

// newRequest is http.NewRequestWithContext(ctx, POST, ep, bytes.NewReader(body))
// without parsing the URL, and without GetBody: without it the transport
// never resends on its own (it would, for a POST carrying an
// Idempotency-Key, after the app may have read it). The body stays a
// NopCloser around a bytes.Reader: the transport sends the headers and a
// body it knows to be in memory in one write.
func newRequest(ctx context.Context, ep endpoint, h http.Header, body []byte) *http.Request {
	req := ep.tmpl.WithContext(ctx) // a copy
	req.Header, req.Body, req.ContentLength = h, http.NoBody, int64(len(body))
	if len(body) > 0 {
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	return req
}

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

// exchange sends one request and returns the app's response, or an
// *AppError saying how it failed: whether a connection was ever made (the
// app never saw the request), and whether the request may be sent again
// (resend: it never left courier whole, on a reused keep-alive connection
// found closed while writing).
func exchange(ctx context.Context, c *http.Client, rt http.RoundTripper, ep endpoint, h http.Header, body []byte) (resp *http.Response, err error, resend bool) {
	if h1, ok := rt.(*h1Transport); ok && ep.url.Scheme == "http" && ep.url.User == nil {
		return h1.exchange(ctx, ep, h, body)
	}
	t := newConnTrace()
	req := newRequest(httptrace.WithClientTrace(ctx, &t.hooks), ep, h, body)
	if req.Body == http.NoBody {
		// An empty body is http.NoBody, which the transport deems replayable
		// when an Idempotency-Key header is present, GetBody or not, and would
		// then resend after the app read the request and dropped the
		// connection. Field names are case-insensitive: sent in lower case,
		// the transport's exact-name check does not see them.
		req.Header = hideReplayKeys(h)
	}
	resp, err = roundTrip(c, rt, req)
	if err != nil {
		// The trace callbacks ran on this goroutine's request before Do
		// returned, so reading them here is ordered after their writes.
		err, resend := exchangeError(ctx, err, t)
		return nil, err, resend
	}
	return resp, nil, false
}

// exchangeError is the *AppError of a request that got no answer, from what
// it learned of its connection (t), and whether it may be sent again.
func exchangeError(ctx context.Context, err error, t *connTrace) (error, bool) {
	switch {
	case !t.askedConn:
		// Refused before any connection was sought (a header the
		// transport will not send): about this request, not the app.
		return &AppError{Kind: KindTransport, Err: err}, false
	case !t.gotConn && t.handshaking.Load():
		// The app accepted the connection but the TLS handshake failed
		// (a certificate courier does not trust): a fault of the set-up
		// that holding messages would not cure, and the probe's plain
		// connection would call the app back at once.
		return &AppError{Kind: KindTransport, Err: err}, false
	case !t.gotConn:
		return &AppError{Kind: KindUnreachable, Err: err}, false
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err) ||
		errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		return &AppError{Kind: KindTimeout, Err: err}, false
	case t.reused && (!t.wrote || t.wroteErr != nil):
		return &AppError{Kind: KindTransport, Err: err}, true
	default:
		return &AppError{Kind: KindTransport, Err: err}, false
	}
}

func post(ctx context.Context, c *http.Client, rt http.RoundTripper, ep endpoint, h http.Header, body []byte, limit int64) (a *Answer, err error, resend bool) {
	resp, err, resend := exchange(ctx, c, rt, ep, h, body)
	if err != nil {
		return nil, err, resend
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if limit <= 0 {
			// Drain so the connection is reused; a huge answer is cut off.
			_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
			return nil, nil, false
		}
		// Read one byte more than the limit to know whether it was cut.
		b, rerr := io.ReadAll(io.LimitReader(resp.Body, limit+1))
		a := &Answer{Status: resp.StatusCode, Header: resp.Header, Body: b, Size: int64(len(b))}
		if int64(len(b)) > limit {
			a.Body, a.Cut = b[:limit], true
			n, _ := io.CopyN(io.Discard, resp.Body, maxDrain)
			a.Size += n
		}
		if rerr != nil {
			// The app answered 2xx and acted; the rest of its answer is
			// lost, not the delivery.
			a.Cut = true
		}
		return a, nil, false
	}
	snippet := make([]byte, maxBodySnippet)
	n, _ := io.ReadFull(resp.Body, snippet)
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	return nil, &AppError{
		Kind:       KindStatus,
		Status:     resp.StatusCode,
		RetryAfter: resp.Header.Get("Retry-After"),
		Body:       cleanSnippet(snippet[:n]),
	}, false
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

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// cleanSnippet makes the start of an answer printable on one line.
func cleanSnippet(b []byte) string {
	s := strings.ToValidUTF8(string(b), "?")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	return strings.TrimSpace(s)
}
