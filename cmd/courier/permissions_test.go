package main

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

// TestDocumentedPermissions: a user granted exactly what docs/operations.md
// ("Permissions") lists, for the core and for each optional feature (the
// shared dedup store, success records, request/reply), runs courier with all
// of them on: the message is delivered and acked, its success record
// stored, a request answered, and no permission is violated.
func TestDocumentedPermissions(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "admin", Password: "pw"},
			{Username: "courier", Password: "pw", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{
					"$JS.API.>", "$JS.ACK.ORDERS.>", "$JS.ACK.COURIER_ADVISORIES_ORDERS_COURIER.>", "dlq.ORDERS.courier",
					"$KV.COURIER_DEDUP.>", // COURIER_DEDUP_STORE=shared
					"done.orders",         // COURIER_SUCCESS_SUBJECT
				}},
				Subscribe: &server.SubjectPermission{Allow: []string{
					"_INBOX.>",
					"quote.get", "$SRV.>", // COURIER_REPLY_SUBJECTS
				}},
				Response: &server.ResponsePermission{}, // allow_responses: true
			}},
		}
	}})
	h := &harness{t: t, srv: srv, stream: "ORDERS", dir: t.TempDir()}
	h.nc, h.js = connectWith(t, srv, nats.UserInfo("admin", "pw"))
	createStream(t, h)
	a := newApp(t, nil)
	c := start(t, h.env(a.URL, "NATS_USER=courier", "NATS_PASSWORD=pw",
		"COURIER_DEDUP_STORE=shared", "COURIER_SUCCESS_SUBJECT=done.orders", "COURIER_REPLY_SUBJECTS=quote.get"))

	h.publish("orders.created", "one", map[string]string{"Idempotency-Key": "k-1"})
	poll.Until(t, 15*time.Second, "the message acked", func() bool { return h.settled("courier") })
	poll.Until(t, 15*time.Second, "its success record stored", func() bool { return h.streamMsgsOf("COURIER_SUCCESS_DONE_ORDERS") == 1 })
	if _, err := h.nc.Request("quote.get", []byte("q"), 5*time.Second); err != nil {
		t.Errorf("request on quote.get: %v", err)
	}
	if _, err := h.nc.Request("$SRV.PING.courier", nil, 5*time.Second); err != nil {
		t.Errorf("$SRV.PING.courier: %v", err)
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier stopped with %v", err)
	}
	if logs := c.logs.String(); strings.Contains(logs, "Permissions Violation") {
		t.Errorf("a permission was violated:\n%s", logs)
	}
}
