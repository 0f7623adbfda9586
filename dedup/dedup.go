// Package dedup remembers which idempotency keys have been processed, so that
// a message delivered again (a redelivery after a lost ack, a restart, or a
// publisher that sent the same intent twice) is recognised as a duplicate.
//
// Store keeps the keys in an embedded Badger database sized for a sidecar, with
// a TTL per key. Record takes many keys at once and commits them together, so
// a caller that gathers the keys of concurrent deliveries (group commit) pays
// for one commit, and returns only once they are all committed: the caller
// acks a message only then (docs/behaviour.md#ack-only-after-the-key-is-recorded).
//
// Shared (shared.go) puts a replicated JetStream key-value bucket behind the
// same methods, with a Store as its local cache, so that several couriers of
// one durable share their keys and claim a key before calling the app.
//
// Keys are scoped (typically per stream and consumer). A store serves the
// scope it was opened with, and Scoped gives any other scope of the same
// store, so that a process serving several consumers opens one.
//
// The package knows nothing of HTTP; its callers declare the small interface
// they need (Check, Record, Release) and Store and Shared satisfy it.
package dedup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/internal/verdict"
)

// Defaults for the zero values of Options.
const (
	// DefaultGCInterval is how often the value log is garbage-collected when
	// Options.GCInterval is zero.
	DefaultGCInterval = 5 * time.Minute
	// DefaultCloseTimeout bounds Close when Options.CloseTimeout is zero.
	DefaultCloseTimeout = 5 * time.Second
)

// Verdict is Check's answer for a key (internal/verdict: the one type the
// delivery loop, which asks, and this package share).
type Verdict = verdict.Verdict

// Verdicts of Check.
const (
	// New: the key is not recorded. For a Shared store the caller now holds
	// the key's claim: it must end it with Record (after a 2xx) or Release
	// (after a failure). For a Store there is no claim.
	New = verdict.New
	// Processed: the key is recorded; the delivery is a duplicate, to be
	// acked without calling the app.
	Processed = verdict.Processed
	// Claimed: another courier holds a live claim on the key (Shared only):
	// hold the delivery and Check again later.
	Claimed = verdict.Claimed
)

// gcDiscardRatio is the share of a value-log file that must be garbage before
// RunValueLogGC rewrites it: Badger's own recommendation.
const gcDiscardRatio = 0.5

// keyPrefix starts every stored key. A fixed first byte keeps our keys out of
// Badger's reserved "!badger!" namespace whatever the scope, and leaves room
// for other kinds of record in the same database later.
const keyPrefix = 'k'

// maxKeySize is Badger's limit on the length of a key (txn.go). A longer key
// is refused in Record, before it could fail the whole batch it rides in.
const maxKeySize = 65000

// Errors returned by Store. Open's errors wrap ErrLocked or ErrCorrupt where
// they apply (or the underlying error otherwise); decide with errors.Is.
var (
	// ErrClosed is returned by Seen and Record after Close.
	ErrClosed = errors.New("dedup store is closed")
	// ErrLocked is wrapped by Open's error when another process, or another
	// Store in this process, holds the directory.
	ErrLocked = errors.New("dedup store is locked")
	// ErrCorrupt is wrapped by Open's error when the directory is usable
	// (writable, not locked) but Badger cannot open the store in it.
	ErrCorrupt = errors.New("dedup store is corrupt")
	// ErrEmptyKey is returned by Seen and Record for an empty key: an empty
	// key would make every keyless message a duplicate of the first.
	ErrEmptyKey = errors.New("dedup: empty idempotency key")
	// ErrKeyTooLong is returned by Seen and Record for a key that, with its
	// scope, exceeds Badger's key size limit (65000 bytes).
	ErrKeyTooLong = errors.New("dedup: idempotency key too long")
	// ErrDiskLow is wrapped by the errors of Check (for a key not recorded),
	// Record and Healthy while the free space of the store's file system is
	// below Options.DiskFloor: nothing is written then, since Badger dies
	// (SIGBUS) writing its memory-mapped log on a full disk.
	ErrDiskLow = errors.New("dedup: disk space low")
	// ErrCloseTimeout is wrapped by Close's error when the store could not
	// be closed within Options.CloseTimeout.
	ErrCloseTimeout = errors.New("dedup: close timed out")
)

