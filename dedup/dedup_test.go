package dedup

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/poll"
)

const hour = time.Hour

// openStore opens a store in dir and closes it when the test ends.
func openStore(t testing.TB, dir string, opts Options) *Store {
	t.Helper()
	if opts.TTL == 0 {
		opts.TTL = hour
	}
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func mustSeen(t *testing.T, s *Store, key string, want bool) {
	t.Helper()
	got, err := s.Seen(context.Background(), key)
	if err != nil {
		t.Fatalf("Seen(%q): %v", key, err)
	}
	if got != want {
		t.Fatalf("Seen(%q) = %v, want %v", key, got, want)
	}
}

func mustRecord(t *testing.T, s *Store, key string) {
	t.Helper()
	if err := s.Record(context.Background(), key); err != nil {
		t.Fatalf("Record(%q): %v", key, err)
	}
}

func TestRecordThenSeen(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{Scope: "c"})
	mustSeen(t, s, "order-1", false)
	mustRecord(t, s, "order-1")
	mustSeen(t, s, "order-1", true)
	mustSeen(t, s, "order-2", false)
	mustRecord(t, s, "order-1") // recording again is harmless
	mustSeen(t, s, "order-1", true)
}

func TestOpenCreatesPrivateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "courier-data")
	openStore(t, dir, Options{})
	info, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := info.Mode().Perm(); perm != 0o700 {
		t.Errorf("%s created with mode %v, want 0700", dir, perm)
	}
}

// A directory others can write is narrowed to 0700 when it is courier's
// user's, and reported when it is another's: whoever can write it can add
// keys, messages then acked as duplicates without reaching the app.
func TestOpenDirWritableByOthers(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("no Unix permissions")
	}
	shared := func(t *testing.T) string {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "courier-data")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o777); err != nil { // past the umask
			t.Fatal(err)
		}
		return dir
	}
	mode := func(t *testing.T, dir string) fs.FileMode {
		t.Helper()
		info, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		return info.Mode().Perm()
	}

	t.Run("courier's", func(t *testing.T) {
		dir := shared(t)
		var logs logBuffer
		openStore(t, dir, Options{Logger: logs.logger()})
		if perm := mode(t, dir); perm != 0o700 {
			t.Errorf("%s left with mode %v, want 0700", dir, perm)
		}
		if logs.count("level=WARN", "writable by other users", "now 0700", "was=0777") != 1 {
			t.Errorf("no warning that the mode was narrowed:\n%s", logs.String())
		}
	})
	t.Run("another user's", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("giving the directory to another user needs root")
		}
		dir := shared(t)
		if err := os.Chown(dir, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		var logs logBuffer
		openStore(t, dir, Options{Logger: logs.logger()})
		if perm := mode(t, dir); perm != 0o777 {
			t.Errorf("%s, another user's, changed to mode %v", dir, perm)
		}
		if logs.count("level=WARN", "writable by other users", "not courier's user", "mode=0777", "owner=4242") != 1 {
			t.Errorf("no warning that the directory is writable by others:\n%s", logs.String())
		}
	})
}

func TestBadKeys(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{Scope: "c"})
	ctx := context.Background()
	tests := []struct {
		name string
		key  string
		want error
	}{
		{"empty", "", ErrEmptyKey},
		{"too long", strings.Repeat("x", maxKeySize), ErrKeyTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.Record(ctx, tt.key); !errors.Is(err, tt.want) {
				t.Errorf("Record: %v, want %v", err, tt.want)
			}
			if _, err := s.Seen(ctx, tt.key); !errors.Is(err, tt.want) {
				t.Errorf("Seen: %v, want %v", err, tt.want)
			}
		})
	}
	// The longest key the scope leaves room for is accepted.
	mustRecord(t, s, strings.Repeat("x", maxKeySize-len(s.own.prefix)))
	mustSeen(t, s, strings.Repeat("x", maxKeySize-len(s.own.prefix)), true)
}

