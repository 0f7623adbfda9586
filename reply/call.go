package reply

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/courierhq/courier/apphttp"
)

// Outcomes of a request, as the metrics label them.
const (
	outcome2xx         = "2xx"
	outcome3xx         = "3xx"
	outcome4xx         = "4xx"
	outcome5xx         = "5xx"
	outcomeTimeout     = "timeout"     // 504: no answer within the timeout
	outcomeUnavailable = "unavailable" // 503: no connection to the app could be made
	outcomeTransport   = "transport"   // 502: the connection failed before a whole answer
	outcomeTooLarge    = "too_large"   // 502: the answer does not fit in a NATS message
	outcomeStopping    = "stopping"    // 503: courier is stopping
	outcomeBusy        = "busy"        // 503: every slot taken and no room to wait, or waited past the timeout
	outcomeNoReply     = "no_reply"    // a message without a reply subject: ignored
)

// answer is what a request is replied with: the app's answer, or courier's
// error reply when there is none to pass on.
type answer struct {
	outcome string
	// status is the app's HTTP status, sent as Courier-Status; 0 when the
	// app gave none (timeout, unreachable, connection failed).
	status int
	// code and desc, when code is not 0, are sent as micro's
	// Nats-Service-Error-Code and Nats-Service-Error.
	code int
	desc string
	// header and body are the app's answer.
	header nats.Header
	body   []byte
	// err says why courier answered for the app, for the logs.
	err error
}

// message is the reply to send to the reply subject.
func (a answer) message(reply string) *nats.Msg {
	h := make(nats.Header, len(a.header)+3)
	for k, vs := range a.header {
		h[k] = vs
	}
	if a.status != 0 {
		h.Set(HeaderStatus, strconv.Itoa(a.status))
	}
	if a.code != 0 {
		h.Set(micro.ErrorCodeHeader, strconv.Itoa(a.code))
		h.Set(micro.ErrorHeader, a.desc)
	}
	return &nats.Msg{Subject: reply, Header: h, Data: a.body}
}

// call POSTs one request to the app and reads its answer, at most maxPayload
// bytes of body: an answer larger than that could not be sent as a reply.
func call(ctx context.Context, app *apphttp.Endpoint, h http.Header, body []byte, maxPayload int64, timeout time.Duration) answer {
	resp, err := app.Send(ctx, h, body)
	if err != nil {
		return failed(err, timeout)
	}
	defer resp.Body.Close()
	if resp.ContentLength > maxPayload {
		return tooLargeAnswer(resp.StatusCode, maxPayload)
	}
	var buf bytes.Buffer
	if resp.ContentLength > 0 {
		buf.Grow(int(resp.ContentLength))
	}
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, maxPayload+1)); err != nil {
		// The answer was cut short: by the timeout, or by the connection.
		kind := apphttp.KindTransport
		if ctx.Err() != nil || isTimeout(err) {
			kind = apphttp.KindTimeout
		}
		return failed(&apphttp.AppError{Kind: kind, Err: fmt.Errorf("reading the answer: %w", err)}, timeout)
	}
	if int64(buf.Len()) > maxPayload {
		return tooLargeAnswer(resp.StatusCode, maxPayload)
	}
	a := answer{
		outcome: statusOutcome(resp.StatusCode),
		status:  resp.StatusCode,
		header:  replyHeaders(resp.Header),
		body:    buf.Bytes(),
	}
	if a.status < 200 || a.status > 299 {
		a.code = a.status
		a.desc = http.StatusText(a.status)
		if a.desc == "" {
			a.desc = "app answered " + strconv.Itoa(a.status)
		}
	}
	return a
}

func statusOutcome(status int) string {
	switch {
	case status < 300:
		return outcome2xx
	case status < 400:
		return outcome3xx
	case status < 500:
		return outcome4xx
	}
	return outcome5xx
}

// failed is the error reply for a request the app gave no answer to. The
// description is short and fixed: the error itself, which may name internal
// addresses, goes to the logs only.
func failed(err error, timeout time.Duration) answer {
	var ae *apphttp.AppError
	kind := apphttp.KindTransport
	if errors.As(err, &ae) {
		kind = ae.Kind
	}
	switch kind {
	case apphttp.KindTimeout:
		return answer{outcome: outcomeTimeout, code: http.StatusGatewayTimeout,
			desc: "app did not answer within " + timeout.String(), err: err}
	case apphttp.KindUnreachable:
		return answer{outcome: outcomeUnavailable, code: http.StatusServiceUnavailable,
			desc: "app unreachable", err: err}
	}
	return answer{outcome: outcomeTransport, code: http.StatusBadGateway,
		desc: "app connection failed before a whole answer", err: err}
}

// tooLargeAnswer is the error reply for an answer that cannot be sent in one
// NATS message; Courier-Status still says what the app answered.
func tooLargeAnswer(status int, maxPayload int64) answer {
	return answer{outcome: outcomeTooLarge, status: status, code: http.StatusBadGateway,
		desc: fmt.Sprintf("app answer too large for a NATS reply (max_payload %d bytes)", maxPayload),
		err:  fmt.Errorf("app answered %d with more than max_payload (%d bytes)", status, maxPayload)}
}

// stoppingAnswer is the error reply for a request courier will not finish
// because it is stopping.
func stoppingAnswer() answer {
	return answer{outcome: outcomeStopping, code: http.StatusServiceUnavailable,
		desc: "courier is stopping", err: errors.New("courier is stopping")}
}

// busyAnswer is the reply to a request that found inflight requests at the
// app and waiting others waiting for a slot, as many as may wait.
func busyAnswer(inflight, waiting int) answer {
	desc := fmt.Sprintf("courier busy: %d requests at the app and %d waiting; try again", inflight, waiting)
	return answer{outcome: outcomeBusy, code: http.StatusServiceUnavailable, desc: desc, err: errors.New(desc)}
}

// lateAnswer is the reply to a request that waited for a slot longer than
// the timeout: 503 busy, as a request that found no room to wait, so that
// its caller (if still there) can try again elsewhere.
func lateAnswer(waited, timeout time.Duration) answer {
	desc := fmt.Sprintf("courier busy: the request waited %s for a slot, longer than the %s timeout, and was not sent to the app; try again",
		waited.Round(time.Millisecond), timeout)
	return answer{outcome: outcomeBusy, code: http.StatusServiceUnavailable, desc: desc, err: errors.New(desc)}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
