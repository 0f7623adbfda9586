package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natstest"
)

// countingStore is a real Badger store that notes each Record call's keys.
type countingStore struct {
	*dedup.Store
	mu    sync.Mutex
	calls [][]string
}

func (s *countingStore) Record(ctx context.Context, keys ...string) error {
	s.mu.Lock()
	s.calls = append(s.calls, append([]string(nil), keys...))
	s.mu.Unlock()
	return s.Store.Record(ctx, keys...)
}

func (s *countingStore) recorded() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]string(nil), s.calls...)
}

// TestRecorderGathersSuccessiveMessages: at 1 in flight, the keys of
// messages delivered one after another within the recorder's linger are
// recorded in one call to the store.
func TestRecorderGathersSuccessiveMessages(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{
		Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5,
	})
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	for i := range n {
		if _, err := js.Publish(ctx, "s.x", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := dedup.Open(t.TempDir(), dedup.Options{TTL: time.Hour, Scope: "S/c"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cs := &countingStore{Store: st}
	app := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer app.Close()
	r, err := New(cons, dlq.NewPublisher(js, "dlq.s"), cs, Options{
		AppURL: app.URL, Stream: "S", Consumer: "c", MaxInflight: 1, Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	// Long enough for the app to answer every message, one at a time,
	// before the first batch is recorded.
	r.settle.linger = 5 * time.Second
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(rctx); close(done) }()
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := cons.Info(ctx)
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every message was acked: %+v, %v", info, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	calls := cs.recorded()
	if len(calls) != 1 || len(calls[0]) != n {
		t.Fatalf("record calls %q, want one with all %d keys", calls, n)
	}
	for _, k := range calls[0] {
		seen, err := st.Seen(ctx, k)
		if err != nil || !seen {
			t.Errorf("key %q: seen %v, %v; want recorded", k, seen, err)
		}
	}
}
