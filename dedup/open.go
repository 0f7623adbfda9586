package dedup

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// Badger sizing for a sidecar. Badger's defaults suit a database (64 MiB
// memtables, five of them, a 256 MiB block cache, 1 GiB value-log files);
// an idempotency key is a few dozen bytes with an empty value.
const (
	// A 1 MiB memtable holds ~10k keys and bounds one transaction to
	// ~150 KiB (15% of it), far above a 256-key batch of ordinary keys.
	// Measured recording 500k keys from 16 goroutines: 4 MiB memtables with
	// 2 MiB tables cost ~16 MiB more RSS than 2 MiB with 1 MiB tables, and
	// 1 MiB memtables about 2.5 MiB less again, for no throughput.
	memTableSize = 1 << 20
	numMemtables = 2
	// Values this small or smaller live in the LSM tree, not the value log;
	// ours are empty.
	valueThreshold = 1 << 10
	// Value-log files are mapped at twice their size; they stay nearly empty.
	valueLogFileSize = 16 << 20
	baseTableSize    = 1 << 20
	// Uncompressed, unencrypted tables are read straight from their mapping,
	// so no block cache is needed; the index cache bounds the memory taken by
	// table indexes and bloom filters however many keys the TTL retains.
	blockCacheSize          = 0
	indexCacheSize          = 4 << 20
	numLevelZeroTables      = 3
	numLevelZeroTablesStall = 10
	numCompactors           = 2
)

// Options.HighRate's sizes. Recording keys from batches of 32, Badger is
// about a third of courier's CPU: writing each key to a memtable and its
// log, flushing memtables into tables, compacting them; and each table it
// builds allocates a 3 MiB index buffer whatever its size (Badger's
// table/builder.go), a fifth of what courier allocates. Measured draining
// 600,000 messages in batches of 32 (go run ./bench -courier with either
// build, alternately): 4 MiB memtables and tables and five level-0 tables
// took 15-25% less of courier's CPU a message than the defaults above, for
// about 20 MiB more peak anonymous memory; five level-0 tables alone, or
// 2 MiB sizes, gained less than the machine's noise.
const (
	highRateMemTableSize       = 4 << 20
	highRateBaseTableSize      = 4 << 20
	highRateNumLevelZeroTables = 5
)

// Open opens (creating if needed, with mode 0700) the store in dir. The
// caller must Close the Store. A dir that exists and that other users can
// write is narrowed to 0700 when courier's user owns it, and logged as a
// warning either way (see checkDirMode).
//
// Its errors name the directory and say what to do: one wrapping ErrLocked
// when another process or Store holds dir, one wrapping ErrCorrupt when dir
// is usable but Badger cannot open the store in it, and one wrapping the
// underlying error (such as fs.ErrPermission or syscall.ENOTDIR) when dir
// cannot be created or written.
func Open(dir string, opts Options) (*Store, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.GCInterval == 0 {
		opts.GCInterval = DefaultGCInterval
	}
	if opts.DiskInterval == 0 {
		opts.DiskInterval = DefaultDiskInterval
	}
	if opts.CloseTimeout == 0 {
		opts.CloseTimeout = DefaultCloseTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "dedup")

	if err := prepareDir(dir); err != nil {
		return nil, err
	}
	checkDirMode(dir, log)
	if err := checkTables(dir); err != nil {
		return nil, err
	}
	db, err := openBadger(dir, log, opts.HighRate)
	if err != nil {
		return nil, err
	}
	disk := newDiskWatch(dir, opts, log)
	m, err := newMetrics(dir, disk, opts.Registerer)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("dedup store %s: register metrics: %w", dir, err)
	}

	s := &Store{
		db:     db,
		dir:    dir,
		log:    log,
		stop:   make(chan struct{}),
		m:      m,
		filter: newFilter(),
		disk:   disk,

		closeTimeout: opts.CloseTimeout,
	}
	s.own = newStoreScope(s, opts.Scope, opts.TTL)
	s.writeKeys = s.write
	// Versions continue above what is stored, whichever mode wrote it.
	s.ts.Store(db.MaxVersion())
	db.SetDiscardTs(s.ts.Load())
	s.wg.Add(2)
	go s.every(opts.GCInterval, s.runGC) // value-log GC
	go s.loadFilter()
	if disk.floor > 0 {
		s.wg.Add(1)
		go s.every(opts.DiskInterval, func() { _ = s.disk.measure() }) // free space
	}
	log.Debug("dedup store open", "dir", dir, "ttl", opts.TTL, "scope", opts.Scope, "high_rate", opts.HighRate)
	return s, nil
}

