package proxy_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/proxy"
	"github.com/courierhq/courier/success"
)

// records returns every success record stored on subj.
func records(t *testing.T, js jetstream.JetStream, subj string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	name, err := js.StreamNameBySubject(ctx, subj)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		out = append(out, m)
	}
	return out
}

// The app's answer to each 2xx is stored as a success record before the
// original is acked: body and headers, courier's own, the final attempt of a
// retried message; one record per key, duplicates publishing nothing.
func TestSuccessRecords(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, _, err := success.EnsureStream(ctx, e.js, "ok.s", 1, dlq.CheckStream); err != nil {
		t.Fatal(err)
	}
	var first atomic.Bool
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(proxy.HeaderIdempotencyKey) == "retried" && !first.Swap(true) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("X-Order", "42")
		w.Header().Set("Connection", "keep-alive")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("answer to " + r.Header.Get(proxy.HeaderIdempotencyKey)))
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
	for _, k := range []string{"a", "retried", "a"} { // the second "a" is a duplicate
		m := nats.NewMsg("s.x")
		m.Header.Set(proxy.HeaderIdempotencyKey, k)
		if _, err := e.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = e.runWith(t, openStore(t), proxy.Options{
		Success: success.NewPublisher(e.js, "ok.s"), MaxDeliver: 3,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
	})
	waitFor(t, "every message settled", func() bool { return e.settled(t) })
	recs := records(t, e.js, "ok.s")
	if len(recs) != 2 {
		t.Fatalf("%d success records, want 2 (one per key)", len(recs))
	}
	byKey := map[string]*jetstream.RawStreamMsg{}
	for _, m := range recs {
		byKey[m.Header.Get(success.HeaderKey)] = m
	}
	a, retried := byKey["a"], byKey["retried"]
	if a == nil || retried == nil {
		t.Fatalf("records by key: %v", byKey)
	}
	if string(a.Data) != "answer to a" || a.Header.Get(success.HeaderStatus) != "201" || a.Header.Get("X-Order") != "42" {
		t.Errorf("record of a: %q %v", a.Data, a.Header)
	}
	if a.Header.Get("Connection") != "" {
		t.Errorf("hop-by-hop header kept: %v", a.Header)
	}
	if got := retried.Header.Get(success.HeaderAttempt); got != strconv.Itoa(2) {
		t.Errorf("record of a retried message carries attempt %q, want 2", got)
	}
	if got := counter(t, e.reg, "courier_success_records_total", ""); got != 2 {
		t.Errorf("courier_success_records_total %v, want 2", got)
	}
}

// lostAck stores the record for real but reports a failure the first time,
// as when the acknowledgement is lost (or courier dies) after the publish.
type lostAck struct {
	*success.Publisher
	lost atomic.Bool
}

func (l *lostAck) Publish(ctx context.Context, r success.Record) error {
	err := l.Publisher.Publish(ctx, r)
	if err == nil && !l.lost.Swap(true) {
		return context.DeadlineExceeded
	}
	return err
}

// A record published again after its acknowledgement was lost is stored
// once, and the app is not called again for it.
func TestSuccessRecordOnceWhenAckLost(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, _, err := success.EnsureStream(ctx, e.js, "ok.s", 1, dlq.CheckStream); err != nil {
		t.Fatal(err)
	}
	e.publish(t, 1, []byte("x"))
	_, _ = e.runWith(t, openStore(t), proxy.Options{Success: &lostAck{Publisher: success.NewPublisher(e.js, "ok.s")}})
	waitFor(t, "the message settled", func() bool { return e.settled(t) })
	if got := len(records(t, e.js, "ok.s")); got != 1 {
		t.Errorf("%d success records, want 1", got)
	}
	if got := e.calls.Load(); got != 1 {
		t.Errorf("app called %d times, want 1", got)
	}
}

// stuckAfterPublish stores the record for real, then fails every time: as if
// courier died between the publish and the ack.
type stuckAfterPublish struct{ *success.Publisher }

func (s stuckAfterPublish) Publish(ctx context.Context, r success.Record) error {
	if err := s.Publisher.Publish(ctx, r); err != nil {
		return err
	}
	return errors.New("killed before the ack")
}

// Courier dies between the record's publish and the ack: the message comes
// back, the app is called again (its key was not recorded), and the record,
// published again under the same Nats-Msg-Id, is stored once.
func TestSuccessRecordOnceAcrossAKill(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, _, err := success.EnsureStream(ctx, e.js, "ok.s", 1, dlq.CheckStream); err != nil {
		t.Fatal(err)
	}
	store := openStore(t)
	e.publish(t, 1, []byte("x"))
	_, stopA := e.runWith(t, store, proxy.Options{Success: stuckAfterPublish{success.NewPublisher(e.js, "ok.s")}})
	waitFor(t, "the first record stored", func() bool { return len(records(t, e.js, "ok.s")) == 1 })
	stopA() // the held message is given back
	e.reg = prometheus.NewRegistry()
	_, _ = e.runWith(t, store, proxy.Options{Success: success.NewPublisher(e.js, "ok.s")})
	waitFor(t, "the message settled", func() bool { return e.settled(t) })
	if got := e.calls.Load(); got != 2 {
		t.Errorf("app called %d times, want 2 (once before the kill, once after)", got)
	}
	if got := len(records(t, e.js, "ok.s")); got != 1 {
		t.Errorf("%d success records, want 1", got)
	}
}
