// Package dedup remembers which idempotency keys have been processed, so that
// a message delivered again (a redelivery after a lost ack, a restart, or a
// publisher that sent the same intent twice) is recognised as a duplicate.
//
// Store keeps the keys in an embedded Badger database sized for a sidecar, with
// a TTL per key and group commit: concurrent Record calls are written together
// in one Badger transaction, and each returns only once its key is committed.
//
// The package knows nothing of HTTP or of JetStream; its callers declare the
// small interface they need (Seen and Record) and Store satisfies it.
package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults for the zero values of Options.
const (
	// DefaultGCInterval is how often the value log is garbage-collected when
	// Options.GCInterval is zero.
	DefaultGCInterval = 5 * time.Minute
	// DefaultMaxBatch is how many keys one commit may carry when
	// Options.MaxBatch is zero.
	DefaultMaxBatch = 256
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
)

// Options tunes a Store. TTL is required; every other zero value means the
// documented default.
type Options struct {
	// TTL is how long a recorded key is remembered. Required, at least one
	// second: Badger keeps expiry times in whole seconds, so a key is
	// forgotten between TTL-1s and TTL after it was recorded.
	TTL time.Duration
	// Scope prefixes every key (typically the consumer name), so that two
	// consumers sharing a store never take each other's keys for their own.
	// It must not contain a NUL byte. Empty means one unscoped key space.
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
	// MaxBatch is the most keys written in one commit. Zero means
	// DefaultMaxBatch (256); 1 disables group commit.
	MaxBatch int
}

// Store is the processed-key store on Badger. Create it with Open; the caller
// that opened it must call Close, which flushes pending records and stops the
// goroutines the store started.
//
// Durability: Badger runs with SyncWrites off. A committed key is in the
// memory-mapped write-ahead log of Badger's memtable, that is in the OS page
// cache, so it survives the process being killed (kill -9, OOM kill, panic)
// but not the loss of the machine's power or kernel before the OS writes it
// back. An fsync per commit would cost several times the throughput.
//
// All methods are safe for concurrent use.
type Store struct {
	db       *badger.DB
	dir      string
	log      *slog.Logger
	ttl      time.Duration
	scope    []byte // keyPrefix + Scope + NUL
	maxBatch int

	// mu guards closed and the sending side of reqs: senders hold it for
	// reading, so once Close holds it for writing no send is in flight and
	// reqs can be closed.
	mu     sync.RWMutex
	closed bool
	reqs   chan *request

	stop      chan struct{} // closed by Close: stops the GC loop
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	m *metrics
}

// request is one Record waiting for its key to be committed.
type request struct {
	key  []byte
	done chan error // buffered: the committer never blocks on a caller that left
}

// Seen reports whether key was recorded as processed and has not expired.
// It reads committed keys only: a key whose Record has not returned yet is
// not seen. It returns ErrClosed after Close.
func (s *Store) Seen(ctx context.Context, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	k, err := s.storeKey(key)
	if err != nil {
		return false, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return false, ErrClosed
	}
	err = s.db.View(func(txn *badger.Txn) error {
		_, err := txn.Get(k)
		return err
	})
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, badger.ErrKeyNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("dedup: check key: %w", err)
	}
}

// Record durably records key as processed, to be remembered for Options.TTL.
// It returns once the key is committed (see Store for what survives what),
// together with the keys of concurrent callers. If ctx ends first it returns
// ctx's error, and the key may or may not be recorded. It returns ErrClosed
// after Close.
func (s *Store) Record(ctx context.Context, key string) error {
	k, err := s.storeKey(key)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r := &request{key: k, done: make(chan error, 1)}

	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	select {
	case s.reqs <- r:
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	s.mu.RUnlock()

	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close flushes the keys already passed to Record, stops the store's
// goroutines and waits for them, unregisters its metrics and closes Badger.
// It is idempotent: later calls wait for the first and return its result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.reqs) // the committer drains what is queued, then returns
		s.mu.Unlock()
		close(s.stop)
		s.wg.Wait()
		s.m.unregister()
		if err := s.db.Close(); err != nil {
			s.closeErr = fmt.Errorf("dedup store %s: close: %w", s.dir, err)
		}
	})
	return s.closeErr
}

// storeKey returns the Badger key for an idempotency key in this store's
// scope: keyPrefix, Scope, NUL, key. Scope holds no NUL, so the first NUL
// ends it and no two (scope, key) pairs share a stored key.
func (s *Store) storeKey(key string) ([]byte, error) {
	if key == "" {
		return nil, ErrEmptyKey
	}
	if len(s.scope)+len(key) > maxKeySize {
		return nil, fmt.Errorf("%w: %d bytes", ErrKeyTooLong, len(key))
	}
	k := make([]byte, 0, len(s.scope)+len(key))
	k = append(k, s.scope...)
	return append(k, key...), nil
}

// commitLoop is the one goroutine that writes keys: it takes the first queued
// request, everything else already queued up to maxBatch, writes them in one
// transaction and answers each. While it writes, new requests queue, so
// batches grow with the load and cost nothing when there is none.
func (s *Store) commitLoop() {
	defer s.wg.Done()
	batch := make([]*request, 0, s.maxBatch)
	for r := range s.reqs {
		batch = append(batch[:0], r)
	fill:
		for len(batch) < s.maxBatch {
			select {
			case r, ok := <-s.reqs:
				if !ok {
					break fill
				}
				batch = append(batch, r)
			default:
				break fill
			}
		}
		s.commit(batch)
		clear(batch) // drop references to answered requests
	}
}

// commit writes batch and answers every request in it. A transaction too big
// for Badger is committed in parts; each request gets its own part's result.
func (s *Store) commit(batch []*request) {
	s.m.batchSize.Observe(float64(len(batch)))
	answer := func(part []*request, err error) {
		if err != nil {
			s.m.recordErrors.Add(float64(len(part)))
			s.log.Error("recording idempotency keys failed", "keys", len(part), "err", err)
			err = fmt.Errorf("dedup: record key: %w", err)
		} else {
			s.m.keysRecorded.Add(float64(len(part)))
		}
		for _, r := range part {
			r.done <- err
		}
	}

	txn := s.db.NewTransaction(true)
	start := 0
	for i, r := range batch {
		e := badger.NewEntry(r.key, nil).WithTTL(s.ttl)
		err := txn.SetEntry(e)
		if errors.Is(err, badger.ErrTxnTooBig) && i > start {
			answer(batch[start:i], txn.Commit())
			txn = s.db.NewTransaction(true)
			start = i
			err = txn.SetEntry(e)
		}
		if err != nil {
			txn.Discard()
			answer(batch[start:], err)
			return
		}
	}
	answer(batch[start:], txn.Commit())
}

// gcLoop garbage-collects the value log every GCInterval until Close.
func (s *Store) gcLoop(interval time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.runGC()
		}
	}
}

// runGC rewrites value-log files while Badger finds one worth rewriting.
// Idempotency keys carry empty values, which Badger keeps in the LSM tree, so
// the value log stays small and most runs rewrite nothing; the loop is there
// so that nothing grows without bound whatever Badger decides to put there.
func (s *Store) runGC() {
	s.m.gcRuns.Inc()
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
			s.log.Warn("value log GC failed", "err", err)
			return
		}
	}
}
