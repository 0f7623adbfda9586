package publish

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The outcomes of a publish, as courier_publish_requests_total counts them.
const (
	outcomeStored       = "stored"             // 200: acknowledged, stored now
	outcomeScheduled    = "scheduled"          // 202: acknowledged, stored as a schedule to deliver later
	outcomeDuplicate    = "duplicate"          // 200: acknowledged as a duplicate of a message stored earlier
	outcomeUnauthorized = "unauthorized"       // 401: no or wrong bearer token
	outcomeForbidden    = "forbidden"          // 403: subject outside the allowed ones
	outcomeInvalid      = "invalid"            // 400: invalid subject or headers, refused by JetStream as bad
	outcomeNoStream     = "no_stream"          // 404: no stream captures the subject
	outcomeTooLarge     = "too_large"          // 413: over max_payload or the stream's limit
	outcomeExpectation  = "expectation_failed" // 412: a Nats-Expected-* header did not hold
	outcomeNoSchedules  = "no_schedules"       // 409: a delayed publish to a stream that cannot hold schedules
	outcomeUnavailable  = "unavailable"        // 503: no acknowledgement in time
	outcomeBusy         = "busy"               // 503: MaxConcurrent publishes in progress
	outcomeCanceled     = "canceled"           // the caller went away before the answer
)

// outcomes lists every outcome, so that each series exists from start-up.
var outcomes = [...]string{outcomeStored, outcomeScheduled, outcomeDuplicate, outcomeUnauthorized, outcomeForbidden, outcomeInvalid,
	outcomeNoStream, outcomeTooLarge, outcomeExpectation, outcomeNoSchedules, outcomeUnavailable, outcomeBusy, outcomeCanceled}

// The JetStream API errors a publish can meet (nats-server
// server/errors.json), decided by code, never by text.
const (
	errStreamNotMatch          jetstream.ErrorCode = 10060 // Nats-Expected-Stream
	errStreamSequenceNotMatch  jetstream.ErrorCode = 10063
	errWrongLastMsgID          jetstream.ErrorCode = 10070 // Nats-Expected-Last-Msg-Id
	errWrongLastSequence       jetstream.ErrorCode = 10071 // Nats-Expected-Last-(Subject-)Sequence
	errWrongLastSequenceConst  jetstream.ErrorCode = 10164
	errMinLastSequence         jetstream.ErrorCode = 10180
	errMessageExceedsMaximum   jetstream.ErrorCode = 10054 // the stream's MaxMsgSize
	errHeaderExceedsMaximum    jetstream.ErrorCode = 10097 // headers over 64 KiB
	errClusterNotAvailable     jetstream.ErrorCode = 10008 // no quorum, no leader yet
	errDuplicateInProcess      jetstream.ErrorCode = 10158 // the same Nats-Msg-Id is being stored now
	errExpectedLastSeqNotReady jetstream.ErrorCode = 10163
)

// errNotConnected is an attempt not made: the connection is down and
// reconnecting. A publish written to nats.go's reconnect buffer would be
// sent after this request may have given up.
var errNotConnected = errors.New("not connected to NATS")

// transient is a failed attempt that another may fix.
type transient struct{ err error }

func (t *transient) Error() string { return t.err.Error() }
func (t *transient) Unwrap() error { return t.err }

// classify decides what a failed publish attempt means: a *refusal for
// good, or a *transient to retry. noStream tells whether a stream
// captures the subject, asked only when the server said no one answered.
func classify(ctx context.Context, err error, noStream func(ctx context.Context) (bool, error)) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr):
		return classifyAPI(apiErr)
	case errors.Is(err, nats.ErrBadHeaderMsg), errors.Is(err, nats.ErrBadSubject):
		// nats.go refuses the message itself before sending it, as it
		// will at every attempt (a header name or subject it cannot
		// write): a request that can never succeed, not a moment's.
		return refuse(http.StatusBadRequest, outcomeInvalid, "NATS cannot carry the message as it is: %v", err)
	case errors.Is(err, nats.ErrMaxPayload):
		return refuse(http.StatusRequestEntityTooLarge, outcomeTooLarge, "the message is larger than the server's max_payload, headers included")
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		// No stream listened on the subject: none captures it, or its
		// leader is being elected (a moment without a subscriber).
		none, lerr := noStream(ctx)
		if lerr == nil && none {
			return refuse(http.StatusNotFound, outcomeNoStream, "no stream captures the subject")
		}
		return &transient{fmt.Errorf("no stream answered (leader election?): %w", err)}
	case errors.Is(err, nats.ErrConnectionClosed):
		return refuse(http.StatusServiceUnavailable, outcomeUnavailable, "the NATS connection is closed")
	}
	return &transient{err}
}

// classifyAPI maps a JetStream API error: expectations to 412, sizes to 413,
// what a moment may fix (no quorum, an election, a full stream a consumer
// may drain) to another attempt, other requests the server calls bad to 400.
func classifyAPI(e *jetstream.APIError) error {
	err := classifyCode(e)
	var ref *refusal
	if errors.As(err, &ref) {
		ref.code = e.ErrorCode
	}
	return err
}

func classifyCode(e *jetstream.APIError) error {
	switch e.ErrorCode {
	case errStreamNotMatch, errStreamSequenceNotMatch, errWrongLastMsgID, errWrongLastSequence,
		errWrongLastSequenceConst, errMinLastSequence:
		return refuse(http.StatusPreconditionFailed, outcomeExpectation, "expectation failed: %s", e.Description)
	case errMessageExceedsMaximum, errHeaderExceedsMaximum:
		return refuse(http.StatusRequestEntityTooLarge, outcomeTooLarge, "refused by the stream: %s", e.Description)
	case errClusterNotAvailable, errDuplicateInProcess, errExpectedLastSeqNotReady:
		return &transient{e}
	}
	if e.Code >= 400 && e.Code < 500 {
		return refuse(http.StatusBadRequest, outcomeInvalid, "refused by JetStream: %s (error %d)", e.Description, e.ErrorCode)
	}
	return &transient{e}
}