func TestScopesIsolate(t *testing.T) {
	dir := t.TempDir()
	// "a"+"bc" and "ab"+"c" must not meet in the same stored key.
	steps := []struct {
		scope, record string
		seen          map[string]bool
	}{
		{"a", "bc", map[string]bool{"bc": true, "c": false}},
		{"ab", "c", map[string]bool{"c": true, "bc": false}},
		{"", "bc", map[string]bool{"bc": true, "c": false}},
		{"a", "", map[string]bool{"bc": true, "c": false}},
		{"ab", "", map[string]bool{"c": true, "bc": false}},
	}
	for _, st := range steps {
		s, err := Open(dir, Options{TTL: hour, Scope: st.scope})
		if err != nil {
			t.Fatal(err)
		}
		if st.record != "" {
			mustRecord(t, s, st.record)
		}
		for k, want := range st.seen {
			mustSeen(t, s, k, want)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestKeysSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{TTL: hour, Scope: "c"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		mustRecord(t, s, fmt.Sprint("k", i))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, dir, Options{Scope: "c"})
	for i := range 100 {
		mustSeen(t, s, fmt.Sprint("k", i), true)
	}
	mustSeen(t, s, "k100", false)
}

func TestKeyExpires(t *testing.T) {
	// Badger keeps expiry in whole seconds: with a TTL of 2s a key lives
	// between 1s and 2s, so it is still there right after Record.
	s := openStore(t, t.TempDir(), Options{TTL: 2 * time.Second})
	mustRecord(t, s, "k")
	mustSeen(t, s, "k", true)
	poll.Until(t, 5*time.Second, "key forgotten after its TTL", func() bool {
		seen, err := s.Seen(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		return !seen
	})
}

// TestRecordAgainAfterRestart: the store picks its own commit timestamps, so
// after a restart they must continue above the stored ones. Otherwise a key
// recorded again after its first record expired would sit below the expired
// version and read as not seen.
func TestRecordAgainAfterRestart(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		mustRecord(t, s, fmt.Sprint("filler-", i)) // versions to climb above
	}
	mustRecord(t, s, "k")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, Options{TTL: hour})
	poll.Until(t, 5*time.Second, "first record expired", func() bool {
		seen, err := s.Seen(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		return !seen
	})
	mustRecord(t, s, "k")
	mustSeen(t, s, "k", true)
}

// TestExpiredKeysAreDropped: expired keys leave the tables when they are
// compacted, so the store does not grow with every key ever recorded. (The
// store picks Badger's timestamps, so it must also move the timestamp below
// which compaction may drop what is expired.)
func TestExpiredKeysAreDropped(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 5000)
	for i := range keys {
		keys[i] = fmt.Sprint("k-", i)
	}
	if err := s.Record(context.Background(), keys...); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "keys expired", func() bool {
		seen, err := s.Seen(context.Background(), keys[0])
		if err != nil {
			t.Fatal(err)
		}
		return !seen
	})
	s.runGC()
	// Each Close flushes the memtable into a level-0 table; with more
	// level-0 tables than Badger keeps, Flatten compacts them into one level.
	const live = numLevelZeroTables + 1
	for i := range live {
		if i > 0 {
			if s, err = Open(dir, Options{TTL: hour}); err != nil {
				t.Fatal(err)
			}
		}
		mustRecord(t, s, fmt.Sprint("live-", i))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	s = openStore(t, dir, Options{})
	if n := tableKeys(s); n < uint64(len(keys)) {
		t.Fatalf("%d keys in tables before compaction, want at least %d", n, len(keys))
	}
	if err := s.db.Flatten(1); err != nil {
		t.Fatal(err)
	}
	if n := tableKeys(s); n != live {
		t.Errorf("%d keys in tables after compaction, want the %d live ones", n, live)
	}
	for i := range live {
		mustSeen(t, s, fmt.Sprint("live-", i), true)
	}
}

func tableKeys(s *Store) uint64 {
	var n uint64
	for _, ti := range s.db.Tables() {
		n += uint64(ti.KeyCount)
	}
	return n
}

// TestRecordManyKeys records many keys in one call, one commit, and many
// single keys from concurrent callers.
func TestRecordManyKeys(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := openStore(t, t.TempDir(), Options{Registerer: reg})

	// Enough keys to exceed one Badger transaction: written in parts.
	const batch = 20000
	keys := make([]string, batch)
	for i := range keys {
		keys[i] = fmt.Sprintf("batch-%06d-%s", i, strings.Repeat("x", 40))
	}
	if err := s.Record(context.Background(), keys...); err != nil {
		t.Fatal(err)
	}
	if got := metricstest.Value(t, reg, "courier_dedup_record_batch_size"); got != 1 {
		t.Errorf("%v Record calls observed, want 1", got)
	}

	const workers, perWorker = 32, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers*perWorker)
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				if err := s.Record(context.Background(), fmt.Sprintf("w%d-%d", w, i)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, k := range keys {
		mustSeen(t, s, k, true)
	}
	for w := range workers {
		for i := range perWorker {
			mustSeen(t, s, fmt.Sprintf("w%d-%d", w, i), true)
		}
	}
	mustSeen(t, s, "w0-50", false)

	const total = batch + workers*perWorker
	if got := metricstest.Value(t, reg, "courier_dedup_keys_recorded_total"); got != total {
		t.Errorf("keys recorded = %v, want %d", got, total)
	}
	if got := metricstest.Value(t, reg, "courier_dedup_record_errors_total"); got != 0 {
		t.Errorf("record errors = %v, want 0", got)
	}
	if got := metricstest.Value(t, reg, "courier_dedup_record_batch_size"); got != 1+workers*perWorker {
		t.Errorf("%v Record calls observed, want %d", got, 1+workers*perWorker)
	}
	if got := metricstest.Value(t, reg, "courier_dedup_store_size_bytes"); got <= 0 {
		t.Errorf("store size = %v, want > 0", got)
	}
}

// TestRecordValidatesEveryKeyFirst: one bad key in a call records none.
func TestRecordValidatesEveryKeyFirst(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{})
	for _, bad := range []string{"", strings.Repeat("x", maxKeySize)} {
		err := s.Record(context.Background(), "good-1", bad, "good-2")
		if !errors.Is(err, ErrEmptyKey) && !errors.Is(err, ErrKeyTooLong) {
			t.Fatalf("Record with a bad key: %v, want ErrEmptyKey or ErrKeyTooLong", err)
		}
		mustSeen(t, s, "good-1", false)
		mustSeen(t, s, "good-2", false)
	}
	if err := s.Record(context.Background()); err != nil {
		t.Errorf("Record of no keys: %v", err)
	}
}

