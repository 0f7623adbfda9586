package success

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/internal/natshdr"
	"github.com/courierhq/courier/internal/natstest"
)

func TestMessage(t *testing.T) {
	r := Record{
		Status: 201, Header: http.Header{"X-Order": {"42"}, "Connection": {"keep-alive"}, "Content-Length": {"9"}, "Nats-Rollup": {"all"}, "Nats-Expected-Stream": {"X"}},
		Body: []byte("answer"), Subject: "orders.created", Stream: "ORDERS", Consumer: "c", Sequence: 7, Attempt: 2, Key: "k",
	}
	m := Message("ok.orders", r)
	if string(m.Data) != "answer" || m.Header.Get("X-Order") != "42" {
		t.Errorf("body %q, headers %v", m.Data, m.Header)
	}
	if m.Header.Get("Connection") != "" || m.Header.Get("Content-Length") != "" ||
		m.Header.Get("Nats-Rollup") != "" || m.Header.Get("Nats-Expected-Stream") != "" {
		t.Errorf("hop-by-hop headers kept: %v", m.Header)
	}
	for h, want := range map[string]string{HeaderStatus: "201", HeaderSubject: "orders.created", HeaderStream: "ORDERS",
		HeaderSequence: "7", HeaderAttempt: "2", HeaderKey: "k", "Nats-Msg-Id": MsgID(r)} {
		if got := m.Header.Get(h); got != want {
			t.Errorf("%s = %q, want %q", h, got, want)
		}
	}
	// One id per consumer and key, whatever the delivery.
	again := r
	again.Attempt, again.Sequence = 3, 9
	if MsgID(again) != MsgID(r) {
		t.Error("the record's id changes with the delivery: a record published again would be stored twice")
	}
	other := r
	other.Consumer = "d"
	if MsgID(other) == MsgID(r) {
		t.Error("two consumers' records of one key share an id")
	}
	otherStream := r
	otherStream.Stream = "PAYMENTS"
	if MsgID(otherStream) == MsgID(r) {
		t.Error("like-named consumers of two streams share an id for one key")
	}
	// An answer too large to publish: stored without its body, saying so.
	r.BodyCut, r.BodySize = true, 5<<20
	m = Message("ok.orders", r)
	if len(m.Data) != 0 || m.Header.Get(HeaderBody) != BodyOmitted || m.Header.Get(HeaderBodySize) != "5242880" {
		t.Errorf("cut record: body %d bytes, headers %v", len(m.Data), m.Header)
	}
}

// A record carries the app's answer, not its session nor what described one
// HTTP connection: Set-Cookie would hand every reader of the success stream
// the app's cookies; hop-by-hop headers, Proxy-* ones and any the
// Connection header names are dropped, whatever their case.
func TestMessageLeavesOutCookiesAndHopByHop(t *testing.T) {
	r := Record{
		Status: 200,
		Header: http.Header{
			"Set-Cookie": {"session=secret; HttpOnly", "csrf=t0k"}, "set-cookie2": {"old=1"},
			"Connection": {"keep-alive, X-Hop"}, "X-Hop": {"1"}, "Keep-Alive": {"timeout=5"},
			"Transfer-Encoding": {"chunked"}, "Upgrade": {"h2c"}, "Te": {"trailers"}, "Trailer": {"X-Sum"},
			"Proxy-Authenticate": {"Basic"}, "Proxy-Connection": {"close"}, "Proxy-Status": {"edge"},
			"proxy-authentication-info": {"x"},
			"X-Order":                   {"42"}, "Content-Type": {"application/json"}, "Cache-Control": {"no-store"},
		},
		Subject: "orders.created", Stream: "ORDERS", Consumer: "c", Sequence: 1, Attempt: 1, Key: "k",
	}
	for name, m := range map[string]*nats.Msg{"Message": Message("ok.orders", r), "Fit": Fit("ok.orders", r, 1<<20)} {
		for h := range m.Header {
			switch http.CanonicalHeaderKey(h) {
			case "X-Order", "Content-Type", "Cache-Control":
			default:
				if !strings.HasPrefix(h, "Courier-") && h != "Idempotency-Key" && h != "Nats-Msg-Id" {
					t.Errorf("%s: the record carries %s: %q", name, h, m.Header[h])
				}
			}
		}
		for _, h := range []string{"X-Order", "Content-Type", "Cache-Control"} {
			if m.Header.Get(h) != r.Header.Get(h) {
				t.Errorf("%s: %s = %q, want the app's %q", name, h, m.Header.Get(h), r.Header.Get(h))
			}
		}
	}
}

