package publish

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
)

// noRedirect is a client that reports a redirect instead of following it.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// rawAnswer is an answer as sent: status, headers and body.
type rawAnswer struct {
	status int
	header http.Header
	body   []byte
}

// do sends method url with body and headers (name, value pairs; "Host"
// sets the request's Host), following no redirect.
func do(t *testing.T, method, url, body string, headers ...string) rawAnswer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			req.Host = headers[i+1]
			continue
		}
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return rawAnswer{status: resp.StatusCode, header: resp.Header, body: b}
}

// jsonError is the "error" of a JSON answer, failing the test for an
// answer that is not JSON of that shape.
func (r rawAnswer) jsonError(t *testing.T) string {
	t.Helper()
	var e struct {
		Error *string `json:"error"`
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("answer %d with Content-Type %q, want application/json: %q", r.status, ct, r.body)
		return string(r.body)
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error == nil {
		t.Errorf("answer %d %q: not {\"error\": ...} (%v)", r.status, r.body, err)
		return string(r.body)
	}
	return *e.Error
}

// TestRoutesAnswerJSON: every answer is JSON with its status: an unknown
// path 404, another method 405 with Allow, a publish naming no subject
// 400, a path a client or proxy would rewrite ("." or ".." segments,
// "//") 400, never a redirect; nothing of them is stored.
func TestRoutesAnswerJSON(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{})

	tests := []struct {
		method, path string
		status       int
		want         string // in the error
	}{
		{"GET", PathPrefix + "orders.created", 405, "method GET is not served"},
		{"PUT", PathPrefix + "orders.created", 405, "publish with POST"},
		{"DELETE", BatchPath, 405, "method DELETE"},
		{"GET", BatchPath + "/orders.created", 405, "method GET"},
		{"OPTIONS", PathPrefix + "orders.created", 405, "method OPTIONS"},
		{"GET", "/", 404, "no such path"},
		{"POST", "/v1/other", 404, "no such path"},
		{"POST", "/v1/publish-batches", 404, "no such path"},
		{"POST", "/v1/publishx/orders.created", 404, "no such path"},
		{"POST", "/v1/publish", 400, "no subject: publish with POST /v1/publish/<subject>"},
		{"POST", "/v1/publish/", 400, "no subject: publish with POST /v1/publish/<subject>"},
		{"POST", PathPrefix + "..", 400, `"." or ".." segment`},
		{"POST", PathPrefix + ".", 400, `"." or ".." segment`},
		{"POST", PathPrefix + "orders.x/../y", 400, `"." or ".." segment`},
		{"POST", PathPrefix + "orders.x/./y", 400, `"." or ".." segment`},
		{"POST", PathPrefix + "orders.a//b", 400, "escaped as %2F"},
		{"POST", PathPrefix + "orders.a%2F/./b", 400, `"." or ".." segment`},
		{"POST", BatchPath + "/..", 400, `"." or ".." segment`},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			r := do(t, tt.method, a.url+tt.path, "x")
			if msg := r.jsonError(t); r.status != tt.status || !strings.Contains(msg, tt.want) {
				t.Errorf("answer %d %q, want %d containing %q", r.status, msg, tt.status, tt.want)
			}
			if allow := r.header.Get("Allow"); (tt.status == 405) != (allow == "POST") {
				t.Errorf("Allow %q", allow)
			}
		})
	}
	if n := msgCount(t, js, "ORDERS"); n != 0 {
		t.Errorf("%d messages stored", n)
	}
}

