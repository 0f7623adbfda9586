package dedup

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

// sharedScoped returns scope of s, failing the test on error.
func sharedScoped(t *testing.T, s *Shared, scope string, o SharedScopeOptions) *SharedScope {
	t.Helper()
	v, err := s.Scoped(scope, o)
	if err != nil {
		t.Fatalf("Scoped(%q): %v", scope, err)
	}
	return v
}

// TestSharedScopesApart: two couriers (replicas) each serving two
// consumers through scopes of one Shared store: a claim or a record in one
// scope is seen by the other replica in that scope only, and by a courier
// of before that opened its Shared store with the scope.
func TestSharedScopesApart(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	a := openShared(t, js, SharedOptions{Scope: "ORDERS/c"})
	b := openShared(t, js, SharedOptions{Scope: "ORDERS/c"})
	aOrders, aPay := sharedScoped(t, a, "ORDERS/c", SharedScopeOptions{}), sharedScoped(t, a, "PAYMENTS/c", SharedScopeOptions{})
	bOrders, bPay := sharedScoped(t, b, "ORDERS/c", SharedScopeOptions{}), sharedScoped(t, b, "PAYMENTS/c", SharedScopeOptions{})
	const key = "k"

	mustCheck(t, aPay, key, New)
	mustCheck(t, bPay, key, Claimed) // the claim is the scope's, on every replica
	mustCheck(t, bOrders, key, New)  // and no other scope's
	// The store's own methods are its scope's: b's own claim, a's too.
	mustCheck(t, b, key, Claimed)
	mustCheck(t, a, key, Claimed)
	mustCheck(t, aOrders, key, Claimed)

	if err := aPay.Record(ctx, key); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, bPay, key, Processed)
	wantSeen(t, bPay, key, true)
	mustCheck(t, bOrders, key, Claimed) // bOrders still holds ORDERS' claim
	if err := bOrders.Release(ctx, key); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, a, key, New) // released: a (its own scope, ORDERS) claims it
	if err := a.Record(ctx, key); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, bOrders, key, Processed)
	mustCheck(t, b, key, Processed)

	// A courier serving one consumer, its Shared store opened with the
	// scope, shares the keys: the same bucket subjects.
	pay := openShared(t, js, SharedOptions{Scope: "PAYMENTS/c"})
	mustCheck(t, pay, key, Processed)
	mustCheck(t, pay, "only-pay", New)
	mustCheck(t, bPay, "only-pay", Claimed)
	mustCheck(t, bOrders, "only-pay", New)

	if bPay.Scope() != "PAYMENTS/c" || bPay.Healthy() != nil {
		t.Errorf("Scope %q, Healthy %v", bPay.Scope(), bPay.Healthy())
	}
}

// TestSharedScopeClaimTTL: a scope's claims live its own ClaimTTL: renewed
// often enough while their holder lives (though the store's ClaimTTL is
// longer), lapsing after it once the holder is gone.
func TestSharedScopeClaimTTL(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	a := openShared(t, js, SharedOptions{}) // ClaimTTL 30s
	b := openShared(t, js, SharedOptions{})
	short := SharedScopeOptions{ClaimTTL: time.Second}
	aFast, bFast := sharedScoped(t, a, "FAST/c", short), sharedScoped(t, b, "FAST/c", short)

	mustCheck(t, aFast, "held", New)
	checkFor(t, bFast, "held", Claimed, 3*time.Second, "a live holder renews the scope's claim within its 1s claim TTL")

	if err := a.Close(); err != nil { // the courier dies holding the claim
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the claim lapses after the scope's claim TTL, not the store's 30s", func() bool {
		v, err := bFast.Check(context.Background(), "held")
		if err != nil {
			t.Fatal(err)
		}
		return v == New
	})
}

