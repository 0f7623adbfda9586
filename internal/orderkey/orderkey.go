// Package orderkey reads COURIER_ORDER_KEY, which names the part of a
// message that orders it: "subject:N", the subject's N-th token (1-based),
// or "header:NAME", a header's value. config checks the setting with Parse;
// the delivery loop calls the Key it returns on every message.
package orderkey

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/internal/natshdr"
)

// Key returns a message's ordering key, and false when the message has none
// (no such token or header, or an empty one): such a message is not
// ordered. Safe for concurrent use.
type Key func(subject string, h nats.Header) (string, bool)

// Parse reads a COURIER_ORDER_KEY value.
func Parse(spec string) (Key, error) {
	kind, arg, ok := strings.Cut(spec, ":")
	if !ok {
		return nil, errors.New(`must be "subject:N" (the subject's N-th token) or "header:NAME"`)
	}
	switch strings.ToLower(kind) {
	case "subject":
		n, err := strconv.Atoi(arg)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("subject:%s: the token's position must be a whole number from 1", arg)
		}
		return subjectToken(n), nil
	case "header":
		if !validHeader(arg) {
			return nil, fmt.Errorf("header:%s: not a header name (letters, digits and -_.)", arg)
		}
		return func(_ string, h nats.Header) (string, bool) {
			v := natshdr.Get(h, arg)
			return v, v != ""
		}, nil
	}
	return nil, fmt.Errorf(`%q: the key is "subject:N" or "header:NAME"`, kind)
}

// SubjectToken returns N of a "subject:N" spec, and false for any other (a
// header key, or a spec Parse refuses): the server can partition a durable
// by a subject token, never by a header.
func SubjectToken(spec string) (int, bool) {
	kind, arg, ok := strings.Cut(spec, ":")
	if !ok || !strings.EqualFold(kind, "subject") {
		return 0, false
	}
	n, err := strconv.Atoi(arg)
	return n, err == nil && n >= 1
}

// subjectToken is the Key of the n-th token of the subject.
func subjectToken(n int) Key {
	return func(subject string, _ nats.Header) (string, bool) {
		for i := 1; ; i++ {
			tok, rest, more := strings.Cut(subject, ".")
			if i == n {
				return tok, tok != ""
			}
			if !more {
				return "", false
			}
			subject = rest
		}
	}
}

func validHeader(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}
