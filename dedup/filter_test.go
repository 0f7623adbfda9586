package dedup

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/poll"
)

// TestFilterAnswersNewKeys: once loaded, the filter answers checks of new
// keys without a read, and never answers for a recorded key.
func TestFilterAnswersNewKeys(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := openStore(t, t.TempDir(), Options{Registerer: reg})
	waitFilterReady(t, s)
	for i := range 100 {
		mustSeen(t, s, fmt.Sprint("new-", i), false)
	}
	if got := metricstest.Value(t, reg, "courier_dedup_filter_absent_total"); got < 95 {
		t.Errorf("filter answered %v of 100 checks of new keys, want nearly all", got)
	}
	for i := range 100 {
		mustRecord(t, s, fmt.Sprint("new-", i))
	}
	before := metricstest.Value(t, reg, "courier_dedup_filter_absent_total")
	for i := range 100 {
		mustSeen(t, s, fmt.Sprint("new-", i), true)
	}
	if got := metricstest.Value(t, reg, "courier_dedup_filter_absent_total"); got != before {
		t.Errorf("filter answered %v checks of recorded keys", got-before)
	}
}

// TestFilterLoadsStoredKeys: reopened, the store loads its keys into the
// filter (every scope's, since any may be asked through Scoped), while keys
// recorded during the load are added too; every one is seen.
func TestFilterLoadsStoredKeys(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{TTL: hour, Scope: "c"})
	if err != nil {
		t.Fatal(err)
	}
	const stored = 30000
	keys := make([]string, stored)
	for i := range keys {
		keys[i] = fmt.Sprint("stored-", i)
	}
	if err := s.Record(context.Background(), keys...); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	other := openStore(t, dir, Options{Scope: "other"})
	mustRecord(t, other, "stored-0")
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}

	// Loaded alone: exactly the stored keys, of both scopes.
	s, err = Open(dir, Options{TTL: hour, Scope: "c"})
	if err != nil {
		t.Fatal(err)
	}
	waitFilterReady(t, s)
	if got := s.filter.added.Load(); got != stored+1 {
		t.Errorf("filter holds %d keys, want the %d stored in both scopes", got, stored+1)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// A key recorded while the load may still run (the load may then find
	// it as well): in the filter either way.
	s = openStore(t, dir, Options{Scope: "c"})
	mustRecord(t, s, "during-load")
	waitFilterReady(t, s)
	for _, k := range keys {
		mustSeen(t, s, k, true)
	}
	mustSeen(t, s, "during-load", true)
}

// TestFilterFalsePositives checks the filter's sizing: with 200,000 keys,
// few other keys are taken for stored ones.
func TestFilterFalsePositives(t *testing.T) {
	f := newFilter()
	const n = 200_000
	for i := range n {
		f.add(fmt.Appendf(nil, "key-%d", i))
	}
	f.ready.Store(true)
	for i := range n {
		if f.absent(fmt.Appendf(nil, "key-%d", i)) {
			t.Fatalf("key-%d added but reported absent", i)
		}
	}
	const probes = 100_000
	fp := 0
	for i := range probes {
		if !f.absent(fmt.Appendf(nil, "other-%d", i)) {
			fp++
		}
	}
	// Expected about 0.09% (90 in 100,000).
	if fp > probes/200 {
		t.Errorf("%d of %d keys never added reported maybe-present, want under 0.5%%", fp, probes)
	}
	t.Logf("false positives: %d of %d", fp, probes)
}

// TestFilterBypassedWhenFull: past its capacity the filter answers nothing,
// so a key it could not take is never reported absent.
func TestFilterBypassedWhenFull(t *testing.T) {
	f := newFilter()
	f.capacity = 10
	f.ready.Store(true)
	for i := range 10 {
		f.add(fmt.Appendf(nil, "key-%d", i))
	}
	if !f.absent([]byte("unseen")) {
		t.Fatal("filter at capacity: want it still answering")
	}
	f.add([]byte("one-too-many"))
	if f.absent([]byte("one-too-many")) || f.absent([]byte("unseen")) {
		t.Error("filter past capacity reported a key absent")
	}
}

// TestFilterNotTrustedBeforeLoad: before the load finishes, absent says
// nothing.
func TestFilterNotTrustedBeforeLoad(t *testing.T) {
	f := newFilter()
	if f.absent([]byte("k")) {
		t.Error("filter not loaded reported a key absent")
	}
}

func waitFilterReady(t *testing.T, s *Store) {
	t.Helper()
	poll.Until(t, 10*time.Second, "key filter loaded", s.filter.ready.Load)
}

// BenchmarkSeen checks new keys (the common case) in a store holding
// 300,000 keys, answered by the filter and, for comparison, by Badger.
func BenchmarkSeen(b *testing.B) {
	s, err := Open(b.TempDir(), Options{TTL: hour, Scope: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	keys := make([]string, 1000)
	for i := range 300 {
		for j := range keys {
			keys[j] = fmt.Sprint("stored-", i*len(keys)+j)
		}
		if err := s.Record(context.Background(), keys...); err != nil {
			b.Fatal(err)
		}
	}
	for !s.filter.ready.Load() {
		time.Sleep(time.Millisecond)
	}
	for _, useFilter := range []bool{true, false} {
		b.Run(fmt.Sprint("filter=", useFilter), func(b *testing.B) {
			s.filter.ready.Store(useFilter)
			ctx := context.Background()
			b.ResetTimer()
			for i := range b.N {
				if seen, err := s.Seen(ctx, fmt.Sprint("new-", i)); err != nil || seen {
					b.Fatal(seen, err)
				}
			}
		})
	}
}
