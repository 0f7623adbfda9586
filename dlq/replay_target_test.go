package dlq_test

import (
	"encoding/base64"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
)

// plant publishes on the dead-letter subject what someone allowed to
// publish there may write: a dead letter courier never stored, with the
// envelope headers of its choosing. It returns its sequence.
func (e *toolsEnv) plant(hdr nats.Header, body string) uint64 {
	e.t.Helper()
	h := nats.Header{
		dlq.HeaderReason:   {dlq.ReasonRejected},
		dlq.HeaderStream:   {"ORDERS"},
		dlq.HeaderConsumer: {"courier"},
		dlq.HeaderSequence: {"7"},
		dlq.HeaderAttempts: {"1"},
	}
	for k, v := range hdr {
		h[k] = v
	}
	ack, err := e.js.PublishMsg(ctx(e.t, 5*time.Second), &nats.Msg{Subject: e.subject, Header: h, Data: []byte(body)})
	if err != nil {
		e.t.Fatalf("plant: %v", err)
	}
	return ack.Sequence
}

// A planted dead letter cannot make replay publish outside the stream it
// names, nor to a subject NATS reserves: it would have deleted the stream
// (its API's subject), or made a push consumer delivering the stream to
// the planter's inbox, with the operator's credentials.
func TestReplayRefusesForeignTargets(t *testing.T) {
	e := newToolsEnv(t)
	if _, err := e.js.CreateStream(ctx(t, 5*time.Second), jetstream.StreamConfig{Name: "PAYMENTS", Subjects: []string{"payments.>"}}); err != nil {
		t.Fatal(err)
	}
	push := `{"stream_name":"ORDERS","config":{"durable_name":"stolen","deliver_subject":"_INBOX.planter","ack_policy":"none"}}`
	planted := map[uint64]string{}
	for _, p := range []struct {
		name string
		hdr  nats.Header
		body string
	}{
		{"stream delete", nats.Header{dlq.HeaderSubject: {"$JS.API.STREAM.DELETE.ORDERS"}}, ""},
		{"push consumer", nats.Header{dlq.HeaderSubject: {"$JS.API.CONSUMER.CREATE.ORDERS.stolen"}}, push},
		{"stream delete, base64", nats.Header{dlq.HeaderSubject: {"orders.x"},
			dlq.HeaderSubjectBase64: {base64.StdEncoding.EncodeToString([]byte("$JS.API.STREAM.DELETE.PAYMENTS"))}}, ""},
		{"a key-value write", nats.Header{dlq.HeaderSubject: {"$KV.config.flag"}}, "on"},
		{"an inbox", nats.Header{dlq.HeaderSubject: {"_INBOX.operator.1"}}, "x"},
		{"another stream's subject", nats.Header{dlq.HeaderSubject: {"payments.refund"}}, "refund"},
		{"a wildcard", nats.Header{dlq.HeaderSubject: {"orders.*"}}, "x"},
		{"no subject", nil, "x"},
	} {
		planted[e.plant(p.hdr, p.body)] = p.name
	}
	// Naming another stream does not get a dead letter selected: the
	// stream is the one asked for, not the header's.
	e.plant(nats.Header{dlq.HeaderStream: {"PAYMENTS"}, dlq.HeaderSubject: {"payments.refund"}}, "refund")

	for _, dry := range []bool{true, false, false} { // a second replay refuses them again
		var results []dlq.ReplayResult
		sum, err := e.queue().Replay(ctx(t, 10*time.Second), dlq.Selection{Stream: "ORDERS", Consumer: "courier"},
			dlq.ReplayOptions{DryRun: dry, Progress: func(r dlq.ReplayResult) { results = append(results, r) }})
		if err != nil || sum != (dlq.ReplaySummary{Refused: len(planted)}) {
			t.Errorf("Replay (dry run %v) = %+v, %v; want %d refused", dry, sum, err, len(planted))
		}
		for _, r := range results {
			if r.Outcome != dlq.Refused || r.Why == "" || r.Ack != nil {
				t.Errorf("%s: %v (%q, ack %+v), want refused saying why", planted[r.Letter.Sequence], r.Outcome, r.Why, r.Ack)
			}
		}
	}

	for _, name := range []string{"ORDERS", "PAYMENTS"} {
		s, err := e.js.Stream(ctx(t, 5*time.Second), name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if info, err := s.Info(ctx(t, 5*time.Second)); err != nil || info.State.Msgs != 0 {
			t.Errorf("stream %s holds %+v (%v), want nothing published", name, info.State, err)
		}
	}
	if _, err := e.js.Consumer(ctx(t, 5*time.Second), "ORDERS", "stolen"); err == nil {
		t.Error("replay created the planted push consumer")
	}
	left, err := e.queue().List(ctx(t, 5*time.Second), dlq.Selection{})
	if err != nil || len(left) != len(planted)+1 {
		t.Errorf("%d dead letters left (%v), want every planted one kept", len(left), err)
	}
}

// A replay does not restore the NATS headers that act beyond the message
// when it is published: a dead letter carrying Nats-Rollup would remove
// what its stream stored since, Nats-Trace-Dest would make the server
// publish a trace elsewhere.
func TestReplayDropsActingNATSHeaders(t *testing.T) {
	e := newToolsEnv(t, func(c *jetstream.StreamConfig) { c.AllowRollup, c.AllowMsgTTL = true, true })
	e.publishOriginal("orders.created", "stored since", nil)
	e.publishOriginal("orders.paid", "stored since", nil)
	trace, err := e.js.Conn().SubscribeSync("traces.>")
	if err != nil {
		t.Fatal(err)
	}
	e.plant(nats.Header{
		dlq.HeaderSubject:                              {"orders.created"},
		dlq.OriginalPrefix + "Nats-Rollup":             {"all"},
		dlq.OriginalPrefix + "Nats-Trace-Dest":         {"traces.planter"},
		dlq.OriginalPrefix + "Nats-Schedule":           {"@every 1s"},
		dlq.OriginalPrefix + "Nats-Schedule-Target":    {"orders.paid"},
		dlq.OriginalPrefix + "Nats-TTL":                {"1h"},
		dlq.OriginalPrefix + "Nats-Required-Api-Level": {"1"},
		"X-App": {"kept"},
	}, "replayed")
	var results []dlq.ReplayResult
	sum, err := e.queue().Replay(ctx(t, 10*time.Second), dlq.Selection{Stream: "ORDERS"},
		dlq.ReplayOptions{Progress: func(r dlq.ReplayResult) { results = append(results, r) }})
	if err != nil || sum.Replayed != 1 {
		t.Fatalf("Replay = %+v, %v, %+v; want 1 replayed", sum, err, results)
	}
	got := e.originals()
	if len(got) != 3 {
		t.Fatalf("ORDERS holds %d messages, want the two stored since and the replay", len(got))
	}
	h := got[2].Header
	for _, name := range []string{"Nats-Rollup", "Nats-Trace-Dest", "Nats-Schedule", "Nats-Schedule-Target", "Nats-Required-Api-Level"} {
		if v := h.Get(name); v != "" {
			t.Errorf("republished with %s: %q", name, v)
		}
	}
	if h.Get("Nats-TTL") != "1h" || h.Get("X-App") != "kept" {
		t.Errorf("republished headers = %v, want Nats-TTL and X-App kept", h)
	}
	if m, err := trace.NextMsg(200 * time.Millisecond); err == nil {
		t.Errorf("a trace was published to %s", m.Subject)
	}
}
