package reply

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// HeaderStatus carries the app's HTTP status on a reply (the name the dead
// letters and success records use too). An error reply courier makes when
// the app gave no answer (timeout, unreachable) has none.
const HeaderStatus = "Courier-Status"

// requestHeaders returns the HTTP headers for a request: its application
// headers as a stream message's are carried (not NATS's own Nats-* headers;
// names or values HTTP cannot carry dropped, counted and logged), its subject
// as Courier-Subject, and its Content-Type or application/octet-stream.
func (s *Service) requestHeaders(req micro.Request) http.Header {
	src := nats.Header(req.Headers())
	h := make(http.Header, len(src)+2)
	for name, vs := range src {
		if len(name) >= 5 && strings.EqualFold(name[:5], "Nats-") {
			continue
		}
		reason := ""
		canon := http.CanonicalHeaderKey(name)
		switch {
		case !validFieldName(name):
			reason = "not a valid HTTP header name"
		case reserved(canon):
			reason = "reserved for courier or HTTP"
		}
		for _, v := range vs {
			if reason == "" && !validFieldValue(v) {
				s.drop(req.Subject(), name, "value not valid in HTTP")
				continue
			}
			if reason == "" {
				h[canon] = append(h[canon], v)
			}
		}
		if reason != "" {
			s.drop(req.Subject(), name, reason)
		}
	}
	// NATS allows control characters in a subject; HTTP does not in a value.
	if subj := req.Subject(); validFieldValue(subj) {
		h.Set(headerSubject, subj)
	} else {
		h.Set(headerSubject, strconv.Quote(subj))
	}
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/octet-stream")
	}
	return h
}

func (s *Service) drop(subject, name, reason string) {
	s.m.dropped.Inc()
	s.log.Warn("header not passed to the app", "subject", subject, "header", name, "reason", reason)
}

// headerSubject names the subject a request came on, as for a stream
// message (proxy.HeaderSubject).
const headerSubject = "Courier-Subject"

// reserved: courier's own request headers, which a caller's copy must not be
// mistaken for, and HTTP's framing ones, which the transport writes itself.
func reserved(canon string) bool {
	switch canon {
	case "Courier-Attempt", "Courier-Subject", "Courier-Stream", "Courier-Sequence", "Courier-Published",
		"Content-Length", "Transfer-Encoding", "Host", "Connection", "Te", "Trailer", "Upgrade",
		"Keep-Alive", "Proxy-Connection":
		return true
	}
	return false
}

// replyHeaders returns the app's response headers to send on the reply: not
// HTTP's hop-by-hop or framing ones (or any the Connection header names),
// not Nats-* ones (the app's answer must not pose as NATS's or micro's own,
// such as the service error headers), not Courier-Status (courier's).
func replyHeaders(src http.Header) nats.Header {
	if len(src) == 0 {
		return nil
	}
	hop := map[string]bool{}
	for _, v := range src.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				hop[http.CanonicalHeaderKey(f)] = true
			}
		}
	}
	h := make(nats.Header, len(src))
	for name, vs := range src {
		switch {
		case hop[name], hopByHop(name), name == HeaderStatus,
			len(name) >= 5 && strings.EqualFold(name[:5], "Nats-"):
			continue
		}
		h[name] = vs
	}
	return h
}

func hopByHop(canon string) bool {
	switch canon {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length":
		return true
	}
	return false
}

// validFieldName reports whether s is an HTTP token (RFC 9110 section 5.1).
//
// TODO(lead): proxy has the same check unexported; exporting
// proxy.AppHeaders(nats.Header) (http.Header, []proxy.DroppedHeader), the
// application-header half of BuildHeaders, would remove this copy.
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			continue
		}
		if strings.IndexByte("!#$%&'*+-.^_`|~", c) < 0 {
			return false
		}
	}
	return true
}

// validFieldValue reports whether s can be sent as an HTTP field value: no
// control characters but horizontal tab (RFC 9110 section 5.5).
func validFieldValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
