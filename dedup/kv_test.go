package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/internal/natstest"
)

func TestKVSharedStore(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	a, err := dedup.OpenKV(ctx, js, "COURIER_DEDUP_TEST", "ORDERS/courier", time.Hour, 1)
	if err != nil {
		t.Fatal(err)
	}
	// A second courier on the same bucket and scope sees the first's keys.
	b, err := dedup.OpenKV(ctx, js, "COURIER_DEDUP_TEST", "ORDERS/courier", time.Hour, 1)
	if err != nil {
		t.Fatal(err)
	}
	other, err := dedup.OpenKV(ctx, js, "COURIER_DEDUP_TEST", "ORDERS/other", time.Hour, 1)
	if err != nil {
		t.Fatal(err)
	}
	key := "order 7: any bytes \x00 at all"
	if seen, err := b.Seen(ctx, key); err != nil || seen {
		t.Fatalf("fresh key: seen %v, %v", seen, err)
	}
	if err := a.Record(ctx, key); err != nil {
		t.Fatal(err)
	}
	if seen, err := b.Seen(ctx, key); err != nil || !seen {
		t.Fatalf("key recorded by another courier: seen %v, %v", seen, err)
	}
	if seen, _ := other.Seen(ctx, key); seen {
		t.Error("scopes must not share keys")
	}
	// Recording a key that exists (a race between replicas) is fine.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Record(ctx, "raced"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if err := a.Record(ctx, key); err != nil {
		t.Errorf("record of an existing key: %v", err)
	}
	if _, err := a.Seen(ctx, ""); err == nil {
		t.Error("empty key accepted")
	}
}

func TestKVKeysExpire(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	kv, err := dedup.OpenKV(ctx, js, "COURIER_DEDUP_TTL", "S/c", time.Second, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Record(ctx, "brief"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		seen, err := kv.Seen(ctx, "brief")
		if err != nil {
			t.Fatal(err)
		}
		if !seen {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("key not forgotten after the bucket's TTL")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestKVRecordMany records a batch in one call, keys already there among
// them; a batch with an empty key records none.
func TestKVRecordMany(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	kv, err := dedup.OpenKV(ctx, js, "COURIER_DEDUP_MANY", "S/c", time.Hour, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Record(ctx, "k-3"); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprint("k-", i)
	}
	if err := kv.Record(ctx, keys...); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if seen, err := kv.Seen(ctx, k); err != nil || !seen {
			t.Fatalf("%s after a batch record: seen %v, %v", k, seen, err)
		}
	}
	if err := kv.Record(ctx, "x-1", "", "x-2"); !errors.Is(err, dedup.ErrEmptyKey) {
		t.Fatalf("batch with an empty key: %v, want ErrEmptyKey", err)
	}
	for _, k := range []string{"x-1", "x-2"} {
		if seen, err := kv.Seen(ctx, k); err != nil || seen {
			t.Errorf("%s of a refused batch: seen %v, %v", k, seen, err)
		}
	}
}
