package proxy_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/nats-io/nats.go/jetstream"
)

// A store that fails to record after a 2xx: the messages are acked anyway
// (the effect happened), every key of the failed batch counted, and the keys
// of later batches recorded.
func TestStoreRecordErrorStillAcks(t *testing.T) {
	e := setup(t)
	fs := &flakyStore{checker: openStore(t)}
	fs.recordFails.Store(1)
	const n = 50
	for i := range n {
		if _, err := e.js.Publish(context.Background(), fmt.Sprint("s.", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	e.run(t, fs)
	poll.Until(t, 10*time.Second, "every message acked", func() bool { return e.calls.Load() == n && e.settled(t) })
	failed := fs.failedKeys.Load()
	if failed == 0 {
		t.Fatal("no Record call failed")
	}
	if got := counter(t, e.reg, "courier_dedup_errors_total", "record"); got != float64(failed) {
		t.Errorf("record errors counted %v, want %d (every key of the failed batch)", got, failed)
	}
	if got := counter(t, e.reg, "courier_messages_total", "delivered"); got != n {
		t.Errorf("%v delivered, want %d", got, n)
	}
}

// batchWatcher is a store that commits slowly (a busy disk) and checks, at
// each Record, that none of the messages whose keys it records has been
// acked yet.
type batchWatcher struct {
	checker
	cons      jetstream.Consumer
	calls     atomic.Int32
	keys      atomic.Int32
	early     atomic.Int32 // keys recorded after their message was acked
	maxKeysIn atomic.Int32
}

func (b *batchWatcher) Record(ctx context.Context, keys ...string) error {
	b.calls.Add(1)
	b.keys.Add(int32(len(keys)))
	if n := int32(len(keys)); n > b.maxKeysIn.Load() {
		b.maxKeysIn.Store(n) // one recorder calls Record: no race to lose
	}
	info, err := b.cons.Info(ctx)
	if err != nil {
		return err
	}
	if info.NumAckPending < len(keys) {
		b.early.Add(int32(len(keys) - info.NumAckPending))
	}
	time.Sleep(20 * time.Millisecond)
	return b.Store.Record(ctx, keys...)
}

// The keys of concurrent deliveries are recorded together, each message
// acked only after its key is recorded.
func TestKeysOfConcurrentDeliveriesRecordedTogether(t *testing.T) {
	e := setup(t)
	bw := &batchWatcher{checker: openStore(t), cons: e.cons}
	const n = 300
	for i := range n {
		if _, err := e.js.Publish(context.Background(), fmt.Sprint("s.", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	e.run(t, bw)
	poll.Until(t, 10*time.Second, "every message delivered and acked", func() bool { return e.calls.Load() == n && e.settled(t) })
	if got := bw.keys.Load(); got != n {
		t.Errorf("%d keys recorded, want %d", got, n)
	}
	if got := bw.early.Load(); got != 0 {
		t.Errorf("%d messages acked before their key was recorded", got)
	}
	calls := bw.calls.Load()
	if calls > n/4 {
		t.Errorf("%d Record calls for %d deliveries: want their keys recorded together", calls, n)
	}
	t.Logf("%d keys in %d Record calls, at most %d in one", n, calls, bw.maxKeysIn.Load())
}
