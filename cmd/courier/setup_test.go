package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
)

// Start-up retries what time fixes and gives up on what it cannot: a
// placement refused for a peer offline (a node restarting) is retried, one
// refused for want of peers or storage is final, as the server words them
// (nats-server's selectPeerError).
func TestTransientSetupErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}, true},
		{fmt.Errorf("create a stream: %w", &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline, insufficient storage"}), true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement"}, false},
		{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, insufficient storage"}, false},
		{&jetstream.APIError{Code: 400, ErrorCode: 10058, Description: "stream name already in use with a different configuration"}, false},
	} {
		if got := transientSetupError(c.err); got != c.want {
			t.Errorf("transientSetupError(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// A stream to consume that does not exist stops courier at start (exit 1)
// with one line naming the streams there are, closest first, and the one
// most likely meant; not those courier and key-value buckets make.
func TestMissingStreamSuggestsTheClosest(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	for _, sc := range []jetstream.StreamConfig{
		{Name: "PAYMENTS", Subjects: []string{"payments.>"}},
		{Name: "COURIER_DLQ_ORDER_COURIER", Subjects: []string{"dlq.x"}},
	} {
		if _, err := h.js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ORDER"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ stream, want string }{
		{"ORDER", `stream "ORDER" not found (did you mean "ORDERS"? the streams there are: ORDERS, PAYMENTS): courier does not create the stream it consumes; create it (e.g. ` + "`nats stream add ORDER`" + `) or fix COURIER_STREAM`},
		{"orders", `stream "orders" not found (did you mean "ORDERS"? the streams there are: ORDERS, PAYMENTS)`},
		{"PAYMENT", `stream "PAYMENT" not found (did you mean "PAYMENTS"? the streams there are: PAYMENTS, ORDERS)`},
		{"SHIPPING", `stream "SHIPPING" not found (the streams there are: ORDERS, PAYMENTS): courier does not create`},
	} {
		var stderr testlog.Buffer
		err := run(ctx, nil, h.env("http://127.0.0.1:1/", "COURIER_STREAM="+tc.stream), io.Discard, &stderr)
		var out bytes.Buffer
		code := exitCode(err, &out)
		if line := out.String(); code != 1 || !strings.Contains(line, tc.want) || strings.Count(line, "\n") != 1 {
			t.Errorf("COURIER_STREAM=%s: exit %d, %q; want exit 1 and one line holding %q", tc.stream, code, line, tc.want)
		}
	}

	empty := newHarness(t)
	if err := empty.js.DeleteStream(ctx, "ORDERS"); err != nil {
		t.Fatal(err)
	}
	var stderr testlog.Buffer
	err := run(ctx, nil, empty.env("http://127.0.0.1:1/"), io.Discard, &stderr)
	var out bytes.Buffer
	if code := exitCode(err, &out); code != 1 || !strings.Contains(out.String(), `stream "ORDERS" not found (there is no stream on this server for this account)`) {
		t.Errorf("no stream at all: exit %d, %q", code, out.String())
	}
}

// A stream named as the dead-letter stream would be, capturing other
// subjects, stops courier at start (exit 1) with a stream to create that
// works: a free name, capturing the dead-letter subject. Once it is there,
// courier starts and keeps its dead letters in it.
func TestDeadLetterStreamNameTaken(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.js.CreateStream(ctx, jetstream.StreamConfig{Name: "COURIER_DLQ_ORDERS_COURIER", Subjects: []string{"elsewhere.>"}}); err != nil {
		t.Fatal(err)
	}
	var stderr testlog.Buffer
	err := run(ctx, nil, h.env("http://127.0.0.1:1/"), io.Discard, &stderr)
	var out bytes.Buffer
	code := exitCode(err, &out)
	want := "nats stream add COURIER_DLQ_ORDERS_COURIER_2 --subjects='dlq.ORDERS.courier'"
	if line := out.String(); code != 1 || !strings.Contains(line, want) || !strings.Contains(line, `a stream named "COURIER_DLQ_ORDERS_COURIER" exists but does not capture it`) {
		t.Fatalf("exit %d, %q; want exit 1 and %q", code, line, want)
	}
	if _, err := h.js.CreateStream(ctx, jetstream.StreamConfig{Name: "COURIER_DLQ_ORDERS_COURIER_2", Subjects: []string{"dlq.ORDERS.courier"}}); err != nil {
		t.Fatalf("the stream the error names: %v", err)
	}
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusUnprocessableEntity) })
	h.publish("orders.created", "hopeless", nil)
	start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "the dead letter in the stream the error named", func() bool {
		s, err := h.js.Stream(ctx, "COURIER_DLQ_ORDERS_COURIER_2")
		return err == nil && s.CachedInfo().State.Msgs == 1
	})
}
