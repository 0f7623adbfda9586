package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/partition"
)

// The commands run beside a sidecar from another shell, with a variable of
// the sidecar's missing or misspelt, say what there is and what to set
// rather than the server's "consumer not found": a durable split into
// partitions the environment does not name, one not split though it says
// so, a stream or consumer that is not there (the ones that are, closest
// first). Those that work without the partitions' variables (dlq,
// cleanup) still do.
func TestToolsSayWhatExists(t *testing.T) {
	h := newHarness(t, func(sc *jetstream.StreamConfig) { sc.Name = "ORDERS" })
	ctx := context.Background()
	for _, name := range []string{"INVOICES", "orders-archive"} {
		if _, err := h.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "plain", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	a := newApp(t, nil)
	partitioned := []string{"COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=4"}
	for i := range 3 {
		h.publish(fmt.Sprintf("orders.k%d.created", i), "x", nil)
	}
	c := start(t, h.env(a.URL, partitioned...))
	work := partition.StreamName("ORDERS", "courier")
	poll.Until(t, 20*time.Second, "every message delivered", func() bool {
		return a.count() == 3 && h.streamExists(work) && h.streamMsgsOf(work) == 0
	})
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	const splitInto = `consumer "courier" of stream "ORDERS" is split into 4 partitions by subject token 2`
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		code int
		says []string
	}{
		{"status without the partitions' variables", []string{"status"}, nil, 1,
			[]string{splitInto, "set COURIER_ORDER_KEY=subject:2 COURIER_ORDER_PARTITIONS=4"}},
		{"pause without them", []string{"pause", "--for", "1m"}, nil, 1, []string{splitInto, "COURIER_ORDER_PARTITIONS=4"}},
		{"resume without them", []string{"resume"}, nil, 1, []string{splitInto, "COURIER_ORDER_PARTITIONS=4"}},
		{"status with them", []string{"status"}, partitioned, 0, []string{"in 4 partitions"}},
		{"dlq ls without them", []string{"dlq", "ls"}, nil, 0, nil},
		{"cleanup without them", []string{"cleanup", "--dry-run"}, nil, 0, []string{"remove  stream " + fmt.Sprintf("%q", work)}},
		{"a misspelt stream", []string{"status"}, []string{"COURIER_STREAM=orders"}, 1,
			[]string{`stream "orders" not found (COURIER_STREAM); the streams there are: ORDERS, orders-archive, INVOICES`}},
		{"dlq with a misspelt stream", []string{"dlq", "ls"}, []string{"COURIER_STREAM=orders"}, 1,
			[]string{`stream "orders" not found`, "ORDERS"}},
		{"cleanup with a misspelt stream", []string{"cleanup", "--dry-run"}, []string{"COURIER_STREAM=orders"}, 1,
			[]string{`stream "orders" not found`, "ORDERS"}},
		{"a misspelt consumer", []string{"status"}, []string{"COURIER_CONSUMER=plian"}, 1,
			[]string{`consumer "plian" not found on stream "ORDERS"; its consumers are: plain`}},
		{"partitions said of a durable that has none", []string{"status"}, append([]string{"COURIER_CONSUMER=plain"}, partitioned...), 1,
			[]string{`consumer "plain" of stream "ORDERS" is not split into partitions`, "unset COURIER_ORDER_PARTITIONS"}},
		{"pause, partitions said of a durable that has none", []string{"pause"}, append([]string{"COURIER_CONSUMER=plain"}, partitioned...), 1,
			[]string{"is not split into partitions"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(ctx, tc.args, h.env("", tc.env...), &stdout, &stderr)
			code := exitCode(err, &stderr)
			out := stdout.String() + stderr.String()
			if code != tc.code {
				t.Fatalf("courier %s: exit %d, want %d:\n%s", strings.Join(tc.args, " "), code, tc.code, out)
			}
			for _, want := range tc.says {
				if !strings.Contains(out, want) {
					t.Errorf("courier %s does not say %q:\n%s", strings.Join(tc.args, " "), want, out)
				}
			}
			if strings.Contains(out, "consumer not found") {
				t.Errorf("the server's words, not what to do:\n%s", out)
			}
		})
	}
}

func TestClosest(t *testing.T) {
	got := closest("orders", []string{"INVOICES", "ORDERS", "orders-archive", "ORDER"}, 3)
	want := []string{"ORDERS", "ORDER", "orders-archive", "… 1 more"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("closest = %q, want %q", got, want)
	}
}