// TestBrowserRefused: without a token, a browser's cross-site request
// (Sec-Fetch-Site, or an Origin that is not the Host) and a request whose
// Host is neither a loopback name nor the listen address (a page's DNS
// rebinding) are refused 403, single or batch, counted forbidden, and
// nothing is stored; a client on the loopback by any of its names, and a
// browser's same-origin request, publish. With a token, the token is
// what admits a request by another name; a cross-site one stays refused.
func TestBrowserRefused(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{})
	_, port, err := net.SplitHostPort(a.srv.Addr())
	if err != nil {
		t.Fatal(err)
	}

	refused := []struct {
		name    string
		headers []string
		want    string
	}{
		{"cross-site", []string{"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"}, "cross-site request"},
		{"same-site, another port", []string{"Sec-Fetch-Site", "same-site", "Origin", "http://127.0.0.1:8080"}, "cross-site request"},
		{"an Origin not the Host (an old browser)", []string{"Origin", "https://evil.example"}, "cross-site request"},
		{"a rebound name", []string{"Host", "evil.example:" + port}, `Host "evil.example:`},
		{"a rebound name without port", []string{"Host", "evil.example"}, "neither a loopback name nor"},
		{"a name that starts like localhost", []string{"Host", "localhost.evil.example:" + port}, "DNS rebinding"},
		{"a name that holds the IP", []string{"Host", "127.0.0.1.nip.io:" + port}, "DNS rebinding"},
		{"a rebound name, same-origin", []string{"Host", "evil.example:" + port, "Sec-Fetch-Site", "same-origin"}, "DNS rebinding"},
	}
	for _, tt := range refused {
		t.Run("refused/"+tt.name, func(t *testing.T) {
			before := a.count(outcomeForbidden)
			r := do(t, "POST", a.url+PathPrefix+"orders.created", "x", tt.headers...)
			if msg := r.jsonError(t); r.status != http.StatusForbidden || !strings.Contains(msg, tt.want) {
				t.Errorf("publish: %d %q, want 403 containing %q", r.status, msg, tt.want)
			}
			r = do(t, "POST", a.url+BatchPath+"/orders.created", `{"entries":[{"data":1}]}`, tt.headers...)
			if msg := r.jsonError(t); r.status != http.StatusForbidden || !strings.Contains(msg, tt.want) {
				t.Errorf("batch: %d %q, want 403 containing %q", r.status, msg, tt.want)
			}
			if got := a.count(outcomeForbidden); got != before+2 {
				t.Errorf("forbidden counted %v, want %v", got, before+2)
			}
		})
	}
	if n := msgCount(t, js, "ORDERS"); n != 0 {
		t.Fatalf("%d messages stored by refused requests", n)
	}

	admitted := []struct {
		name    string
		headers []string
	}{
		{"no Host given (127.0.0.1:port)", nil},
		{"localhost", []string{"Host", "localhost:" + port}},
		{"localhost without port", []string{"Host", "localhost"}},
		{"LOCALHOST", []string{"Host", "LOCALHOST:" + port}},
		{"127.0.0.1 without port", []string{"Host", "127.0.0.1"}},
		{"another loopback IP", []string{"Host", "127.0.0.2:" + port}},
		{"[::1]", []string{"Host", "[::1]:" + port}},
		{"[::1] without port", []string{"Host", "[::1]"}},
		{"a browser's same-origin request", []string{"Sec-Fetch-Site", "same-origin", "Origin", "http://127.0.0.1:" + port}},
		{"a browser's request typed in", []string{"Sec-Fetch-Site", "none"}},
		{"an Origin that is the Host", []string{"Host", "localhost:" + port, "Origin", "http://localhost:" + port}},
	}
	for _, tt := range admitted {
		t.Run("admitted/"+tt.name, func(t *testing.T) {
			if r := do(t, "POST", a.url+PathPrefix+"orders.created", "x", tt.headers...); r.status != http.StatusOK {
				t.Errorf("publish: %d %q", r.status, r.body)
			}
			if r := do(t, "POST", a.url+BatchPath+"/orders.created", `{"entries":[{"data":1}]}`, tt.headers...); r.status != http.StatusOK {
				t.Errorf("batch: %d %q", r.status, r.body)
			}
		})
	}
	if n := msgCount(t, js, "ORDERS"); n != uint64(2*len(admitted)) {
		t.Errorf("%d messages stored, want %d", n, 2*len(admitted))
	}

	// With a token, a client that has it may reach courier by any name
	// (a Service's, in Kubernetes); a browser's cross-site request is
	// refused all the same.
	tok := startAPI(t, srv.ClientURL(), Options{Token: func() string { return "t0ken" }})
	if r := do(t, "POST", tok.url+PathPrefix+"orders.created", "x", "Host", "courier.default.svc:7416", "Authorization", "Bearer t0ken"); r.status != http.StatusOK {
		t.Errorf("with the token, by a Service's name: %d %q", r.status, r.body)
	}
	if r := do(t, "POST", tok.url+PathPrefix+"orders.created", "x", "Host", "courier.default.svc:7416"); r.status != http.StatusUnauthorized {
		t.Errorf("without the token, by a Service's name: %d %q", r.status, r.body)
	}
	if r := do(t, "POST", tok.url+PathPrefix+"orders.created", "x", "Sec-Fetch-Site", "cross-site", "Authorization", "Bearer t0ken"); r.status != http.StatusForbidden {
		t.Errorf("with the token, cross-site: %d %q", r.status, r.body)
	}
}