// TestCloseFlushesPending closes the store while workers record as fast as
// they can: every Record returns, and each that returned nil is in the store.
func TestCloseFlushesPending(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{TTL: hour})
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg       sync.WaitGroup
		n        atomic.Int64
		mu       sync.Mutex
		recorded []string
	)
	for range 32 {
		wg.Go(func() {
			for {
				key := fmt.Sprint("k", n.Add(1))
				err := s.Record(context.Background(), key)
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("Record(%s) during Close: %v", key, err)
					return
				}
				mu.Lock()
				recorded = append(recorded, key)
				mu.Unlock()
			}
		})
	}
	poll.Until(t, 15*time.Second, "records flowing", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(recorded) >= 500
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait() // every Record has returned: none was left waiting

	s = openStore(t, dir, Options{})
	for _, k := range recorded {
		mustSeen(t, s, k, true)
	}
	t.Logf("%d keys recorded before Close, all seen", len(recorded))
}

func TestClose(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := Open(t.TempDir(), Options{TTL: hour, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	mustRecord(t, s, "k")
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Errorf("Close again: %v", err)
	}
	ctx := context.Background()
	if err := s.Record(ctx, "k2"); !errors.Is(err, ErrClosed) {
		t.Errorf("Record after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Seen(ctx, "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("Seen after Close: %v, want ErrClosed", err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Errorf("%d series still registered after Close (%v)", n, err)
	}
}

func TestCloseStopsGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	reg := prometheus.NewRegistry()
	s, err := Open(t.TempDir(), Options{TTL: hour, Registerer: reg, GCInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mustRecord(t, s, "k")
	poll.Until(t, 15*time.Second, "GC ran", func() bool {
		return metricstest.Value(t, reg, "courier_dedup_gc_runs_total") >= 2
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 15*time.Second, "goroutines stopped", func() bool {
		return runtime.NumGoroutine() <= before
	})
}

// TestRecordHonoursContext holds a commit (the one fake: Badger cannot be
// made to stall on demand): Record returns when its context ends, and Close
// still waits for the commit it started.
func TestRecordHonoursContext(t *testing.T) {
	s, err := Open(t.TempDir(), Options{TTL: hour})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	s.writeKeys = func(keys [][]byte, ttl time.Duration) error {
		<-release
		return s.write(keys, ttl)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Record(ctx, "k") }()
	select {
	case err := <-done:
		t.Fatalf("Record returned %v before its key was committed", err)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Record: %v, want context.Canceled", err)
	}

	closed := make(chan error)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned %v while a commit was in progress", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	s = openStore(t, s.dir, Options{})
	mustSeen(t, s, "k", true) // the abandoned commit completed before Close

	t.Run("already cancelled", func(t *testing.T) {
		s := openStore(t, t.TempDir(), Options{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.Record(ctx, "k"); !errors.Is(err, context.Canceled) {
			t.Errorf("Record: %v, want context.Canceled", err)
		}
		if _, err := s.Seen(ctx, "k"); !errors.Is(err, context.Canceled) {
			t.Errorf("Seen: %v, want context.Canceled", err)
		}
	})
}

func TestOpenLocked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "courier-data")
	openStore(t, dir, Options{})
	_, err := Open(dir, Options{TTL: hour})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), dir) {
		t.Errorf("error %q does not name %s", err, dir)
	}
	t.Log(err)
}

func TestOpenBadDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	readOnly := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(readOnly, 0o500); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		dir      string
		want     error
		needUser bool // root writes anywhere
	}{
		{"regular file", file, syscall.ENOTDIR, false},
		{"under a regular file", filepath.Join(file, "data"), syscall.ENOTDIR, false},
		{"read-only directory", readOnly, fs.ErrPermission, true},
		{"under a read-only directory", filepath.Join(readOnly, "data"), fs.ErrPermission, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.needUser && os.Geteuid() == 0 {
				t.Skip("root ignores permissions")
			}
			_, err := Open(tt.dir, Options{TTL: hour})
			if !errors.Is(err, tt.want) {
				t.Fatalf("Open: %v, want %v", err, tt.want)
			}
			if errors.Is(err, ErrLocked) || errors.Is(err, ErrCorrupt) {
				t.Errorf("Open: %v: not locked nor corrupt", err)
			}
			if !strings.Contains(err.Error(), tt.dir) {
				t.Errorf("error %q does not name %s", err, tt.dir)
			}
			t.Log(err)
		})
	}
}

