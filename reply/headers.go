package reply

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/courierhq/courier/apphttp"
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
	for _, d := range apphttp.AppHeaders(h, src, true) {
		s.drop(req.Subject(), d.Name, d.Reason)
	}
	// NATS allows control characters in a subject; HTTP does not in a value.
	if subj := req.Subject(); apphttp.ValidFieldValue(subj) {
		h.Set(apphttp.HeaderSubject, subj)
	} else {
		h.Set(apphttp.HeaderSubject, strconv.Quote(subj))
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
