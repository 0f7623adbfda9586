package success

import (
	"net/http"
	"testing"
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