func TestOpenCorrupt(t *testing.T) {
	tests := []struct {
		name    string
		corrupt func(t *testing.T, dir string)
	}{
		{"garbage manifest", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "MANIFEST"), []byte("this is not a badger manifest"))
		}},
		{"table cut short", func(t *testing.T, dir string) {
			name := onlyTable(t, dir)
			data, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, name, data[:len(data)/3])
		}},
		{"table overwritten", func(t *testing.T, dir string) {
			name := onlyTable(t, dir)
			writeFile(t, name, bytes.Repeat([]byte("garbage!"), 4096))
		}},
		{"table index damaged", func(t *testing.T, dir string) {
			name := onlyTable(t, dir)
			data, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			data[len(data)-20] ^= 0xff // in the checksum or the index
			writeFile(t, name, data)
		}},
		{"garbage key registry", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "KEYREGISTRY"), []byte("this is not a key registry"))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := Open(dir, Options{TTL: hour})
			if err != nil {
				t.Fatal(err)
			}
			mustRecord(t, s, "k")
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			tt.corrupt(t, dir)

			_, err = Open(dir, Options{TTL: hour})
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open: %v, want ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), dir) {
				t.Errorf("error %q does not name %s", err, dir)
			}
			t.Log(err)
		})
	}
}

// onlyTable returns the one table file that a store holding one key leaves
// when it is closed (Close flushes the memtable).
func onlyTable(t *testing.T, dir string) string {
	t.Helper()
	tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil || len(tables) != 1 {
		t.Fatalf("tables in %s: %v, %v; want one", dir, tables, err)
	}
	return tables[0]
}

func writeFile(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestOpenOptions(t *testing.T) {
	tests := []struct {
		name string
		opts Options
	}{
		{"no TTL", Options{}},
		{"sub-second TTL", Options{TTL: 500 * time.Millisecond}},
		{"NUL in scope", Options{TTL: hour, Scope: "a\x00b"}},
		{"negative GC interval", Options{TTL: hour, GCInterval: -time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "d")
			if s, err := Open(dir, tt.opts); err == nil {
				s.Close()
				t.Fatal("Open accepted invalid options")
			}
			if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("invalid options created %s", dir)
			}
		})
	}
}

