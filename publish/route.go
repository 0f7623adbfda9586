package publish

// What a request meets before a publish is decided: the paths and the
// method the API serves, every other request answered in JSON (never a
// redirect, never net/http's text), and who may publish at all: the token
// when one is asked for, and never a browser page.

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// allowPost is the Allow header of a 405: the API serves POST alone.
var allowPost = []string{http.MethodPost}

// route is the API's handler. It routes by the unescaped path, as
// net/http's ServeMux would, but answers what the mux answers in text (an
// unknown path, another method) in JSON, and refuses what the mux would
// redirect to a cleaned path: a client that follows a 307 publishes to a
// subject it did not send.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if id, ok := strings.CutPrefix(r.URL.Path, SchedulesPath); ok {
		s.serveCancel(w, r, id) // cancel.go
		return
	}
	batch, subj, ok := apiPath(r.URL.Path)
	switch {
	case !ok:
		s.answer(w, result{status: http.StatusNotFound,
			msg: fmt.Sprintf("no such path %q: the publish API serves POST %s<subject>, POST %s[/<subject>] and DELETE %s<id>", r.URL.Path, PathPrefix, BatchPath, SchedulesPath)})
		return
	case r.Method != http.MethodPost:
		w.Header()["Allow"] = allowPost
		s.answer(w, result{status: http.StatusMethodNotAllowed,
			msg: fmt.Sprintf("method %s is not served: publish with POST", r.Method)})
		return
	}
	p := r.URL.Path
	if r.URL.RawPath != "" { // escaped otherwise than Path would be
		p = r.URL.EscapedPath()
	}
	if !cleanPath(p) {
		s.refuseRequest(w, r, time.Now(), uncleanPath(p))
		return
	}
	if batch {
		s.serveBatch(w, r, subj)
	} else {
		s.servePublish(w, r, subj)
	}
}

// apiPath reads a request's (unescaped) path: a batch or not, and the
// subject the path names (the rest of the path, '/' included, "" for
// none). ok is false for a path the API does not serve.
func apiPath(path string) (batch bool, subj string, ok bool) {
	if subj, ok := strings.CutPrefix(path, PathPrefix); ok {
		return false, subj, true
	}
	if subj, ok := strings.CutPrefix(path, BatchPath); ok && (subj == "" || subj[0] == '/') {
		return true, strings.TrimPrefix(subj, "/"), true
	}
	// PathPrefix without its slash: a publish that names no subject,
	// answered as one (400) rather than as a path unknown.
	return false, "", path == PathPrefix[:len(PathPrefix)-1]
}

// cleanPath reports whether an escaped path is one net/http's ServeMux
// and RFC 3986's dot-segment removal leave as it is: no "." or ".."
// segment and no empty one but the last. A client or proxy may rewrite
// any other before it reaches courier, so the subject it names is not
// surely the one sent.
func cleanPath(p string) bool {
	if !strings.Contains(p, "/.") && !strings.Contains(p, "//") {
		return true // the usual path, decided without splitting
	}
	rest := strings.TrimPrefix(p, "/")
	for rest != "" {
		seg, after, more := strings.Cut(rest, "/")
		if seg == "." || seg == ".." || (seg == "" && more) {
			return false
		}
		rest = after
	}
	return true
}

// uncleanPath is the refusal of a path cleanPath refuses.
func uncleanPath(p string) result {
	return fail(refuse(http.StatusBadRequest, outcomeInvalid,
		`the path %q has an empty, "." or ".." segment, which HTTP clients and proxies rewrite: send the subject as it is, a '/' in it escaped as %%2F`, p))
}

// refuseRequest answers a request refused before anything of it was
// published, counts it and logs why.
func (s *Server) refuseRequest(w http.ResponseWriter, r *http.Request, start time.Time, res result) {
	s.answer(w, res)
	s.m.observe(res.outcome, time.Since(start).Seconds())
	if s.log.Enabled(r.Context(), slog.LevelDebug) {
		s.log.Debug("publish refused", "path", r.URL.Path, "status", res.status, "outcome", res.outcome, "reason", res.msg)
	}
}

