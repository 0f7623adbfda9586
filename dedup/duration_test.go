package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dedup"
)

// durationCounts returns the sample count of courier_dedup_duration_seconds
// by op.
func durationCounts(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "courier_dedup_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" {
					out[l.GetValue()] = m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return out
}

// checkDurations uses a store (seen: its Seen; record: its Record) and
// checks that both ops are served from the start and count each call.
func checkDurations(t *testing.T, reg *prometheus.Registry, seen func(string) (bool, error), record func(...string) error) {
	t.Helper()
	if got := durationCounts(t, reg); len(got) != 2 || got["check"] != 0 || got["record"] != 0 {
		t.Fatalf("durations before use = %v, want check and record at 0", got)
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
	if got := durationCounts(t, reg); got["check"] != 2 || got["record"] != 1 {
		t.Errorf("durations = %v, want 2 checks and 1 record", got)
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
