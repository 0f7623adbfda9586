package dedup

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/poll"
)

// deliveryStore is what the delivery loop asks of a store (proxy's Deduper
// and the optional interfaces it looks for), declared here since dedup may
// not import proxy.
type deliveryStore interface {
	Check(ctx context.Context, key string) (Verdict, error)
	Record(ctx context.Context, keys ...string) error
	Release(ctx context.Context, key string) error
	Seen(ctx context.Context, key string) (bool, error)
	Healthy() error
}

var (
	_ deliveryStore                  = (*StoreScope)(nil)
	_ deliveryStore                  = (*SharedScope)(nil)
	_ interface{ QuickCheck() bool } = (*StoreScope)(nil)
)

// scoped returns scope of s, failing the test on error.
func scoped(t *testing.T, s *Store, scope string, o ScopeOptions) *StoreScope {
	t.Helper()
	v, err := s.Scoped(scope, o)
	if err != nil {
		t.Fatalf("Scoped(%q): %v", scope, err)
	}
	return v
}

// wantSeen fails the test unless s says key is recorded (want) or not.
func wantSeen(t *testing.T, s interface {
	Seen(context.Context, string) (bool, error)
}, key string, want bool) {
	t.Helper()
	got, err := s.Seen(context.Background(), key)
	if err != nil {
		t.Fatalf("Seen(%q): %v", key, err)
	}
	if got != want {
		t.Fatalf("Seen(%q) = %v, want %v", key, got, want)
	}
}

// TestStoreScopesApart: keys recorded in one scope of a store are
// Processed there and New in every other; the scope the store was opened
// with is the store's own.
func TestStoreScopesApart(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir(), Options{Scope: "ORDERS/c"})
	own := scoped(t, s, "ORDERS/c", ScopeOptions{})
	pay := scoped(t, s, "PAYMENTS/c", ScopeOptions{})
	// "a"+"bc" and "ab"+"c" must not meet in one stored key.
	a, ab := scoped(t, s, "a", ScopeOptions{}), scoped(t, s, "ab", ScopeOptions{})

	steps := []struct {
		name   string
		record deliveryStore
		key    string
		want   map[deliveryStore]Verdict
	}{
		{"in a scope", pay, "k1", map[deliveryStore]Verdict{pay: Processed, own: New, s: New, a: New}},
		{"through the store", s, "k2", map[deliveryStore]Verdict{s: Processed, own: Processed, pay: New}},
		{"in the store's scope", own, "k3", map[deliveryStore]Verdict{s: Processed, own: Processed, pay: New}},
		{"scope a", a, "bc", map[deliveryStore]Verdict{a: Processed, ab: New, s: New}},
		{"scope ab", ab, "c", map[deliveryStore]Verdict{ab: Processed, a: New}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if err := st.record.Record(ctx, st.key); err != nil {
				t.Fatal(err)
			}
			for store, want := range st.want {
				mustCheck(t, store, st.key, want)
				wantSeen(t, store, st.key, want == Processed)
			}
		})
	}
	// a's "bc" is not ab's "c" either way round.
	mustCheck(t, ab, "c", Processed)
	mustCheck(t, a, "c", New)
	mustCheck(t, ab, "bc", New)

	// Asked again, a scope is the same keys.
	mustCheck(t, scoped(t, s, "PAYMENTS/c", ScopeOptions{}), "k1", Processed)
	if err := pay.Release(ctx, "k1"); err != nil {
		t.Errorf("Release: %v", err)
	}
	if !pay.QuickCheck() || pay.Healthy() != nil || pay.Scope() != "PAYMENTS/c" {
		t.Errorf("QuickCheck %v, Healthy %v, Scope %q", pay.QuickCheck(), pay.Healthy(), pay.Scope())
	}
}