// Options tunes a Store. TTL is required; every other zero value means the
// documented default.
type Options struct {
	// TTL is how long a recorded key is remembered. Required, at least one
	// second: Badger keeps expiry times in whole seconds, so a key is
	// forgotten between TTL-1s and TTL after it was recorded.
	TTL time.Duration
	// Scope prefixes every key the Store's own methods take (typically
	// stream/consumer), so that two consumers sharing a store never take
	// each other's keys for their own. It must not contain a NUL byte.
	// Empty means one unscoped key space. Scoped gives the keys of other
	// scopes in the same store.
	Scope string
	// Logger receives the store's logs and Badger's, narrowed with
	// component=dedup. Nil discards them.
	Logger *slog.Logger
	// Registerer receives the store's metrics (names prefixed
	// courier_dedup_); they are unregistered by Close. Nil means no metrics.
	Registerer prometheus.Registerer
	// GCInterval is how often the value log is garbage-collected.
	// Zero means DefaultGCInterval (5m).
	GCInterval time.Duration
	// DiskFloor is the free space, in bytes, of the store's file system
	// below which Check and Record refuse with ErrDiskLow and Healthy
	// reports it. Zero means DefaultDiskFloor (64 MiB); negative turns the
	// watch off.
	DiskFloor int64
	// DiskInterval is how often free space is measured. Zero means
	// DefaultDiskInterval (1s).
	DiskInterval time.Duration
	// CloseTimeout bounds Close. Zero means DefaultCloseTimeout (5s).
	CloseTimeout time.Duration
	// HighRate sizes Badger for keys recorded several times as fast as one
	// message a request records them, as batches do: memtables and tables
	// of 4 MiB rather than 1, and five level-0 tables before they are
	// compacted rather than three, so that fewer tables are built and
	// compacted per key (open.go). It costs about 20 MiB more resident
	// memory while keys are recorded.
	HighRate bool

	// diskFree measures free space; nil means statfs (tests fake a full
	// disk, which cannot be made for real).
	diskFree func(dir string) (int64, error)
}

// Store is the processed-key store on Badger. Create it with Open; the caller
// that opened it must call Close, which flushes pending records and stops the
// goroutines the store started.
//
// Its methods take keys in the scope it was opened with (Options.Scope);
// Scoped gives the keys of any other scope in the same store, so that one
// process serving several consumers opens its directory once (Badger locks
// it).
//
// Durability: Badger runs with SyncWrites off. A committed key is in the
// memory-mapped write-ahead log of Badger's memtable, that is in the OS page
// cache, so it survives the process being killed (kill -9, OOM kill, panic)
// but not the loss of the machine's power or kernel before the OS writes it
// back. An fsync per commit would cost several times the throughput.
//
// All methods are safe for concurrent use.
type Store struct {
	db  *badger.DB
	dir string
	log *slog.Logger

	// own is the scope the store was opened with, which its own methods
	// serve.
	own *StoreScope

	// mu guards closed: Record holds it for reading while it starts a
	// commit, so once Close has held it for writing no commit starts.
	mu     sync.RWMutex
	closed bool

	// ts is the commit timestamp last handed out (Badger runs in managed
	// mode). Versions only order a key's records; any later record of a
	// key is as good as an earlier one.
	ts atomic.Uint64

	// filter spares most checks of new keys a read of Badger. It holds
	// stored keys whole (scope included), so one serves every scope.
	filter *filter

	// writeKeys commits keys to live ttl (write; tests hold it to hold a
	// commit).
	writeKeys func(keys [][]byte, ttl time.Duration) error

	disk         *diskWatch
	closeTimeout time.Duration

	stop      chan struct{}  // closed by Close: stops the GC loop and the filter's load
	wg        sync.WaitGroup // the GC loop, the filter's load and the commits in progress
	closeOnce sync.Once
	closeErr  error

	m *metrics
}

// Seen reports whether key was recorded as processed and has not expired.
// It reads committed keys only: a key whose Record has not returned yet is
// not seen. It returns ErrClosed after Close.
func (s *Store) Seen(ctx context.Context, key string) (bool, error) { return s.own.Seen(ctx, key) }

// Check reports whether key was recorded as processed: Processed if so, New
// if not. A Store has no claims, so it never answers Claimed and New holds
// nothing (Release is a no-op). For a key not recorded it returns an error
// wrapping ErrDiskLow while free space is below the floor, so that no work
// starts whose key could not be recorded; a recorded key is still answered.
// Otherwise its errors are Seen's.
func (s *Store) Check(ctx context.Context, key string) (Verdict, error) { return s.own.Check(ctx, key) }

// Release does nothing: a Store holds no claims. It is there so that a Store
// and a Shared store serve the same callers.
func (s *Store) Release(context.Context, string) error { return nil }

