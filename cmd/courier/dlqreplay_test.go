package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/dlq"
)

// plant publishes on the dead-letter subject a dead letter courier never
// stored, as anyone allowed to publish there can, and returns its
// sequence. The DLQ stream is created first if need be.
func (h *harness) plant(hdr map[string]string, body string) uint64 {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := dlq.EnsureStream(ctx, h.js, dlqSubject, 1); err != nil {
		h.t.Fatal(err)
	}
	m := nats.NewMsg(dlqSubject)
	m.Data = []byte(body)
	for k, v := range map[string]string{dlq.HeaderReason: dlq.ReasonRejected, dlq.HeaderStream: "ORDERS", dlq.HeaderConsumer: "courier", dlq.HeaderSequence: "1"} {
		m.Header.Set(k, v)
	}
	for k, v := range hdr {
		m.Header[k] = []string{v}
	}
	ack, err := h.js.PublishMsg(ctx, m)
	if err != nil {
		h.t.Fatal(err)
	}
	return ack.Sequence
}

// A dead letter planted by someone allowed to publish on the dead-letter
// subject cannot make `courier dlq replay` call NATS's API with the
// operator's credentials (here: delete the stream): it is refused, kept,
// reported on stderr and in the summary, and refused again by the next
// replay; the others are replayed.
func TestDLQReplayRefusesPlantedLetter(t *testing.T) {
	h := newHarness(t)
	planted := h.plant(map[string]string{dlq.HeaderSubject: "$JS.API.STREAM.DELETE.ORDERS"}, "")
	h.plant(map[string]string{dlq.HeaderSubject: "orders.created"}, "a real-looking one")

	res := h.dlq("replay", "--dry-run")
	res.want(t, 1, "would refuse ", "$JS.API.STREAM.DELETE.ORDERS", "dry run: would replay 1, refused 1, nothing changed")

	for i, want := range []string{"replayed 1, kept 0 (duplicate window), failed 0, refused 1", "replayed 0, kept 0 (duplicate window), failed 0, refused 1"} {
		res := h.dlq("replay")
		res.want(t, 1, want)
		if !strings.Contains(res.stderr, "refused ") || !strings.Contains(res.stderr, "reserves") || !strings.Contains(res.stderr, "dlq purge") {
			t.Errorf("replay %d: stderr does not say why the planted dead letter was refused and how to remove it:\n%s", i+1, res.stderr)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := h.js.Stream(ctx, "ORDERS"); err != nil {
		t.Fatalf("stream ORDERS after the replays: %v", err)
	}
	if n := h.streamMsgs(); n != 1 {
		t.Errorf("ORDERS holds %d messages, want the one replayed", n)
	}
	if got := h.deadLetterSeqs(); len(got) != 1 || got[0] != planted {
		t.Errorf("dead letters left %v, want the planted one, %d", got, planted)
	}
	h.dlq("purge", "--yes", "1").want(t, 0, "purged 1, failed 0")
	h.dlq("replay").want(t, 0, "replayed 0, kept 0 (duplicate window), failed 0\n")
}