// TestBrowserRefusedListenAddress: courier listening on every address
// (0.0.0.0:PORT, as in a pod) or on one of the host's own (a pod's IP)
// takes a Host that is that address, or the address the connection
// reached, as a pod's other containers and probes send it; a name is
// still refused.
func TestBrowserRefusedListenAddress(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})

	all := startAPIAt(t, "0.0.0.0:0", srv.ClientURL(), Options{})
	_, port, err := net.SplitHostPort(all.srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	loop := "http://127.0.0.1:" + port
	if r := do(t, "POST", loop+PathPrefix+"orders.created", "x", "Host", "0.0.0.0:"+port); r.status != http.StatusOK {
		t.Errorf("Host the listen address 0.0.0.0: %d %q", r.status, r.body)
	}
	if r := do(t, "POST", loop+PathPrefix+"orders.created", "x", "Host", "evil.example:"+port); r.status != http.StatusForbidden {
		t.Errorf("Host a name, listening on 0.0.0.0: %d %q", r.status, r.body)
	}

	ip := hostIP(t)
	if ip == "" {
		t.Skip("no non-loopback IPv4 address on this host: a pod's IP is not tried")
	}
	byIP := "http://" + net.JoinHostPort(ip, port)
	if r := do(t, "POST", byIP+PathPrefix+"orders.created", "x"); r.status != http.StatusOK {
		t.Errorf("listening on 0.0.0.0, reached at %s with it as Host: %d %q", ip, r.status, r.body)
	}
	if r := do(t, "POST", byIP+PathPrefix+"orders.created", "x", "Host", "evil.example:"+port); r.status != http.StatusForbidden {
		t.Errorf("listening on 0.0.0.0, reached at %s by a name: %d %q", ip, r.status, r.body)
	}
	pod := startAPIAt(t, net.JoinHostPort(ip, "0"), srv.ClientURL(), Options{})
	if r := do(t, "POST", pod.url+PathPrefix+"orders.created", "x"); r.status != http.StatusOK {
		t.Errorf("listening on %s, with it as Host: %d %q", ip, r.status, r.body)
	}
	if r := do(t, "POST", pod.url+PathPrefix+"orders.created", "x", "Host", "evil.example"); r.status != http.StatusForbidden {
		t.Errorf("listening on %s, by a name: %d %q", ip, r.status, r.body)
	}
	if n := msgCount(t, js, "ORDERS"); n != 3 {
		t.Errorf("%d messages stored, want 3", n)
	}
}

// hostIP is a non-loopback IPv4 address of this host, or "" for none.
func hostIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return ""
}