// TestSharedScopeTTL: a scope's keys live its own TTL in the bucket and in
// the local cache; a scope may not outlive the bucket.
func TestSharedScopeTTL(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	a := openShared(t, js, SharedOptions{}) // TTL 1h
	b := openShared(t, js, SharedOptions{})
	aShort := sharedScoped(t, a, "SHORT/c", SharedScopeOptions{TTL: 2 * time.Second})
	bShort := sharedScoped(t, b, "SHORT/c", SharedScopeOptions{TTL: 2 * time.Second})

	if err := aShort.Record(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	bk, err := aShort.bucketKey("k")
	if err != nil {
		t.Fatal(err)
	}
	r, err := a.readLast(ctx, bk)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.header.Get(jetstream.MsgTTLHeader); got != "2s" {
		t.Errorf("record's TTL in the bucket %q, want the scope's 2s", got)
	}
	mustCheck(t, bShort, "k", Processed)
	for _, v := range []*SharedScope{aShort, bShort} {
		poll.Until(t, 10*time.Second, "the key forgotten after the scope's TTL", func() bool {
			got, err := v.Check(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if got == New {
				if err := v.Release(ctx, "k"); err != nil {
					t.Fatal(err)
				}
			}
			return got == New
		})
	}

	tests := []struct {
		name, scope string
		o           SharedScopeOptions
		want        string
	}{
		{"TTL above the store's", "x", SharedScopeOptions{TTL: 2 * hour}, "at most"},
		{"TTL not whole seconds", "x", SharedScopeOptions{TTL: 1500 * time.Millisecond}, "whole seconds"},
		{"claim TTL under 1s", "x", SharedScopeOptions{ClaimTTL: time.Second / 2}, "whole seconds"},
		{"NUL", "a\x00b", SharedScopeOptions{}, "NUL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := a.Scoped(tt.scope, tt.o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Scoped(%q, %+v): %v, want an error saying %q", tt.scope, tt.o, err, tt.want)
			}
		})
	}
}

// TestSharedScopeRestart: a courier restarted keeps each scope's keys in
// its local cache, under the Badger keys a store opened with the scope
// reads, and finds in the bucket what it had not cached.
func TestSharedScopeRestart(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	dir := t.TempDir()

	s := openSharedIn(t, js, dir, SharedOptions{Scope: "ORDERS/c"})
	orders, pay := sharedScoped(t, s, "ORDERS/c", SharedScopeOptions{}), sharedScoped(t, s, "PAYMENTS/c", SharedScopeOptions{})
	for _, r := range []struct {
		v   *SharedScope
		key string
	}{{orders, "o"}, {pay, "p"}} {
		mustCheck(t, r.v, r.key, New)
		if err := r.v.Record(ctx, r.key); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := pay.Check(ctx, "p"); !errors.Is(err, ErrClosed) {
		t.Errorf("Check of a scope of a closed store: %v, want ErrClosed", err)
	}

	// Restarted with both consumers.
	s = openSharedIn(t, js, dir, SharedOptions{Scope: "ORDERS/c"})
	orders, pay = sharedScoped(t, s, "ORDERS/c", SharedScopeOptions{}), sharedScoped(t, s, "PAYMENTS/c", SharedScopeOptions{})
	for _, c := range []struct {
		v         *SharedScope
		key       string
		processed bool
	}{{orders, "o", true}, {pay, "p", true}, {orders, "p", false}, {pay, "o", false}} {
		wantSeen(t, c.v.local, c.key, c.processed) // cached locally
		want := New
		if c.processed {
			want = Processed
		}
		mustCheck(t, c.v, c.key, want)
		if err := c.v.Release(ctx, c.key); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Restarted serving payments alone, with a Shared store of that scope:
	// its own local keys are the scope's.
	s = openSharedIn(t, js, dir, SharedOptions{Scope: "PAYMENTS/c"})
	mustSeen(t, s.local, "p", true)
	mustSeen(t, s.local, "o", false)
	mustCheck(t, s, "p", Processed)
}