// Fit leaves out the app's largest headers first, then the body if it does
// not fit even alone, and keeps courier's own headers and the trace
// context; the list of what it left out is bounded, so that naming many
// headers cannot make the record too large itself.
func TestFit(t *testing.T) {
	const max = 8192
	r := Record{
		Status: 200, Header: http.Header{"X-Small": {"1"}, "Traceparent": {"00-app-span-01"}},
		Body: []byte("answer"), Subject: "orders.created", Stream: "ORDERS", Consumer: "c", Sequence: 7, Attempt: 1, Key: "k",
		Trace: nats.Header{"traceparent": {"00-message-span-01"}},
	}
	for i := range 200 {
		r.Header.Set(fmt.Sprintf("X-Many-%03d", i), strings.Repeat("v", 100))
	}
	m := Fit("ok.orders", r, max)
	if n := size(m); n > max {
		t.Fatalf("Fit made a record of %d bytes, over %d", n, max)
	}
	if string(m.Data) != "answer" || m.Header.Get("X-Small") != "1" || m.Header.Get(HeaderKey) != "k" || m.Header.Get(HeaderStatus) != "200" {
		t.Errorf("Fit left out the body, the smallest header or courier's own: %q %v", m.Data, m.Header)
	}
	if m.Header.Get("traceparent") != "00-message-span-01" || m.Header.Get("Traceparent") != "" {
		t.Errorf("trace context %v, want the message's in place of the app's", m.Header)
	}
	list := m.Header.Get(HeaderOmittedHeaders)
	if len(list) > omittedListMax || !strings.HasSuffix(list, ", …") || !strings.HasPrefix(list, "X-Many-") {
		t.Errorf("%s = %q (%d bytes), want a bounded list of the names", HeaderOmittedHeaders, list, len(list))
	}
	// A record that fits is left whole.
	small := r
	small.Header = http.Header{"X-Small": {"1"}}
	if m := Fit("ok.orders", small, max); m.Header.Get(HeaderOmittedHeaders) != "" || string(m.Data) != "answer" {
		t.Errorf("a record that fits changed: %q %v", m.Data, m.Header)
	}
}

// TestFitOnTheWire: a record as large as the server's max_payload is kept
// whole, and one byte larger loses something (here the body: the headers
// and the room for naming omitted ones leave it no place), each published
// for real.
func TestFitOnTheWire(t *testing.T) {
	const max = 8192
	s := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = max }})
	nc, _ := natstest.Connect(t, s)
	r := Record{
		Status: 200, Header: http.Header{"X-Small": {"1"}, "X-Padded": {"  value  "}},
		Subject: "orders.created", Stream: "ORDERS", Consumer: "c", Sequence: 7, Attempt: 1, Key: "k",
	}
	whole := Fit("ok.orders", r, 0)
	r.Body = []byte(strings.Repeat("b", max-natshdr.Size(whole.Header)))

	m := Fit("ok.orders", r, max)
	if m.Header.Get(HeaderOmittedHeaders) != "" || len(m.Data) != len(r.Body) {
		t.Errorf("a record of max_payload lost %q and %d bytes of body", m.Header.Get(HeaderOmittedHeaders), len(r.Body)-len(m.Data))
	}
	if err := nc.PublishMsg(m); err != nil {
		t.Errorf("publishing a record of max_payload: %v", err)
	}

	r.Body = append(r.Body, 'b')
	m = Fit("ok.orders", r, max)
	if m.Header.Get(HeaderBody) != BodyOmitted || len(m.Data) != 0 {
		t.Errorf("a record one byte over max_payload kept its body: %d bytes, headers %v", len(m.Data), m.Header)
	}
	if err := nc.PublishMsg(m); err != nil {
		t.Errorf("publishing a record fitted to max_payload: %v", err)
	}
}