// Record durably records keys as processed, to be remembered for
// Options.TTL. The keys are written together, in one Badger transaction (in
// several if they exceed Badger's transaction size), so a caller that gathers
// the keys of concurrent deliveries pays for one commit; concurrent Records
// are written together by Badger's own write batching. It returns once every
// key is committed (see Store for what survives what). It validates every key
// before writing any: an empty or too long key fails the call with
// ErrEmptyKey or ErrKeyTooLong and nothing is recorded; so does low disk
// space, with an error wrapping ErrDiskLow. If ctx ends first it returns
// ctx's error, and the keys may or may not be recorded. It returns ErrClosed
// after Close.
func (s *Store) Record(ctx context.Context, keys ...string) error { return s.own.Record(ctx, keys...) }

// QuickCheck reports true: Check answers from memory and the local disk,
// looking at its context only on entry, so a timeout of the caller's own
// would end nothing; the delivery loop gives it none (a context, a timer and
// a channel less per message).
func (s *Store) QuickCheck() bool { return true }

// Seen is Store.Seen for a key of this scope.
func (v *StoreScope) Seen(ctx context.Context, key string) (bool, error) {
	s := v.s
	defer since(s.m.duration.check, time.Now())
	if err := ctx.Err(); err != nil {
		return false, err
	}
	// Most keys checked are new and answered by the filter alone: built on
	// the stack for it, the key is copied to the heap only to read Badger.
	var buf [128]byte
	k, err := v.appendStoreKey(buf[:0], key)
	if err != nil {
		return false, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return false, ErrClosed
	}
	if s.filter.absent(k) {
		s.m.filterAbsent.Inc()
		return false, nil
	}
	// The newest version of the key, whatever its timestamp: a key is
	// visible once its Record's commit has written it.
	txn := s.db.NewTransactionAt(math.MaxUint64, false)
	_, err = txn.Get(bytes.Clone(k))
	txn.Discard()
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, badger.ErrKeyNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("dedup: check key: %w", err)
	}
}

// Check is Store.Check for a key of this scope.
func (v *StoreScope) Check(ctx context.Context, key string) (Verdict, error) {
	seen, err := v.Seen(ctx, key)
	switch {
	case err != nil:
		return New, err
	case seen:
		return Processed, nil
	}
	if err := v.s.disk.ok(); err != nil {
		return New, err
	}
	return New, nil
}

// Release does nothing: a Store holds no claims.
func (v *StoreScope) Release(context.Context, string) error { return nil }

// Healthy returns nil while the store can take writes; an error wrapping
// ErrDiskLow while free space is below the floor (or cannot be measured,
// as when the directory was removed), ErrClosed after Close. A caller should
// stop taking work while it reports an error.
func (s *Store) Healthy() error {
	s.mu.RLock()
	closed := s.closed
	s.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	return s.disk.ok()
}

// Record is Store.Record for keys of this scope, remembered for the
// scope's TTL.
func (v *StoreScope) Record(ctx context.Context, keys ...string) error {
	return v.record(ctx, v.ttl, keys)
}

// record is Record with the time the keys are to live (a Shared store caches
// a key for what is left of its life in the bucket).
func (v *StoreScope) record(ctx context.Context, ttl time.Duration, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	s := v.s
	defer since(s.m.duration.record, time.Now())
	// The stored keys share one array, sized for all so that it never
	// moves: one allocation for the batch rather than one per key.
	size := 0
	for _, key := range keys {
		size += len(v.prefix) + len(key)
	}
	buf := make([]byte, 0, size)
	sks := make([][]byte, len(keys))
	for i, key := range keys {
		start := len(buf)
		var err error
		if buf, err = v.appendStoreKey(buf, key); err != nil {
			return err
		}
		sks[i] = buf[start:len(buf):len(buf)]
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.disk.ok(); err != nil {
		s.m.recordErrors.Add(float64(len(sks)))
		return err
	}

	done := make(chan error, 1) // buffered: the commit never waits for a caller that left
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	// Into the filter before the commit: a key Badger holds is always in it.
	for _, k := range sks {
		s.filter.add(k)
	}
	// Close waits for the commit through wg: added under the read lock, so
	// before Close can start waiting.
	s.wg.Add(1)
	s.m.batchSize.Observe(float64(len(sks)))
	go func() {
		defer s.wg.Done()
		done <- s.commit(sks, ttl)
	}()
	s.mu.RUnlock()

	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close waits for the commits of the Records already started (whose
// callers may have stopped waiting), stops the store's goroutines and waits
// for them, unregisters its metrics and closes Badger, which flushes its
// memtable to disk.
//
// It returns within Options.CloseTimeout (5s by default) whatever happens.
// Badger retries a flush that fails (its directory removed, the disk full)
// every second without end; then Close returns an error wrapping
// ErrCloseTimeout and leaves that one goroutine behind, still trying: only
// acceptable because the caller is exiting. Keys committed before are in the
// write-ahead log, which the next Open replays, if the directory is still
// there.
//
// It is idempotent: later calls wait for the first and return its result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.stop)
		done := make(chan error, 1) // buffered: left behind, it never blocks
		go func() {
			s.wg.Wait()
			done <- s.db.Close()
		}()
		timer := time.NewTimer(s.closeTimeout)
		defer timer.Stop()
		select {
		case err := <-done:
			if err != nil {
				s.closeErr = fmt.Errorf("dedup store %s: close: %w", s.dir, err)
			}
		case <-timer.C:
			why := "Badger is still flushing its memtable"
			if _, err := os.Stat(s.dir); err != nil {
				why += ": " + err.Error()
			} else if err := s.disk.measure(); err != nil {
				why += ": " + err.Error()
			}
			s.closeErr = fmt.Errorf("dedup store %s: not closed within %s (%s): %w",
				s.dir, s.closeTimeout, why, ErrCloseTimeout)
			s.log.Error("dedup store not closed", "error", s.closeErr)
		}
		s.m.unregister()
	})
	return s.closeErr
}