// TestCleanPath: the paths a client or proxy leaves as they are.
func TestCleanPath(t *testing.T) {
	for p, want := range map[string]bool{
		"/v1/publish/orders.created": true,
		"/v1/publish/orders.a/b":     true,
		"/v1/publish/orders.x/":      true,
		"/v1/publish/":               true,
		"/v1/publish/.hidden/x.":     true,
		"/v1/publish/..":             false,
		"/v1/publish/.":              false,
		"/v1/publish/./x":            false,
		"/v1/publish/a/../b":         false,
		"/v1/publish/a/..":           false,
		"/v1/publish//x":             false,
		"/v1/publish/a//":            false,
	} {
		if got := cleanPath(p); got != want {
			t.Errorf("cleanPath(%q) = %v, want %v", p, got, want)
		}
	}
}

// TestPeerOfAnotherHostRefusedWithoutToken: courier listening beyond
// loopback (0.0.0.0, as a pod's other containers may need) without a
// token publishes only for a client on its own host, whatever Host the
// request sends; a client of the network needs the token. A peer on
// another host cannot be made in a test: its request is handed to the
// API as net/http would, with the addresses such a connection has.
func TestPeerOfAnotherHostRefusedWithoutToken(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	open := startAPIAt(t, "0.0.0.0:0", srv.ClientURL(), Options{})
	tok := startAPIAt(t, "0.0.0.0:0", srv.ClientURL(), Options{Token: func() string { return "t0ken" }})

	fromNetwork := func(a *api, headers ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "http://localhost"+PathPrefix+"orders.created", strings.NewReader("x"))
		req.RemoteAddr = "198.51.100.7:40312" // another pod
		req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.ParseIP("192.0.2.2"), Port: 7416}))
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		rec := httptest.NewRecorder()
		a.srv.route(rec, req)
		return rec
	}
	for _, host := range []string{"localhost", "127.0.0.1:7416", "192.0.2.2:7416", "0.0.0.0"} {
		rec := fromNetwork(open, "Host", host)
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "COURIER_APP_TOKEN_FILE") {
			t.Errorf("without a token, from another host with Host %q: %d %s, want 403 naming the token", host, rec.Code, rec.Body)
		}
	}
	for _, batch := range []bool{false, true} {
		path := PathPrefix + "orders.created"
		if batch {
			path = BatchPath + "/orders.created"
		}
		req := httptest.NewRequest(http.MethodPost, "http://localhost"+path, strings.NewReader(`{"entries":[{"data":1}]}`))
		req.RemoteAddr = "[2001:db8::7]:40312"
		rec := httptest.NewRecorder()
		open.srv.route(rec, req)
		if rec.Code != http.StatusForbidden {
			t.Errorf("without a token, a batch %v from another host: %d %s, want 403", batch, rec.Code, rec.Body)
		}
	}
	if rec := fromNetwork(tok, "Authorization", "Bearer t0ken"); rec.Code != http.StatusOK {
		t.Errorf("with the token, from another host: %d %s, want 200", rec.Code, rec.Body)
	}
	if rec := fromNetwork(tok); rec.Code != http.StatusUnauthorized {
		t.Errorf("without the token, from another host, token asked for: %d %s, want 401", rec.Code, rec.Body)
	}
	// The same pod, by loopback or by the pod's own address: admitted.
	_, port, _ := net.SplitHostPort(open.srv.Addr())
	if r := do(t, "POST", "http://127.0.0.1:"+port+PathPrefix+"orders.created", "x", "Host", "localhost"); r.status != http.StatusOK {
		t.Errorf("from loopback: %d %q", r.status, r.body)
	}
	if ip := hostIP(t); ip != "" {
		if r := do(t, "POST", "http://"+net.JoinHostPort(ip, port)+PathPrefix+"orders.created", "x"); r.status != http.StatusOK {
			t.Errorf("from this host's own address %s: %d %q", ip, r.status, r.body)
		}
	}
	if n := msgCount(t, js, "ORDERS"); n < 2 {
		t.Errorf("%d messages stored, want those of the admitted requests", n)
	}
}
