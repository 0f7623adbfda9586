package dedup

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/poll"
)

// TestDiskLow fakes the free space (a full disk cannot be made in a test):
// below the floor Check refuses new keys, still answers recorded ones,
// Record refuses and writes nothing, Healthy and the metric report it; above
// it again everything works.
func TestDiskLow(t *testing.T) {
	var free atomic.Int64
	free.Store(1 << 30)
	reg := prometheus.NewRegistry()
	s := openStore(t, t.TempDir(), Options{
		Registerer:   reg,
		DiskFloor:    64 << 20,
		DiskInterval: 5 * time.Millisecond,
		diskFree:     func(string) (int64, error) { return free.Load(), nil },
	})
	ctx := context.Background()
	mustRecord(t, s, "before")
	if err := s.Healthy(); err != nil {
		t.Fatalf("Healthy with 1 GiB free: %v", err)
	}

	free.Store(10 << 20)
	poll.Until(t, 15*time.Second, "Healthy reports the low disk", func() bool {
		return errors.Is(s.Healthy(), ErrDiskLow)
	})
	t.Logf("Healthy: %v", s.Healthy())
	if got := metricstest.Value(t, reg, "courier_dedup_disk_free_bytes"); got != 10<<20 {
		t.Errorf("courier_dedup_disk_free_bytes = %v, want %d", got, 10<<20)
	}
	if err := s.Record(ctx, "during"); !errors.Is(err, ErrDiskLow) {
		t.Errorf("Record with a low disk: %v, want ErrDiskLow", err)
	}
	if v, err := s.Check(ctx, "new"); !errors.Is(err, ErrDiskLow) {
		t.Errorf("Check of a new key with a low disk: %v %v, want ErrDiskLow", v, err)
	}
	if v, err := s.Check(ctx, "before"); err != nil || v != Processed {
		t.Errorf("Check of a recorded key with a low disk: %v %v, want processed", v, err)
	}

	free.Store(1 << 30)
	poll.Until(t, 15*time.Second, "Healthy again", func() bool { return s.Healthy() == nil })
	mustSeen(t, s, "during", false)
	if v, err := s.Check(ctx, "during"); err != nil || v != New {
		t.Errorf("Check after recovery: %v %v, want new", v, err)
	}
	mustRecord(t, s, "during")
}

// TestDiskLowAtOpen: a store opened on a full disk is unhealthy at once.
func TestDiskLowAtOpen(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{diskFree: func(string) (int64, error) { return 1 << 20, nil }})
	if err := s.Healthy(); !errors.Is(err, ErrDiskLow) {
		t.Fatalf("Healthy: %v, want ErrDiskLow", err)
	}
	if err := s.Record(context.Background(), "k"); !errors.Is(err, ErrDiskLow) {
		t.Fatalf("Record: %v, want ErrDiskLow", err)
	}
}

// TestDirRemovedUnderStore removes the directory of an open store: Healthy
// reports it, and Close returns within its bound with an error although
// Badger never finishes flushing.
func TestDirRemovedUnderStore(t *testing.T) {
	dir := t.TempDir()
	const bound = time.Second
	s, err := Open(dir, Options{TTL: hour, CloseTimeout: bound, DiskInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		mustRecord(t, s, "k"+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 15*time.Second, "Healthy reports the removed directory", func() bool {
		return errors.Is(s.Healthy(), ErrDiskLow)
	})
	t.Logf("Healthy: %v", s.Healthy())

	began := time.Now()
	err = s.Close()
	took := time.Since(began)
	t.Logf("Close after %v: %v", took.Round(time.Millisecond), err)
	if err == nil {
		t.Error("Close of a store whose directory was removed reported no error")
	}
	if took > bound+2*time.Second {
		t.Errorf("Close took %v, bound %v", took, bound)
	}
	if err2 := s.Close(); err2 != err {
		t.Errorf("second Close: %v, want the first's result", err2)
	}
}
