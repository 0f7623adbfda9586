package appurl

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		raw                              string
		url, host, socket, network, addr string
	}{
		{"http://127.0.0.1:8080/messages", "http://127.0.0.1:8080/messages", "127.0.0.1:8080", "", "tcp", "127.0.0.1:8080"},
		{"https://app/x?y=1", "https://app/x?y=1", "app", "", "tcp", "app:443"},
		{"http://app/", "http://app/", "app", "", "tcp", "app:80"},
		{"unix:///run/app.sock", "http://" + SocketHost("/run/app.sock") + "/", "localhost", "/run/app.sock", "unix", "/run/app.sock"},
		{"unix:///run/app.sock:/messages?v=2", "http://" + SocketHost("/run/app.sock") + "/messages?v=2", "localhost", "/run/app.sock", "unix", "/run/app.sock"},
	}
	for _, tt := range tests {
		got, err := Parse(tt.raw)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.raw, err)
			continue
		}
		network, addr := got.Addr()
		if got.URL.String() != tt.url || got.Host != tt.host || got.Socket != tt.socket || network != tt.network || addr != tt.addr {
			t.Errorf("Parse(%q) = %s host %q socket %q addr %s %s; want %s %q %q %s %s",
				tt.raw, got.URL, got.Host, got.Socket, network, addr, tt.url, tt.host, tt.socket, tt.network, tt.addr)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct{ raw, want string }{
		{"/messages", "expected an absolute http, https or unix URL"},
		{"ftp://h/x", "expected an absolute http, https or unix URL"},
		{"http:///x", "no host"},
		{"http://a b/", "not a valid URL"},
		{"unix:/run/app.sock", "a Unix socket is named unix://"},
		{"unix://run/app.sock", `socket path "run/app.sock" is not absolute`},
		{"unix://", "no socket path"},
		{"unix:///", "no socket path"},
		{"unix:///run/app.sock:x", `request path "x" after the socket's ':' must start with '/'`},
		{"http://user:s3cret@a b/", "not a valid URL"},
	}
	for _, tt := range tests {
		_, err := Parse(tt.raw)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tt.raw, err, tt.want)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Parse(%q): error repeats the password: %v", tt.raw, err)
		}
	}
}

// TestDialSocket sends a request through an http.Transport dialling with
// Dial to an HTTP server on a real Unix socket, and one over TCP.
func TestDialSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "app.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Seen", r.Host+" "+r.URL.RequestURI())
	})
	for _, l := range []net.Listener{ln, tcp} {
		srv := &http.Server{Handler: h}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	var d net.Dialer
	client := &http.Client{Transport: &http.Transport{DialContext: Dial(d.DialContext)}}
	for raw, want := range map[string]string{
		"unix://" + sock + ":/messages?v=2":    "localhost /messages?v=2",
		"unix://" + sock:                       "localhost /",
		"http://" + tcp.Addr().String() + "/x": tcp.Addr().String() + " /x",
	} {
		tg, err := Parse(raw)
		if err != nil {
			t.Fatalf("Parse(%q): %v", raw, err)
		}
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, tg.URL.String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = tg.Host
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		_ = resp.Body.Close()
		if got := resp.Header.Get("X-Seen"); got != want {
			t.Errorf("%s: the app saw %q, want %q", raw, got, want)
		}
	}
}
