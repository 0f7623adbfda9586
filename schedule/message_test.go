package schedule

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestMessage(t *testing.T) {
	at := time.Date(2026, 5, 1, 8, 0, 0, 5, time.UTC)
	m := &nats.Msg{Subject: "orders.created", Data: []byte("body"), Header: nats.Header{
		"Nats-Msg-Id": {"order-1"}, "X-Tenant": {"acme"}, "Nats-TTL": {"1h"}, "Courier-Delay": {"5m"},
		"Nats-Expected-Stream": {"ORDERS"},
	}}
	sm, id, err := Message(m, "ORDERS", "_sched", at, "order-1")
	if err != nil {
		t.Fatal(err)
	}
	if id != (ID{"ORDERS", KeyToken("order-1")}) || sm.Subject != "_sched.ORDERS."+id.Token || string(sm.Data) != "body" {
		t.Errorf("schedule %s %+v %q", sm.Subject, id, sm.Data)
	}
	want := map[string]string{
		"Nats-Schedule": "@at 2026-05-01T08:00:00.000000005Z", "Nats-Schedule-Target": "orders.created",
		"Courier-Deliver-At": "2026-05-01T08:00:00.000000005Z", "Nats-Msg-Id": "order-1", "Idempotency-Key": "order-1",
		"Nats-Schedule-TTL": "1h", "Nats-Expected-Last-Subject-Sequence": "0", "X-Tenant": "acme", "Nats-Expected-Stream": "ORDERS",
	}
	for k, v := range want {
		if got := sm.Header[k]; len(got) != 1 || got[0] != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	for _, gone := range []string{"Nats-TTL", "Courier-Delay"} {
		if _, ok := sm.Header[gone]; ok {
			t.Errorf("header %s kept", gone)
		}
	}
	if _, ok := m.Header["Nats-Schedule"]; ok || m.Subject != "orders.created" {
		t.Error("the message given was changed")
	}

	// Without a key: a token of its own, and no Idempotency-Key made up.
	anon, id2, err := Message(&nats.Msg{Subject: "orders.x", Header: nats.Header{"Nats-Msg-Id": {"courier-x"}}}, "ORDERS", "p.q", at, "")
	if err != nil || anon.Subject != "p.q.ORDERS."+id2.Token || id2.Token == KeyToken("courier-x") || anon.Header.Get("Idempotency-Key") != "" {
		t.Errorf("without a key: %s %+v %v %v", anon.Subject, id2, anon.Header, err)
	}

	for _, e := range []string{"Nats-Expected-Last-Sequence", "Nats-Expected-Last-Subject-Sequence", "Nats-Expected-Last-Msg-Id"} {
		if _, _, err := Message(&nats.Msg{Subject: "orders.x", Header: nats.Header{e: {"1"}}}, "ORDERS", "_sched", at, ""); !errors.Is(err, ErrExpectation) {
			t.Errorf("%s: %v, want ErrExpectation", e, err)
		}
	}
}

func TestInfoOf(t *testing.T) {
	h := nats.Header{"Nats-Schedule": {"@at 2026-05-01T08:00:00Z"}, "Nats-Schedule-Target": {"orders.a"}, "Idempotency-Key": {"k"}}
	info, ok := infoOf("_sched", "_sched.ORDERS.TOK", h, 7, time.Time{})
	if !ok || info.ID != (ID{"ORDERS", "TOK"}) || info.Target != "orders.a" || info.Key != "k" || info.Seq != 7 ||
		!info.DeliverAt.Equal(time.Date(2026, 5, 1, 8, 0, 0, 0, time.UTC)) {
		t.Errorf("infoOf = %+v, %v", info, ok)
	}
	for _, tt := range []struct {
		subj string
		h    nats.Header
	}{
		{"other.ORDERS.TOK", h},
		{"_sched.ORDERS.TOK", nats.Header{"Nats-Schedule": {"@every 1m"}}},
		{"_sched.ORDERS.TOK", nats.Header{}},
	} {
		if _, ok := infoOf("_sched", tt.subj, tt.h, 1, time.Time{}); ok {
			t.Errorf("infoOf(%s, %v) read as a schedule", tt.subj, tt.h)
		}
	}
}
