package reply

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
)

const subject = "orders.get"

// harness is one embedded server, a caller's connection to it, and the
// services a test started on connections of their own.
type harness struct {
	t      *testing.T
	srv    *server.Server
	caller *nats.Conn
}

// newHarness starts a server; maxPayload, when not 0, is its max_payload.
func newHarness(t *testing.T, maxPayload int32) *harness {
	t.Helper()
	srv := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) {
		if maxPayload > 0 {
			o.MaxPayload = maxPayload
		}
	}})
	caller, _ := natstest.Connect(t, srv)
	return &harness{t: t, srv: srv, caller: caller}
}

// started is a running service with what a test inspects.
type started struct {
	*Service
	reg  *prometheus.Registry
	logs *testlog.Buffer
}

// start starts a service answering subject with url on a connection of its
// own, changed by mod; it is stopped when the test ends.
func (h *harness) start(url string, mod func(*Options)) *started {
	h.t.Helper()
	nc, _ := natstest.Connect(h.t, h.srv)
	reg := prometheus.NewRegistry()
	logs := &testlog.Buffer{}
	o := Options{
		Subjects:      []string{subject},
		URL:           url,
		QueueGroup:    "orders-consumer",
		Version:       "v1.2.3",
		Timeout:       5 * time.Second,
		ShutdownGrace: 5 * time.Second,
		Logger:        slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Registerer:    reg,
	}
	if mod != nil {
		mod(&o)
	}
	svc, err := New(nc, o)
	if err != nil {
		h.t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := svc.Start(ctx); err != nil {
		h.t.Fatalf("Start: %v", err)
	}
	h.t.Cleanup(svc.Stop) // before the connection closes: cleanups run last first
	return &started{Service: svc, reg: reg, logs: logs}
}

// request sends a request on subject and returns the reply.
func (h *harness) request(hdr nats.Header, data []byte) *nats.Msg {
	h.t.Helper()
	m, err := h.tryRequest(hdr, data)
	if err != nil {
		h.t.Fatalf("request: %v", err)
	}
	return m
}

func (h *harness) tryRequest(hdr nats.Header, data []byte) (*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return h.caller.RequestMsgWithContext(ctx, &nats.Msg{Subject: subject, Header: hdr, Data: data})
}

// app starts an HTTP app answering with fn, closed when the test ends.
func app(t *testing.T, fn http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(fn)
	t.Cleanup(s.Close)
	return s
}

// deadURL is the address of a port nothing listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return "http://" + addr + "/"
}

// checkReply fails t unless m carries status as Courier-Status ("" for
// none) and errCode as Nats-Service-Error-Code ("" for none).
func checkReply(t *testing.T, m *nats.Msg, status, errCode string) {
	t.Helper()
	if got := m.Header.Get(HeaderStatus); got != status {
		t.Errorf("Courier-Status = %q, want %q", got, status)
	}
	if got := m.Header.Get("Nats-Service-Error-Code"); got != errCode {
		t.Errorf("Nats-Service-Error-Code = %q, want %q (Nats-Service-Error %q)", got, errCode, m.Header.Get("Nats-Service-Error"))
	}
	if errCode != "" && m.Header.Get("Nats-Service-Error") == "" {
		t.Errorf("error reply without Nats-Service-Error")
	}
}

// connect returns another connection to the harness's server.
func connect(t *testing.T, h *harness) (*nats.Conn, any) {
	t.Helper()
	nc, js := natstest.Connect(t, h.srv)
	return nc, js
}

func itoa(i int) string { return strconv.Itoa(i) }

// hang never answers: it waits until courier gives up on the request. The
// body is read first: only then does net/http notice a closed connection.
func hang(_ http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	<-r.Context().Done()
}

// waitCount waits until the series name{labels} of reg is want: a request is counted
// just after its reply is sent, so a caller can see the reply first.
func waitCount(t *testing.T, reg *prometheus.Registry, want float64, name string, labels ...string) {
	t.Helper()
	poll.Until(t, 15*time.Second, fmt.Sprintf("%s%v = %v", name, labels, want), func() bool {
		return metricstest.Value(t, reg, name, labels...) == want
	})
}