// TestStoreScopeKeysAsOpened: a scope's keys are the Badger keys a store
// opened with that scope writes, so a process that goes from one consumer
// (a store per scope) to several (scopes of one store) and back finds
// every key, after each restart.
func TestStoreScopeKeysAsOpened(t *testing.T) {
	dir := t.TempDir()
	open := func(scope string) *Store {
		t.Helper()
		s, err := Open(dir, Options{TTL: hour, Scope: scope})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	closeStore := func(s *Store) {
		t.Helper()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// One consumer a process: a store opened with its scope.
	s := open("ORDERS/c")
	mustRecord(t, s, "one")
	closeStore(s)

	// Several: one store, a scope each.
	s = open("")
	orders := scoped(t, s, "ORDERS/c", ScopeOptions{})
	pay := scoped(t, s, "PAYMENTS/c", ScopeOptions{})
	mustCheck(t, orders, "one", Processed)
	mustCheck(t, pay, "one", New)
	for _, r := range []struct {
		v   *StoreScope
		key string
	}{{orders, "two"}, {pay, "pay"}} {
		if err := r.v.Record(context.Background(), r.key); err != nil {
			t.Fatal(err)
		}
	}
	// Stored exactly as keyPrefix, scope, NUL, key.
	txn := s.db.NewTransactionAt(math.MaxUint64, false)
	for _, k := range []string{"kORDERS/c\x00one", "kORDERS/c\x00two", "kPAYMENTS/c\x00pay"} {
		if _, err := txn.Get([]byte(k)); err != nil {
			t.Errorf("Badger key %q: %v", k, err)
		}
	}
	txn.Discard()
	closeStore(s)

	// Restarted with the same scopes: each finds its keys.
	s = open("")
	wantSeen(t, scoped(t, s, "ORDERS/c", ScopeOptions{}), "one", true)
	wantSeen(t, scoped(t, s, "ORDERS/c", ScopeOptions{}), "two", true)
	wantSeen(t, scoped(t, s, "PAYMENTS/c", ScopeOptions{}), "pay", true)
	wantSeen(t, scoped(t, s, "PAYMENTS/c", ScopeOptions{}), "two", false)
	closeStore(s)

	// Back to one consumer a process: each store finds its scope's keys.
	s = open("PAYMENTS/c")
	mustSeen(t, s, "pay", true)
	mustSeen(t, s, "one", false)
	closeStore(s)
	s = open("ORDERS/c")
	mustSeen(t, s, "one", true)
	mustSeen(t, s, "two", true)
	mustSeen(t, s, "pay", false)
	closeStore(s)
}

// TestStoreScopeFilter: the key filter, loaded when the store opens, holds
// every scope's keys, so once it is trusted a scope still sees the keys it
// recorded before the restart, and it answers new keys of any scope
// without a read.
func TestStoreScopeFilter(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{TTL: hour, Scope: "ORDERS/c"})
	if err != nil {
		t.Fatal(err)
	}
	pay := scoped(t, s, "PAYMENTS/c", ScopeOptions{})
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("pay-", i)
	}
	if err := pay.Record(context.Background(), keys...); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	s = openStore(t, dir, Options{Scope: "ORDERS/c", Registerer: reg})
	waitFilterReady(t, s)
	pay = scoped(t, s, "PAYMENTS/c", ScopeOptions{})
	for _, k := range keys {
		mustCheck(t, pay, k, Processed)
		mustSeen(t, s, k, false)
	}
	before := metricstest.Value(t, reg, "courier_dedup_filter_absent_total")
	for i := range 100 {
		wantSeen(t, pay, fmt.Sprint("new-", i), false)
	}
	if got := metricstest.Value(t, reg, "courier_dedup_filter_absent_total") - before; got < 95 {
		t.Errorf("filter answered %v of 100 checks of new keys in a scope, want nearly all", got)
	}
	// Recorded after the load, through a scope: seen, never answered
	// absent by the filter.
	if err := pay.Record(context.Background(), "after"); err != nil {
		t.Fatal(err)
	}
	before = metricstest.Value(t, reg, "courier_dedup_filter_absent_total")
	wantSeen(t, pay, "after", true)
	if got := metricstest.Value(t, reg, "courier_dedup_filter_absent_total"); got != before {
		t.Errorf("filter answered a recorded key absent")
	}
}

// TestStoreScopeTTL: a scope remembers its keys for its own TTL, the
// store's by default.
func TestStoreScopeTTL(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{Scope: "ORDERS/c"})
	short := scoped(t, s, "SHORT/c", ScopeOptions{TTL: 2 * time.Second})
	long := scoped(t, s, "LONG/c", ScopeOptions{})
	if long.ttl != hour {
		t.Errorf("scope TTL %v, want the store's %v", long.ttl, hour)
	}
	for _, v := range []*StoreScope{short, long} {
		if err := v.Record(context.Background(), "k"); err != nil {
			t.Fatal(err)
		}
	}
	// Badger keeps expiry in whole seconds: a key of a 2s TTL lives
	// between 1s and 2s.
	poll.Until(t, 5*time.Second, "the short scope's key forgotten", func() bool {
		seen, err := short.Seen(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		return !seen
	})
	wantSeen(t, long, "k", true)
}

// TestStoreScopedRefuses: a scope with a NUL byte, or a TTL under a
// second, is refused; a scope of a closed store answers ErrClosed.
func TestStoreScopedRefuses(t *testing.T) {
	s, err := Open(t.TempDir(), Options{TTL: hour})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, scope string
		ttl         time.Duration
		want        string
	}{
		{"NUL", "a\x00b", 0, "NUL"},
		{"short TTL", "a", time.Second / 2, "at least 1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Scoped(tt.scope, ScopeOptions{TTL: tt.ttl})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Scoped(%q, %v): %v, want an error saying %q", tt.scope, tt.ttl, err, tt.want)
			}
		})
	}
	v := scoped(t, s, "a", ScopeOptions{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Check(context.Background(), "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("Check after Close: %v, want ErrClosed", err)
	}
	if err := v.Record(context.Background(), "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("Record after Close: %v, want ErrClosed", err)
	}
	if err := v.Healthy(); !errors.Is(err, ErrClosed) {
		t.Errorf("Healthy after Close: %v, want ErrClosed", err)
	}
}
