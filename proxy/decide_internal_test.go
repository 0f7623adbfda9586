package proxy

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/batch"
	"github.com/courierhq/courier/dlq"
)

// The ending an answer makes of a delivery, as decide reaches it: the
// answer classified (classify), its Retry-After read once, then endingOf.
func TestEndingOf(t *testing.T) {
	status := func(code int, retryAfter string) error {
		return &apphttp.AppError{Kind: apphttp.KindStatus, Status: code, RetryAfter: retryAfter}
	}
	unreachable := &apphttp.AppError{Kind: apphttp.KindUnreachable, Err: errors.New("connection refused")}
	timeout := &apphttp.AppError{Kind: apphttp.KindTimeout, Err: errors.New("deadline")}
	retryable := func(code int) bool { return code == http.StatusTooManyRequests || code >= 500 }
	for _, tc := range []struct {
		name        string
		err         error
		last, probe bool
		kind        endKind
		reason      string        // a dead letter's
		why         string        // a hold's
		retryAfter  time.Duration // a retry's, from the app
	}{
		{name: "2xx", kind: endSucceeded},
		{name: "2xx on the last delivery, as the probe", last: true, probe: true, kind: endSucceeded},
		{name: "503", err: status(503, ""), kind: endRetry},
		{name: "503 with Retry-After", err: status(503, "7"), kind: endRetry, retryAfter: 7 * time.Second},
		{name: "429 with a Retry-After over the cap", err: status(429, "3600"), kind: endRetry, retryAfter: time.Minute},
		{name: "503 with a malformed Retry-After", err: status(503, "soon"), kind: endRetry},
		{name: "timeout", err: timeout, kind: endRetry},
		{name: "a transport failure", err: errors.New("reset"), kind: endRetry},
		{name: "503 on the last delivery", err: status(503, "7"), last: true, kind: endDeadLetter, reason: dlq.ReasonExhausted},
		{name: "503 on the last delivery, as the probe", err: status(503, ""), last: true, probe: true, kind: endHeld, why: "the breaker was open"},
		{name: "503 as the probe", err: status(503, ""), probe: true, kind: endRetry},
		{name: "400", err: status(400, ""), kind: endDeadLetter, reason: dlq.ReasonRejected},
		{name: "400 on the last delivery, as the probe", err: status(400, ""), last: true, probe: true, kind: endDeadLetter, reason: dlq.ReasonRejected},
		{name: "unreachable", err: unreachable, kind: endHeld, why: "the app was unavailable"},
		{name: "unreachable on the last delivery", err: unreachable, last: true, kind: endHeld, why: "the app was unavailable"},
		{name: "a batch entry to retry", err: &entryError{status: batch.Retry, app: status(503, "2").(*apphttp.AppError)}, kind: endRetry, retryAfter: 2 * time.Second},
		{name: "a batch entry dropped", err: &entryError{status: batch.Drop, app: status(200, "").(*apphttp.AppError)}, kind: endDeadLetter, reason: dlq.ReasonRejected},
		{name: "a batch refused whole", err: &splitError{err: status(400, ""), entries: 2}, kind: endRetry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			took := 3 * time.Millisecond
			answer := &apphttp.Answer{Status: 200}
			res := result{answer: answer, took: took, err: tc.err}
			retryAfter, fromApp := apphttp.RetryAfter(retryAfterOf(tc.err), time.Now(), time.Minute)
			e := endingOf(classify(tc.err, retryable), res, retryAfter, fromApp, tc.last, tc.probe)
			if e.kind != tc.kind {
				t.Fatalf("ending %s, want %s", e.kind, tc.kind)
			}
			switch e.kind {
			case endSucceeded:
				if e.answer != answer || e.took != took {
					t.Errorf("succeeded with %v after %v, want the answer after %v", e.answer, e.took, took)
				}
			case endRetry:
				if e.err != tc.err || e.fromApp != (tc.retryAfter > 0) || e.retryAfter != tc.retryAfter {
					t.Errorf("retry %v after %v (from the app: %v), want %v after %v", e.err, e.retryAfter, e.fromApp, tc.err, tc.retryAfter)
				}
			case endDeadLetter:
				if e.f.reason != tc.reason || e.f.err != tc.err {
					t.Errorf("dead letter %q (%v), want %q (%v)", e.f.reason, e.f.err, tc.reason, tc.err)
				}
			case endHeld:
				if e.why != tc.why {
					t.Errorf("held while %q, want %q", e.why, tc.why)
				}
			}
		})
	}
}

// A request the end of the grace period cut short spends the attempt: on
// the last delivery it is dead-lettered as exhausted, else given back at
// once.
func TestAbandoned(t *testing.T) {
	err := errors.New("context canceled")
	if e := abandoned(err, true); e.kind != endDeadLetter || e.f.reason != dlq.ReasonExhausted || !errors.Is(e.f.err, err) {
		t.Errorf("on the last delivery: %s %q %v, want a dead letter, exhausted, wrapping %v", e.kind, e.f.reason, e.f.err, err)
	}
	if e := abandoned(err, false); e.kind != endGiveBack || e.back != giveBackNow {
		t.Errorf("before the last delivery: %s (mode %d), want given back now", e.kind, e.back)
	}
}
