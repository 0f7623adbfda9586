package main

// Names courier makes from a durable's stream and consumer lose case and
// punctuation: two durables whose names make the same name never share
// what courier made for one of them.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
	"github.com/courierhq/courier/ordermark"
	"github.com/courierhq/courier/partition"
)

// Streams orders and ORDERS, consumer courier on each: both couriers run,
// each with a dead-letter stream and an advisory stream of its own
// (before, the second stopped at start: the names were taken).
func TestNamesakeStreamsEachKeepTheirOwn(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.js.CreateStream(ctx, jetstream.StreamConfig{Name: "orders", Subjects: []string{"lower.>"}}); err != nil {
		t.Fatal(err)
	}
	a := newApp(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusBadRequest) })
	upper := start(t, h.env(a.URL))
	lower := start(t, h.env(a.URL, "COURIER_STREAM=orders", "COURIER_DEDUP_DIR="+t.TempDir()))
	for _, c := range []*courier{upper, lower} {
		admin := adminAddr(t, c)
		poll.Until(t, 15*time.Second, "ready", func() bool { code, _ := get(t, "http://"+admin+"/readyz"); return code == 200 })
	}
	h.publish("orders.created", "upper", nil)
	h.publish("lower.created", "lower", nil)
	names := map[string]string{}
	for subject, body := range map[string]string{"dlq.ORDERS.courier": "upper", "dlq.orders.courier": "lower"} {
		poll.Until(t, 15*time.Second, "the dead letter on "+subject, func() bool { return len(h.deadLetters(subject)) == 1 })
		if got := string(h.deadLetters(subject)[0].Data); got != body {
			t.Errorf("%s holds %q, want %q", subject, got, body)
		}
		name, err := h.js.StreamNameBySubject(ctx, subject)
		if err != nil {
			t.Fatal(err)
		}
		names[subject] = name
	}
	if names["dlq.ORDERS.courier"] == names["dlq.orders.courier"] {
		t.Errorf("one dead-letter stream for both: %v", names)
	}
	adv := map[string]string{}
	for _, stream := range []string{"ORDERS", "orders"} {
		name, err := h.js.StreamNameBySubject(ctx, giveup.AdvisorySubject(stream, "courier"))
		if err != nil {
			t.Fatalf("the advisory stream of %s: %v", stream, err)
		}
		adv[stream] = name
	}
	if adv["ORDERS"] == adv["orders"] {
		t.Errorf("one advisory stream for both: %v", adv)
	}
}

// Stream A_B with consumer C and stream A with consumer B_C make one name
// for the bucket of order per key's marks: the second courier stops at
// start (exit 1) naming the durable the bucket belongs to, and its cleanup
// never removes it.
func TestOrderMarksBucketOfAnotherDurableRefused(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	for name, subject := range map[string]string{"A_B": "ab.>", "A": "a.>"} {
		if _, err := h.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}}); err != nil {
			t.Fatal(err)
		}
	}
	a := newApp(t, nil)
	first := h.env(a.URL, "COURIER_STREAM=A_B", "COURIER_CONSUMER=C", "COURIER_ORDER_KEY=header:Order")
	c := start(t, first)
	admin := adminAddr(t, c)
	poll.Until(t, 15*time.Second, "the first courier ready", func() bool { code, _ := get(t, "http://"+admin+"/readyz"); return code == 200 })

	second := h.env(a.URL, "COURIER_STREAM=A", "COURIER_CONSUMER=B_C", "COURIER_ORDER_KEY=header:Order",
		"COURIER_DEDUP_DIR="+t.TempDir())
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var stderr testlog.Buffer
	err := run(rctx, nil, second, io.Discard, &stderr)
	var out strings.Builder
	if code := exitCode(err, &out); code != 1 || !strings.Contains(out.String(), `belongs to consumer "C" on stream "A_B"`) ||
		!strings.Contains(out.String(), ordermark.BucketName("A", "B_C")) {
		t.Errorf("the second durable: exit %d, %q; want 1 naming the bucket's durable", code, out.String())
	}

	var cleanOut strings.Builder
	err = run(ctx, []string{"cleanup", "--yes", "--force"}, second, &cleanOut, &cleanOut)
	if err != nil {
		t.Fatalf("cleanup of the second durable: %v\n%s", err, cleanOut.String())
	}
	if !strings.Contains(cleanOut.String(), `it is the marks of consumer "C" on stream "A_B"`) ||
		!strings.Contains(cleanOut.String(), `it is the couriers of consumer "C" on stream "A_B"`) {
		t.Errorf("cleanup of the second durable:\n%s\nwant the buckets kept as the first's", cleanOut.String())
	}
	for _, bucket := range []string{ordermark.BucketName("A_B", "C"), partition.MembersBucket("A_B", "C")} {
		if _, err := h.js.KeyValue(ctx, bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
			t.Errorf("the first durable's bucket %s was removed by the second's cleanup", bucket)
		}
	}
}