func (o Options) validate() error {
	var errs []error
	if o.TTL < time.Second {
		errs = append(errs, fmt.Errorf("dedup: TTL %v: must be at least 1s (Badger keeps expiry in whole seconds)", o.TTL))
	}
	if err := checkScope(o.Scope); err != nil {
		errs = append(errs, err)
	}
	if o.GCInterval < 0 {
		errs = append(errs, fmt.Errorf("dedup: GC interval %v: must not be negative", o.GCInterval))
	}
	if o.DiskInterval < 0 {
		errs = append(errs, fmt.Errorf("dedup: disk interval %v: must not be negative", o.DiskInterval))
	}
	if o.CloseTimeout < 0 {
		errs = append(errs, fmt.Errorf("dedup: close timeout %v: must not be negative", o.CloseTimeout))
	}
	return errors.Join(errs...)
}

// openError is an error of Open: a message written for the operator, and the
// sentinel and cause it wraps for errors.Is.
type openError struct {
	msg   string
	kind  error // ErrLocked, ErrCorrupt or nil
	cause error
}

func (e *openError) Error() string { return e.msg }

func (e *openError) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.kind, e.cause} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func lockedError(dir string) error {
	return &openError{
		msg: fmt.Sprintf("dedup store %s is locked by another courier process "+
			"(only one courier may use a directory; give each replica its own COURIER_DEDUP_DIR)", dir),
		kind: ErrLocked,
	}
}

// prepareDir creates dir and makes sure it can be used, so that what fails
// afterwards in Badger can be told apart: a locked directory, or a store
// Badger cannot read. Badger's own errors are flattened to text and cannot
// be examined.
func prepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return &openError{
			msg: fmt.Sprintf("dedup store %s: cannot create the directory: %v "+
				"(set COURIER_DEDUP_DIR to a directory courier can create and write)", dir, err),
			cause: err,
		}
	}
	if locked(dir) {
		return lockedError(dir)
	}
	f, err := os.CreateTemp(dir, ".write-probe-*")
	if err == nil {
		_, err = f.Write([]byte{0})
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if rerr := os.Remove(f.Name()); err == nil {
			err = rerr
		}
	}
	if err != nil {
		return &openError{
			msg: fmt.Sprintf("dedup store %s: the directory is not writable: %v "+
				"(give courier's user write access to it, or set COURIER_DEDUP_DIR to a writable directory)", dir, err),
			cause: err,
		}
	}
	return nil
}

// checkDirMode keeps dir private to courier's user: whoever else can write
// it can add keys (messages then acked as duplicates without reaching the
// app) or remove them. A directory courier's user owns is narrowed to 0700;
// another's courier cannot change, so it is only reported. (A Kubernetes
// emptyDir is 0777 and root's: point COURIER_DEDUP_DIR below its mount, and
// courier creates the directory itself.)
func checkDirMode(dir string, log *slog.Logger) {
	info, err := os.Stat(dir)
	if err != nil {
		return // prepareDir used it a moment ago; Badger reports what changed
	}
	perm := info.Mode().Perm()
	uid, ok := fileOwner(info)
	if !ok || perm&0o022 == 0 {
		return
	}
	mode := fmt.Sprintf("%#o", perm)
	if uid == os.Geteuid() {
		err := os.Chmod(dir, 0o700)
		if err == nil {
			log.Warn("the dedup directory was writable by other users, who could add or remove keys: its mode is now 0700",
				"dir", dir, "was", mode)
			return
		}
		log.Warn("the dedup directory is writable by other users, who could add keys (messages then acked as duplicates "+
			"without reaching the app) or remove them, and courier could not make it 0700: make it so",
			"dir", dir, "mode", mode, "error", err)
		return
	}
	log.Warn("the dedup directory is writable by other users, who could add keys (messages then acked as duplicates "+
		"without reaching the app) or remove them, and it is not courier's user's, so courier cannot make it 0700: "+
		"give it to courier's user with mode 0700, or set COURIER_DEDUP_DIR to a directory courier creates",
		"dir", dir, "mode", mode, "owner", uid, "courier_uid", os.Geteuid())
}

