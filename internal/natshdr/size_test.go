package natshdr_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/internal/natshdr"
	"github.com/courierhq/courier/internal/natstest"
)

// sizeCases are headers whose encoding differs in what Size must count:
// several values, surrounding spaces nats.go trims, line breaks it writes as
// spaces, multi-byte text.
var sizeCases = []struct {
	name string
	h    nats.Header
	want int
}{
	{"none", nil, 0},
	{"empty", nats.Header{}, 0},
	// NATS/1.0\r\n A: 1\r\n A: 22\r\n \r\n
	{"two values", nats.Header{"A": {"1", "22"}}, 10 + 6 + 7 + 2},
	{"empty value", nats.Header{"Nats-Msg-Id": {""}}, 10 + 15 + 2},
	{"surrounding spaces", nats.Header{"X": {"  padded \t"}}, 10 + 11 + 2},
	{"line breaks", nats.Header{"X": {"a\r\nb\nc"}}, 10 + 11 + 2},
	{"multi-byte", nats.Header{"X-Name": {"café €"}}, 10 + 19 + 2},
	{"many", nats.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, "Courier-Reason": {"status"}, "Courier-Attempts": {"5"}}, 10 + 70 + 24 + 21 + 2},
}

func TestSize(t *testing.T) {
	for _, tc := range sizeCases {
		if got := natshdr.Size(tc.h); got != tc.want {
			t.Errorf("%s: Size = %d, want %d", tc.name, got, tc.want)
		}
		// nats.go's own count, the one its publish checks max_payload with.
		if got, theirs := natshdr.Size(tc.h), (&nats.Msg{Header: tc.h}).Size(); got != theirs {
			t.Errorf("%s: Size = %d, nats.go's Msg.Size = %d", tc.name, got, theirs)
		}
	}
}

// TestSizeOnTheWire sends each header through a real server whose
// max_payload leaves room for exactly its Size beside the body: the message
// is delivered, its header block as long as Size says, and one byte more of
// body is refused.
func TestSizeOnTheWire(t *testing.T) {
	const maxPayload = 1024
	s := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = maxPayload }})
	nc, _ := natstest.Connect(t, s)
	sub, err := nc.SubscribeSync("size")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range sizeCases {
		body := []byte(strings.Repeat("b", maxPayload-natshdr.Size(tc.h)))
		if err := nc.PublishMsg(&nats.Msg{Subject: "size", Header: tc.h, Data: body}); err != nil {
			t.Fatalf("%s: a message of max_payload by Size: %v", tc.name, err)
		}
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		// A received message's Size is what came over the wire.
		if got := m.Size() - len(m.Subject) - len(m.Reply) - len(m.Data); got != natshdr.Size(tc.h) {
			t.Errorf("%s: %d bytes of headers received, Size = %d", tc.name, got, natshdr.Size(tc.h))
		}
		over := &nats.Msg{Subject: "size", Header: tc.h, Data: append(body, 'b')}
		if err := nc.PublishMsg(over); !errors.Is(err, nats.ErrMaxPayload) {
			t.Fatalf("%s: one byte over max_payload by Size: %v, want %v", tc.name, err, nats.ErrMaxPayload)
		}
	}
}
