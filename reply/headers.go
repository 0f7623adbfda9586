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
	if dropped := apphttp.AppHeaders(h, src, true); len(dropped) > 0 {
		s.drop(req.Subject(), dropped)
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

// drop counts each dropped header value and logs one line per reason: a
// request is its sender's to fill with thousands of values HTTP cannot
// carry, which must not become as many lines.
func (s *Service) drop(subject string, dropped []apphttp.DroppedHeader) {
	s.m.dropped.Add(float64(len(dropped)))
	for _, k := range apphttp.DroppedKinds(dropped) {
		s.log.Warn("headers not passed to the app", "subject", subject, "reason", k.Reason,
			"headers", strings.Join(k.Names, ","), "more_headers", k.More, "values", k.Values)
	}
}

// replyHeaders returns the app's response headers to send on the reply: not
// HTTP's hop-by-hop or framing ones (or any the Connection header names),
// not Nats-* ones (the app's answer must not pose as NATS's or micro's own,
// such as the service error headers), not Courier-Status (courier's), not
// Set-Cookie: no NATS client keeps cookies, and a session a web framework
// opens for every request would only travel on NATS as a credential.
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
		case hop[name], hopByHop(name), name == HeaderStatus, name == "Set-Cookie",
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