// openBadger opens Badger in a directory prepareDir accepted.
func openBadger(dir string, log *slog.Logger, highRate bool) (db *badger.DB, err error) {
	memTable, baseTable, levelZero := int64(memTableSize), int64(baseTableSize), numLevelZeroTables
	if highRate {
		memTable, baseTable, levelZero = highRateMemTableSize, highRateBaseTableSize, highRateNumLevelZeroTables
	}
	bo := badger.DefaultOptions(dir).
		WithSyncWrites(false). // see Store's doc: survives kill -9, not power loss
		WithLogger(badgerLogger{log.With("lib", "badger")}).
		WithMetricsEnabled(false).  // Badger's metrics are process-global expvars
		WithDetectConflicts(false). // writes are blind sets; reads need no isolation
		WithCompression(options.None).
		// A damaged block becomes an error from Seen (the message is NAK'd)
		// rather than a panic or a wrong answer; CRC32C per 4 KiB is cheap.
		WithChecksumVerificationMode(options.OnBlockRead).
		WithMemTableSize(memTable).
		WithNumMemtables(numMemtables).
		WithValueThreshold(valueThreshold).
		WithValueLogFileSize(valueLogFileSize).
		WithBaseTableSize(baseTable).
		WithBlockCacheSize(blockCacheSize).
		WithIndexCacheSize(indexCacheSize).
		WithNumLevelZeroTables(levelZero).
		WithNumLevelZeroTablesStall(numLevelZeroTablesStall).
		WithNumCompactors(numCompactors)

	// Badger panics on some damage it finds while opening.
	defer func() {
		if p := recover(); p != nil {
			db, err = nil, corruptError(dir, fmt.Errorf("badger panicked: %v", p))
		}
	}()
	// Managed mode: the store chooses the timestamps, so reads and commits
	// skip Badger's transaction watermarks. Unmanaged, every read waits on
	// and signals a watermark goroutine (two channel sends and often a
	// wake-up per check), which measured as most of the cost of dedup.
	// Store.ts and the discard timestamp it sets stand in for them.
	db, err = badger.OpenManaged(bo)
	if err == nil {
		return db, nil
	}
	// prepareDir found the directory writable and unlocked; if it is locked
	// now, another process got there first. Otherwise Badger could not read
	// what is in it.
	if locked(dir) {
		return nil, lockedError(dir)
	}
	return nil, corruptError(dir, err)
}

// checkTables makes sure Badger can find the index of every table in dir.
// Badger reads a table's trailer (index, its length, checksum, its length,
// from the end) in its own goroutines and panics, killing the process, when
// a length points outside the file; past that point it verifies the index's
// checksum and returns errors. A table cut short or overwritten is what a
// damaged disk or a bad copy leaves, so catch it here with a clear error.
// (A table a crash left half written is empty or zero at the end, which
// passes, and Badger deletes it as it is not in the manifest.)
func checkTables(dir string) error {
	tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil {
		return nil // only a malformed pattern fails, and ours is constant
	}
	for _, name := range tables {
		if err := checkTableTrailer(name); err != nil {
			return corruptError(dir, fmt.Errorf("table %s: %w", filepath.Base(name), err))
		}
	}
	return nil
}

// checkTableTrailer checks that the lengths at the end of a Badger table
// (table/builder.go: ... index | index length | checksum | checksum length,
// lengths as big-endian uint32) stay inside the file.
func checkTableTrailer(name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	size := info.Size()
	if size == 0 {
		return nil
	}
	readLen := func(off int64) (int64, error) {
		var b [4]byte
		if off < 0 {
			return 0, errTableTrailer
		}
		if _, err := f.ReadAt(b[:], off); err != nil {
			return 0, err
		}
		return int64(binary.BigEndian.Uint32(b[:])), nil
	}
	checksumLen, err := readLen(size - 4)
	if err != nil {
		return err
	}
	indexLen, err := readLen(size - 8 - checksumLen)
	if err != nil {
		return err
	}
	if indexLen > size-8-checksumLen {
		return errTableTrailer
	}
	return nil
}

// errTableTrailer says a table's trailer points outside it.
var errTableTrailer = errors.New("index or checksum length points outside the file")

func corruptError(dir string, err error) error {
	return &openError{
		msg: fmt.Sprintf("dedup store %s cannot be opened, it may be corrupt: %v "+
			"(if the disk is not full, move the directory aside and restart courier: "+
			"it starts with an empty store, so messages processed within the TTL may reach the app again)", dir, err),
		kind:  ErrCorrupt,
		cause: err,
	}
}

// badgerLogger routes Badger's logs into slog. Badger's Info is chatty
// housekeeping (compactions, replays), so it goes to Debug.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(format string, args ...any) { b.log(slog.LevelError, format, args) }
func (b badgerLogger) Warningf(format string, args ...any) {
	b.log(slog.LevelWarn, format, args)
}
func (b badgerLogger) Infof(format string, args ...any)  { b.log(slog.LevelDebug, format, args) }
func (b badgerLogger) Debugf(format string, args ...any) { b.log(slog.LevelDebug, format, args) }

func (b badgerLogger) log(level slog.Level, format string, args []any) {
	ctx := context.Background()
	if !b.l.Enabled(ctx, level) {
		return
	}
	b.l.Log(ctx, level, strings.TrimSpace(fmt.Sprintf(format, args...)))
}
