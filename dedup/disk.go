package dedup

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// Defaults of the disk watch.
const (
	// DefaultDiskFloor is the free space below which the store stops
	// writing when Options.DiskFloor is zero. Badger writes keys into
	// memory-mapped files it creates sparse: the memtables' write-ahead logs
	// (2 × 2 MiB here) and the value log (mapped at 32 MiB). A write to a
	// page the file system cannot allocate kills the process with SIGBUS,
	// so the floor leaves room for all of them to fill (~36 MiB) plus the
	// tables a memtable flush and a compaction write (1 MiB each, a few at
	// once), with margin: 64 MiB.
	DefaultDiskFloor = 64 << 20
	// DefaultDiskInterval is how often free space is measured when
	// Options.DiskInterval is zero. At the rates courier records keys
	// (tens of thousands a second, ~100 bytes each) a second writes a few
	// MiB, far less than the floor.
	DefaultDiskInterval = time.Second
)

// errDiskUnsupported is what diskFree answers where it cannot measure: the
// watch is off there.
var errDiskUnsupported = errors.New("free space cannot be measured on this platform")

// diskWatch keeps the last measure of the free space of a store's file
// system, so that checks and records read an atomic rather than call statfs.
// Safe for concurrent use.
type diskWatch struct {
	dir   string
	floor int64 // negative: off
	free  func(dir string) (int64, error)
	log   *slog.Logger

	freeBytes atomic.Int64
	state     atomic.Pointer[error] // nil: healthy
}

func newDiskWatch(dir string, o Options, log *slog.Logger) *diskWatch {
	d := &diskWatch{dir: dir, floor: o.DiskFloor, free: o.diskFree, log: log}
	if d.floor == 0 {
		d.floor = DefaultDiskFloor
	}
	if d.free == nil {
		d.free = diskFree
	}
	d.freeBytes.Store(-1)
	if d.floor > 0 {
		_ = d.measure()
	}
	return d
}

// ok returns nil, or the error (wrapping ErrDiskLow) of the last measure.
func (d *diskWatch) ok() error {
	if p := d.state.Load(); p != nil {
		return *p
	}
	return nil
}

// measure measures free space now, keeps the result and returns it as ok
// would. A change of state is logged.
func (d *diskWatch) measure() error {
	if d.floor < 0 {
		return nil
	}
	free, err := d.free(d.dir)
	var state error
	switch {
	case errors.Is(err, errDiskUnsupported):
	case err != nil:
		d.freeBytes.Store(-1)
		state = fmt.Errorf("%w: cannot measure the free space of dedup store %s: %v "+
			"(was the directory removed?)", ErrDiskLow, d.dir, err)
	default:
		d.freeBytes.Store(free)
		if free < d.floor {
			state = fmt.Errorf("%w: %d MiB free on the file system of dedup store %s, under the floor of %d MiB "+
				"(free some space or give COURIER_DEDUP_DIR a larger volume; nothing is recorded meanwhile)",
				ErrDiskLow, free>>20, d.dir, d.floor>>20)
		}
	}
	var was error
	if state == nil {
		was = d.ok()
		d.state.Store(nil)
	} else if p := d.state.Swap(&state); p != nil {
		was = *p
	}
	switch {
	case state != nil && was == nil:
		d.log.Error("dedup store stops writing", "error", state)
	case state == nil && was != nil:
		d.log.Info("dedup store writes again: free space back above the floor", "free_bytes", free)
	}
	return state
}
