package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/internal/metricstest"
)

// durationCounts returns the sample counts of courier_dedup_duration_seconds
// {op="check"} and {op="record"}, failing t unless those are its only two
// series.
func durationCounts(t *testing.T, reg *prometheus.Registry) (check, record float64) {
	t.Helper()
	if n, err := testutil.GatherAndCount(reg, "courier_dedup_duration_seconds"); err != nil || n != 2 {
		t.Fatalf("courier_dedup_duration_seconds has %d series (%v), want check and record", n, err)
	}
	return metricstest.Value(t, reg, "courier_dedup_duration_seconds", "op", "check"),
		metricstest.Value(t, reg, "courier_dedup_duration_seconds", "op", "record")
}

// checkDurations uses a store (seen: its Seen; record: its Record) and
// checks that both ops are served from the start and count each call.
func checkDurations(t *testing.T, reg *prometheus.Registry, seen func(string) (bool, error), record func(...string) error) {
	t.Helper()
	if check, record := durationCounts(t, reg); check != 0 || record != 0 {
		t.Fatalf("durations before use: %v checks, %v records; want 0", check, record)
	}
	if _, err := seen("k"); err != nil {
		t.Fatal(err)
	}
	if err := record("k", "k2"); err != nil {
		t.Fatal(err)
	}
	if _, err := seen("k"); err != nil {
		t.Fatal(err)
	}
	if check, record := durationCounts(t, reg); check != 2 || record != 1 {
		t.Errorf("durations: %v checks, %v records; want 2 and 1", check, record)
	}
}

func TestStoreDurations(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := dedup.Open(t.TempDir(), dedup.Options{TTL: time.Hour, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	checkDurations(t, reg,
		func(k string) (bool, error) { return s.Seen(ctx, k) },
		func(k ...string) error { return s.Record(ctx, k...) })
}
