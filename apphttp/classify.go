package apphttp

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The outcome of a request as a typed error (AppError: Send makes the ones
// of a request that got no answer, ReadAnswer the ones of a status), what an
// outcome means (Classify, the one function that decides it), and the delay
// an app asks for (RetryAfter).

// ErrorKind says how a request to the app failed.
type ErrorKind int

const (
	// KindStatus: the app answered with a status other than 2xx.
	KindStatus ErrorKind = iota + 1
	// KindTimeout: no answer came within the per-request timeout (the
	// request's context ended with context.DeadlineExceeded), wherever it
	// ended: before the request went, while it was written, or while its
	// answer was awaited. The app may have acted.
	KindTimeout
	// KindTransport: a connection was made but the exchange failed (the app
	// dropped the connection, a reset, a malformed answer). The app may have
	// acted.
	KindTransport
	// KindUnreachable: no connection to the app could be made at all
	// (refused, no route, connect timeout). The app never saw the request.
	KindUnreachable
)

// String names the kind as it appears in logs, metrics and dead letters.
func (k ErrorKind) String() string {
	switch k {
	case KindStatus:
		return "status"
	case KindTimeout:
		return "timeout"
	case KindTransport:
		return "transport"
	case KindUnreachable:
		return "unreachable"
	}
	return "unknown"
}

// AppError is the outcome of a request to the app that was not a 2xx. What
// it means is decided by Classify.
type AppError struct {
	Kind ErrorKind
	// Status is the HTTP status for KindStatus, else 0.
	Status int
	// RetryAfter is the app's Retry-After header, unparsed ("" if none).
	RetryAfter string
	// Body is the start of the app's answer, for logs and dead letters.
	Body string
	// Err is the underlying error for the other kinds.
	Err error
}

// Error describes the failure.
func (e *AppError) Error() string {
	switch e.Kind {
	case KindStatus:
		if e.Body != "" {
			return fmt.Sprintf("app answered %d: %s", e.Status, e.Body)
		}
		return fmt.Sprintf("app answered %d", e.Status)
	case KindTimeout:
		return fmt.Sprintf("app timed out: %v", e.Err)
	case KindUnreachable:
		return fmt.Sprintf("app unreachable: %v", e.Err)
	default:
		return fmt.Sprintf("app request failed: %v", e.Err)
	}
}

// Unwrap returns the underlying error.
func (e *AppError) Unwrap() error { return e.Err }

// Class is what courier does with an outcome.
type Class int

const (
	// Success: ack.
	Success Class = iota + 1
	// Transient: retry later (NAK with a delay), dead-letter when the
	// delivery budget is spent.
	Transient
	// Permanent: dead-letter at once.
	Permanent
	// Unavailable: the app is not there; not the message's fault.
	Unavailable
)

// String names the class.
func (c Class) String() string {
	switch c {
	case Success:
		return "success"
	case Transient:
		return "transient"
	case Permanent:
		return "permanent"
	case Unavailable:
		return "unavailable"
	}
	return "unknown"
}

// Classify decides what an outcome of Send and ReadAnswer means. err is nil
// for a 2xx; retryable tells which statuses are transient. This is the one
// place where outcomes are classified.
func Classify(err error, retryable func(status int) bool) Class {
	if err == nil {
		return Success
	}
	var ae *AppError
	if !errors.As(err, &ae) {
		return Transient
	}
	switch ae.Kind {
	case KindStatus:
		if ae.Status >= 200 && ae.Status < 300 {
			return Success
		}
		if retryable(ae.Status) {
			return Transient
		}
		return Permanent
	case KindUnreachable:
		return Unavailable
	default:
		return Transient
	}
}

// RetryAfter parses a Retry-After value, delay-seconds or HTTP-date (RFC
// 9110, section 10.2.3), into a delay from now, capped at max. ok is false
// when v is absent or malformed: delay-seconds is digits only, so a sign
// ("+5", "-3") makes it malformed.
func RetryAfter(v string, now time.Time, max time.Duration) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if allDigits(v) {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs > int64(max/time.Second) {
			return max, true // past int64 too: longer than any cap
		}
		return min(time.Duration(secs)*time.Second, max), true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d = t.Sub(now)
	if d < 0 {
		d = 0
	}
	return min(d, max), true
}

// allDigits reports whether s is one or more ASCII digits.
func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
