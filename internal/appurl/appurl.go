// Package appurl reads the URLs courier sends requests to (COURIER_APP_URL,
// COURIER_APP_HEALTH_URL, COURIER_REPLY_URL), written once for the config
// check and the HTTP client: an http or https URL, or a Unix socket.
//
// A Unix socket is named as nginx's proxy_pass names one: unix:// and the
// socket's absolute path, then optionally ':' and the request's path and
// query. unix:///run/app/app.sock sends to "/" on the socket;
// unix:///run/app/app.sock:/messages?v=2 sends to "/messages?v=2". A socket
// path holding ':' cannot be named.
//
// Requests to a socket are HTTP/1.1 with the Host header "localhost". Their
// URL, as the client sees it, is an http URL whose host stands for the
// socket (SocketHost); a dialer made with Dial connects such a host to its
// socket and every other address over the network asked.
// It imports nothing of courier's.
package appurl

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Example is a URL to show in errors.
const Example = "http://127.0.0.1:8080/messages or unix:///run/app/app.sock:/messages"

// socketSuffix ends the host standing for a socket: a name no resolver
// answers (.invalid is reserved for that), so a request to it can only go
// through Dial.
const socketSuffix = ".sock.invalid"

// Target is where requests to one URL go.
type Target struct {
	// URL is the request URL: the URL given, or for a socket an http URL
	// whose host is SocketHost(Socket).
	URL *url.URL
	// Host is the request's Host header.
	Host string
	// Socket is the Unix socket's path; empty for an http(s) URL.
	Socket string
}

// Parse reads raw, explaining what is wrong with it: not a URL, a scheme
// other than http, https or unix, no host, a socket path that is not
// absolute, a request path that does not start with '/'. Its errors do not
// repeat raw, which may hold a password.
func Parse(raw string) (Target, error) {
	if rest, ok := strings.CutPrefix(raw, "unix://"); ok {
		return parseSocket(rest)
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return Target{}, fmt.Errorf("not a valid URL: expected %s", Example)
	case u.Scheme == "unix":
		return Target{}, errors.New("a Unix socket is named unix:// and its absolute path, such as unix:///run/app/app.sock")
	case u.Scheme != "http" && u.Scheme != "https":
		return Target{}, fmt.Errorf("expected an absolute http, https or unix URL, such as %s", Example)
	case u.Hostname() == "":
		return Target{}, fmt.Errorf("no host: expected %s", Example)
	}
	return Target{URL: u, Host: u.Host}, nil
}

func parseSocket(rest string) (Target, error) {
	path, reqPath, hasReq := strings.Cut(rest, ":")
	switch {
	case path == "" || path == "/":
		return Target{}, errors.New("no socket path: expected unix:// and the socket's absolute path, such as unix:///run/app/app.sock")
	case !strings.HasPrefix(path, "/"):
		return Target{}, fmt.Errorf("socket path %q is not absolute: expected unix:// and an absolute path, such as unix:///run/app/app.sock (three slashes)", path)
	case hasReq && !strings.HasPrefix(reqPath, "/"):
		return Target{}, fmt.Errorf("request path %q after the socket's ':' must start with '/', such as unix:///run/app/app.sock:/messages", reqPath)
	}
	if !hasReq {
		reqPath = "/"
	}
	u, err := url.Parse("http://" + SocketHost(path) + reqPath)
	if err != nil {
		return Target{}, fmt.Errorf("request path %q is not a valid URL path", reqPath)
	}
	return Target{URL: u, Host: "localhost", Socket: path}, nil
}

// SocketHost is the host standing for the socket at path in request URLs.
func SocketHost(path string) string { return hex.EncodeToString([]byte(path)) + socketSuffix }

// socketOf returns the socket a host:port address stands for.
func socketOf(addr string) (string, bool) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	enc, ok := strings.CutSuffix(host, socketSuffix)
	if !ok {
		return "", false
	}
	b, err := hex.DecodeString(enc)
	if err != nil {
		return "", false
	}
	return string(b), true
}

// DialFunc is the shape of net.Dialer.DialContext and of
// http.Transport.DialContext.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Dial returns dial that connects an address standing for a socket to the
// socket, and every other address as dial does.
func Dial(dial DialFunc) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if path, ok := socketOf(addr); ok {
			return dial(ctx, "unix", path)
		}
		return dial(ctx, network, addr)
	}
}

// Addr is the network and address a connection to t is dialled on: the
// socket, or the URL's host and port (80 or 443 by default).
func (t Target) Addr() (network, addr string) {
	if t.Socket != "" {
		return "unix", t.Socket
	}
	if t.URL.Port() != "" {
		return "tcp", t.URL.Host
	}
	port := "80"
	if t.URL.Scheme == "https" {
		port = "443"
	}
	return "tcp", net.JoinHostPort(t.URL.Hostname(), port)
}