// appendStoreKey appends to dst the Badger key for an idempotency key in
// this scope: keyPrefix, scope, NUL, key. A scope holds no NUL, so the
// first NUL ends it and no two (scope, key) pairs share a stored key.
func (v *StoreScope) appendStoreKey(dst []byte, key string) ([]byte, error) {
	if key == "" {
		return nil, ErrEmptyKey
	}
	if len(v.prefix)+len(key) > maxKeySize {
		return nil, fmt.Errorf("%w: %d bytes", ErrKeyTooLong, len(key))
	}
	dst = append(dst, v.prefix...)
	return append(dst, key...), nil
}

// commit writes keys in one transaction, or in as few as Badger's
// transaction size allows, and counts them.
func (s *Store) commit(keys [][]byte, ttl time.Duration) error {
	err := s.writeKeys(keys, ttl)
	if err != nil {
		s.m.recordErrors.Add(float64(len(keys)))
		s.log.Error("recording idempotency keys failed", "keys", len(keys), "error", err)
		return fmt.Errorf("dedup: record key: %w", err)
	}
	s.m.keysRecorded.Add(float64(len(keys)))
	return nil
}

// write commits keys to live ttl at a new timestamp, in parts if Badger
// finds the transaction too big.
func (s *Store) write(keys [][]byte, ttl time.Duration) error {
	txn := s.db.NewTransactionAt(math.MaxUint64, true)
	defer func() { txn.Discard() }()
	for i, k := range keys {
		e := badger.NewEntry(k, nil).WithTTL(ttl)
		err := txn.SetEntry(e)
		if errors.Is(err, badger.ErrTxnTooBig) && i > 0 {
			if err := txn.CommitAt(s.ts.Add(1), nil); err != nil {
				return err
			}
			txn = s.db.NewTransactionAt(math.MaxUint64, true)
			err = txn.SetEntry(e)
		}
		if err != nil {
			return err
		}
	}
	return txn.CommitAt(s.ts.Add(1), nil)
}

// every runs f every interval until Close: the store's background work
// (value-log GC, the free-space measure). The caller adds to s.wg.
func (s *Store) every(interval time.Duration, f func()) {
	defer s.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			f()
		}
	}
}

// runGC rewrites value-log files while Badger finds one worth rewriting.
// Idempotency keys carry empty values, which Badger keeps in the LSM tree, so
// the value log stays small and most runs rewrite nothing; the loop is there
// so that nothing grows without bound whatever Badger decides to put there.
func (s *Store) runGC() {
	s.m.gcRuns.Inc()
	// Versions at or below the discard timestamp that are expired or
	// superseded may be dropped by compaction and value-log GC. No reader
	// needs an old snapshot, so everything committed so far qualifies.
	s.db.SetDiscardTs(s.ts.Load())
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		err := s.db.RunValueLogGC(gcDiscardRatio)
		switch {
		case err == nil:
			s.m.gcRewrites.Inc()
		case errors.Is(err, badger.ErrNoRewrite), errors.Is(err, badger.ErrRejected):
			return
		default:
			s.log.Warn("value log GC failed", "error", err)
			return
		}
	}
}
