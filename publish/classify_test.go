package publish

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
)

// TestNeverTransient: a message nats.go refuses itself before sending it
// (a header name or a subject it cannot write) fails the same way at
// every attempt: it is answered 400 at once, not retried for the
// request's time and answered 503 with Retry-After, which would have the
// app send it again for ever.
func TestNeverTransient(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{})

	for _, tt := range []struct {
		name string
		m    *nats.Msg
	}{
		{"a header name with a space", &nats.Msg{Subject: "orders.x", Header: nats.Header{"X Tenant": {"7"}, nats.MsgIdHdr: {"k1"}}}},
		{"an empty header name", &nats.Msg{Subject: "orders.x", Header: nats.Header{"": {"7"}, nats.MsgIdHdr: {"k2"}}}},
		{"a subject with a space", &nats.Msg{Subject: "orders.a b", Header: nats.Header{nats.MsgIdHdr: {"k3"}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Long enough for several attempts, were it retried.
			deadline := time.Now().Add(2 * time.Second)
			res := a.srv.publishMsg(context.Background(), deadline, tt.m, false, a.nc.MaxPayload())
			if res.status != http.StatusBadRequest || res.outcome != outcomeInvalid {
				t.Errorf("answer %d %s %q, want 400 %s", res.status, res.outcome, res.msg, outcomeInvalid)
			}
		})
	}
	if n := value(a.srv.m.retries); n != 0 {
		t.Errorf("%v retries: retried as transient", n)
	}
	if n := msgCount(t, js, "ORDERS"); n != 0 {
		t.Errorf("%d messages stored", n)
	}
}
