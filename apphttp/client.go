// Package apphttp is courier's HTTP client for the app it sits beside: the
// client and its transport (NewClient), the app's URL parsed once with the
// client that sends to it (Endpoint), the one call that sends a request
// (Endpoint.Send) and the one that reads its answer (ReadAnswer; Post does
// both, for the delivery loop), what an outcome means (AppError, Classify,
// RetryAfter), and what HTTP can carry of a NATS message's headers
// (AppHeaders). proxy (the delivery loop) and reply (request/reply) both
// send through it.
//
// What it bounds:
//   - idle connections: at most ClientOptions.MaxConns kept alive per client,
//     each closed after IdleTimeout (default 4s); over https, net/http's
//     Transport also bounds open connections to MaxConns. How many requests
//     are sent at once is the caller's bound (its workers or slots).
//   - connecting: DialTimeout (default 5s), the TLS handshake as long.
//   - an answer's header: 10 MiB, interim answers (1xx) included, as
//     net/http's Transport bounds it.
//   - reading an answer: ReadAnswer keeps at most the limit it is given of a
//     2xx's body and 512 bytes of any other (for logs and dead letters), and
//     drains at most 64 KiB more so that the connection is reused; a longer
//     answer's connection is closed.
//   - time: nothing of its own per request: the caller's context bounds each
//     one, its answer's body included.
//
// What it never does: send a request again once any of it may have reached
// the app (the one resend, in Send, is of a request that never left whole on
// a reused connection found closed); follow a redirect (a 3xx is the app's
// answer); use a proxy from the environment; ask for compression or HTTP/2.
package apphttp

import (
	"net"
	"net/http"
	"time"

	"github.com/courierhq/courier/internal/appurl"
)

// ClientOptions tunes the HTTP client for one local upstream.
type ClientOptions struct {
	// MaxConns bounds the idle keep-alive connections kept to the app (and,
	// over https, the connections open at once); it should equal the
	// caller's bound on concurrent requests, so that each finds one idle.
	// A plain-HTTP request beyond it opens a connection of its own, closed
	// after its answer. Default 8.
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
// kept idle up to MaxConns, no redirects followed (a 3xx is the app's
// answer: a redirected POST would become a GET), no proxy from the
// environment, and no resends of its own (Send decides resends). It sends
// requests for a unix:// URL to its socket. Plain http:// and unix://
// requests go over the HTTP/1.1 transport of h1.go, https over net/http's
// Transport. It is safe for concurrent use.
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
