package apphttp

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
)

// Send sends one request to the app: a POST of body with header h, which
// Send does not modify. It returns the app's response, whose body the
// caller reads and closes (ReadAnswer does both), or an *AppError for a
// request that got none, saying whether a connection was ever made.
//
// Exactly one request reaches the app. The one resend is of a request that
// never left courier whole, on a reused keep-alive connection found closed
// while it was written (the app's keep-alive timeout, a restart): the app
// cannot have acted on it. It is sent once more, unless ctx has ended, and
// whatever that second try gives is the outcome.
func (e *Endpoint) Send(ctx context.Context, h http.Header, body []byte) (*http.Response, error) {
	for try := 0; ; try++ {
		var resp *http.Response
		var err error
		var resend bool
		if e.h1 != nil {
			resp, err, resend = e.h1.exchange(ctx, e, h, body)
		} else {
			resp, err, resend = e.exchangeNetHTTP(ctx, h, body)
		}
		if !resend || try > 0 || ctx.Err() != nil {
			return resp, err
		}
	}
}

// Post is Send, then ReadAnswer with limit: the request of a delivery (or
// a batch of them), whose answer is a typed outcome.
func (e *Endpoint) Post(ctx context.Context, h http.Header, body []byte, limit int64) (*Answer, error) {
	resp, err := e.Send(ctx, h, body)
	if err != nil {
		return nil, err
	}
	return ReadAnswer(resp, limit)
}

// Answer is the app's answer to a 2xx, as far as it was read.
type Answer struct {
	Status int
	Header http.Header
	// Body is the start of the answer: at most the limit ReadAnswer was
	// given; Cut says there was more (Size counts what was read).
	Body []byte
	Cut  bool
	Size int64
}

// maxDrain is how much of an answer courier reads so that the connection can
// be reused; a longer answer is cut off and its connection closed.
const maxDrain = 64 << 10

// maxBodySnippet is how much of a failed answer is kept for logs and dead
// letters.
const maxBodySnippet = 512

// ReadAnswer reads the app's answer to a request Send sent, and closes its
// body. A 2xx is nil, or with limit above 0 an Answer whose body is read up
// to limit bytes; any other status is an *AppError of KindStatus holding
// the app's Retry-After and the start of its answer.
func ReadAnswer(resp *http.Response, limit int64) (*Answer, error) {
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if limit <= 0 {
			// Drain so the connection is reused; a huge answer is cut off.
			_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
			return nil, nil
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
		return a, nil
	}
	snippet := make([]byte, maxBodySnippet)
	n, _ := io.ReadFull(resp.Body, snippet)
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	return nil, &AppError{
		Kind:       KindStatus,
		Status:     resp.StatusCode,
		RetryAfter: resp.Header.Get("Retry-After"),
		Body:       cleanSnippet(snippet[:n]),
	}
}

// exchangeError is the *AppError of a request that got no answer, from what
// it learned of its connection (t), and whether it may be sent again.
func exchangeError(ctx context.Context, err error, t *connTrace) (error, bool) {
	switch {
	case !t.askedConn && errors.Is(err, context.DeadlineExceeded):
		// The request's time ran out before it went: a timeout, as it is
		// a moment later while it is written or its answer awaited, so
		// that when the deadline passes does not change what it means.
		return &AppError{Kind: KindTimeout, Err: err}, false
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