// HighRate sizes Badger's memtables, tables and level 0 for batches; a
// store keeps its keys whichever way it is opened, so that turning batches
// on or off across a restart forgets nothing.
func TestHighRateSizesBadgerAndKeepsKeys(t *testing.T) {
	dir := t.TempDir()
	keys := make([]string, 20000)
	for i := range keys {
		keys[i] = fmt.Sprint("k-", i)
	}
	for i, highRate := range []bool{true, false, true} {
		s, err := Open(dir, Options{TTL: hour, HighRate: highRate})
		if err != nil {
			t.Fatal(err)
		}
		o := s.db.Opts()
		wantMem, wantTable, wantL0 := int64(memTableSize), int64(baseTableSize), numLevelZeroTables
		if highRate {
			wantMem, wantTable, wantL0 = highRateMemTableSize, highRateBaseTableSize, highRateNumLevelZeroTables
		}
		if o.MemTableSize != wantMem || o.BaseTableSize != wantTable || o.NumLevelZeroTables != wantL0 {
			t.Errorf("HighRate %v: memtable %d, tables %d, level 0 %d; want %d, %d, %d", highRate,
				o.MemTableSize, o.BaseTableSize, o.NumLevelZeroTables, wantMem, wantTable, wantL0)
		}
		part := keys[i*len(keys)/3 : (i+1)*len(keys)/3]
		if err := s.Record(context.Background(), part...); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys[:(i+1)*len(keys)/3] {
			if seen, err := s.Seen(context.Background(), k); err != nil || !seen {
				t.Fatalf("HighRate %v, open %d: %s seen=%v err=%v", highRate, i+1, k, seen, err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMetricsRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	s := openStore(t, dir, Options{Registerer: reg})
	mustRecord(t, s, "k")
	want := []string{
		"courier_dedup_keys_recorded_total",
		"courier_dedup_record_errors_total",
		"courier_dedup_record_batch_size",
		"courier_dedup_store_size_bytes",
		"courier_dedup_gc_runs_total",
		"courier_dedup_gc_rewrites_total",
		"courier_dedup_duration_seconds",
	}
	for _, name := range want {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n == 0 {
			t.Errorf("metric %s not registered (%v)", name, err)
		}
	}

	// A second store on the same registry collides and is refused cleanly,
	// leaving the directory usable.
	if _, err := Open(t.TempDir(), Options{TTL: hour, Registerer: reg}); err == nil {
		t.Error("second store registered the same metrics")
	}
	mustRecord(t, s, "k2")
}

// TestRecordedKeysSurviveKill runs a child process that records keys as fast
// as it can and reports each once Record returned, kills it with SIGKILL, and
// checks that every key it reported is in the store.
func TestRecordedKeysSurviveKill(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("needs SIGKILL")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), "DEDUP_HELPER_DIR="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	var keys []string
	killed := false
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		key, ok := strings.CutPrefix(sc.Text(), "recorded ")
		if !ok {
			continue
		}
		keys = append(keys, key)
		if len(keys) == 2000 && !killed {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !killed || !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child was not killed after reporting 2000 keys: %d keys, %v", len(keys), err)
	}

	s := openStore(t, dir, Options{Scope: "c"})
	for _, k := range keys {
		mustSeen(t, s, k, true)
	}
	t.Logf("%d keys reported by the killed process, all seen", len(keys))
}

// TestHelperProcess is the child of TestRecordedKeysSurviveKill.
func TestHelperProcess(t *testing.T) {
	dir := os.Getenv("DEDUP_HELPER_DIR")
	if dir == "" {
		t.Skip("helper process for TestRecordedKeysSurviveKill")
	}
	s, err := Open(dir, Options{TTL: hour, Scope: "c"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Stop by itself if the parent never kills it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var n atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				key := fmt.Sprint("key-", n.Add(1))
				if err := s.Record(ctx, key); err != nil {
					continue
				}
				fmt.Printf("recorded %s\n", key) // one write(2) per line
			}
		})
	}
	wg.Wait()
	os.Exit(2)
}

// BenchmarkRecord measures recording keys: one key per call from 16
// goroutines (Badger batches their concurrent commits), and 16 or 256 keys
// per call from one (how the delivery loop records).
func BenchmarkRecord(b *testing.B) {
	for _, bc := range []struct {
		name              string
		goroutines, batch int
	}{
		{"single/16-goroutines", 16, 1},
		{"batch=16", 1, 16},
		{"batch=256", 1, 256},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{TTL: hour, Scope: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var n atomic.Int64
			ctx := context.Background()
			b.ResetTimer()
			var wg sync.WaitGroup
			for range bc.goroutines {
				wg.Go(func() {
					keys := make([]string, bc.batch)
					for {
						first := n.Add(int64(bc.batch)) - int64(bc.batch)
						if first >= int64(b.N) {
							return
						}
						keys = keys[:min(int64(bc.batch), int64(b.N)-first)]
						for i := range keys {
							keys[i] = fmt.Sprint("key-", first+int64(i))
						}
						if err := s.Record(ctx, keys...); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