// admit decides whether a request may publish at all, whatever it
// publishes: never a browser page's cross-site request (403); with a
// token asked for, only a request carrying it (401); without one, only a
// request from this host (localPeer) whose Host names this courier as a
// local client does (403).
//
// Without a token nothing tells one caller from another: courier bound to
// every interface (0.0.0.0, as a pod's other containers may need) would
// publish for any peer of the network that sends an acceptable Host, an
// app in another pod included. So only a peer of this host (this pod's
// network namespace) is admitted; others need the token.
//
// A page open in a browser on a host where courier runs can reach courier
// at localhost, so without a token any page could publish through it. A
// cross-site request says so in Sec-Fetch-Site or Origin, which
// net/http's CrossOriginProtection reads; a page that rebinds its own name
// to 127.0.0.1 (DNS rebinding) makes a same-origin request, but under its
// own name in Host, which hostAllowed refuses. A client that is not a
// browser (curl, an SDK, a server-side fetch) sends neither header, and
// the Host it was given.
func (s *Server) admit(r *http.Request) *result {
	if err := s.crossOrigin.Check(r); err != nil {
		return &result{status: http.StatusForbidden, outcome: outcomeForbidden,
			msg: "a browser's cross-site request cannot publish (" + err.Error() + ")"}
	}
	want := ""
	if s.o.Token != nil {
		want = s.o.Token()
	}
	if want != "" {
		if !bearer(r, want) {
			return &result{status: http.StatusUnauthorized, outcome: outcomeUnauthorized, msg: "a bearer token is required: Authorization: Bearer <token>"}
		}
		// A page cannot know the token, whatever name it reached courier
		// by; and apps in other pods may reach a courier that asks for
		// one by its Service's name.
		return nil
	}
	if !localPeer(r) {
		return &result{status: http.StatusForbidden, outcome: outcomeForbidden,
			msg: fmt.Sprintf("without a token only a client on courier's own host (in its pod) may publish, and %s is not one: ask for a token (COURIER_APP_TOKEN_FILE) to admit clients of the network", r.RemoteAddr)}
	}
	if !s.hostAllowed(r) {
		return &result{status: http.StatusForbidden, outcome: outcomeForbidden,
			msg: fmt.Sprintf("Host %q is neither a loopback name nor courier's listen address, as a browser page's DNS rebinding would send: reach courier at localhost, or ask for a token (COURIER_APP_TOKEN_FILE) to publish by another name", r.Host)}
	}
	return nil
}

// bearer reports whether the request carries the token want. Both sides
// are hashed first, so that the comparison takes the same time whatever
// the token's length.
func bearer(r *http.Request, want string) bool {
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	a, b := sha256.Sum256([]byte(strings.TrimSpace(got))), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// hostAllowed reports whether a request's Host names courier as a client
// on its own host or in its own pod does: a loopback name (localhost,
// 127.0.0.1, [::1]), the host of the listen address, or the IP the
// connection reached; any port.
//
// In Kubernetes the app in courier's pod reaches it at localhost or
// 127.0.0.1. Courier listening on 0.0.0.0:PORT or on the pod's IP
// (COURIER_PUBLISH_ADDR) may also be reached at that address, which is
// then the Host: the listen host itself, or the pod's IP the connection
// arrived on. Taking either is safe: a DNS rebinding page sends its own
// name as Host, never an IP (the attack is that name resolving to
// courier's address), and a page served from the same IP on another port
// makes a same-site request, not a same-origin one, which admit refuses.
// A Service's name is not taken: a courier that apps in other pods reach
// by name asks for a token, which admits them by any name.
func (s *Server) hostAllowed(r *http.Request) bool {
	if r.Host == "" {
		return true // HTTP/1.0 without Host: a browser always sends one
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	if strings.EqualFold(host, "localhost") || (s.listenName != "" && strings.EqualFold(host, s.listenName)) {
		return true
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	ip = ip.Unmap()
	if ip.IsLoopback() || ip == s.listenIP {
		return true
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
	return ok && local.AddrPort().Addr().Unmap().WithZone("") == ip.WithZone("")
}

// localPeer reports whether a request came from this host: from a
// loopback address, or from the very address it reached (a connection to
// one of the host's own addresses gets that address as its source), as a
// client in the same pod connecting to the pod's IP does.
func localPeer(r *http.Request) bool {
	remote, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := remote.Addr().Unmap().WithZone("")
	if ip.IsLoopback() {
		return true
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
	return ok && local.AddrPort().Addr().Unmap().WithZone("") == ip
}
