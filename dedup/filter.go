package dedup

import (
	"errors"
	"hash/maphash"
	"math"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// Sizing of the in-memory filter: 512 KiB of bits and four probes take a
// new key for a stored one (and read the store) for about 1 key in 250 with
// 300,000 keys held and 1 in 7 with a million; past filterCapacity keys
// (about 1 in 3) it is no longer worth asking.
const (
	filterBits     = 1 << 22
	filterHashes   = 4
	filterCapacity = 1_500_000
)

// filter is a Bloom filter of the keys in a Store. A key it was never given
// is certainly not stored, so a check of a new key (most checks) needs no
// read of Badger, which measured as half the cost of dedup per message.
//
// It holds the keys found in the store when it was opened, of every scope
// (loaded in the background: until then it is not asked), and every key
// recorded since, added before the key is committed, so a key Badger holds
// is always in it. Keys are added whole, scope included, so one filter
// answers for every scope of the store (Store.Scoped) and a key of one
// scope says nothing of another's; the scopes share its capacity.
// It never forgets a key; an expired one only costs a read. Once more than
// filterCapacity keys have been added it is bypassed until the store is
// opened again and the filter rebuilt from the keys then held.
//
// Safe for concurrent use: bits are only ever set, atomically.
type filter struct {
	seed     maphash.Seed
	words    []atomic.Uint64
	capacity int64 // filterCapacity; smaller in tests
	added    atomic.Int64
	ready    atomic.Bool // every stored key is in it: its "absent" can be trusted
}

func newFilter() *filter {
	return &filter{seed: maphash.MakeSeed(), words: make([]atomic.Uint64, filterBits/64), capacity: filterCapacity}
}

// probe returns the bases of key's filterHashes bit positions: probe i is
// (a + i*b) mod filterBits (double hashing).
func (f *filter) probe(key []byte) (a, b uint64) {
	h := maphash.Bytes(f.seed, key)
	return h, h>>33 | 1
}

// add puts key in the filter.
func (f *filter) add(key []byte) {
	if f.added.Add(1) > f.capacity {
		return // full: absent says nothing any more, so nothing need be added
	}
	a, b := f.probe(key)
	for i := range uint64(filterHashes) {
		pos := (a + i*b) & (filterBits - 1)
		f.words[pos>>6].Or(1 << (pos & 63))
	}
}

// absent reports whether key is certainly not in the store. False means it
// may be (or the filter cannot tell): read the store.
func (f *filter) absent(key []byte) bool {
	if !f.ready.Load() || f.added.Load() > f.capacity {
		return false
	}
	a, b := f.probe(key)
	for i := range uint64(filterHashes) {
		pos := (a + i*b) & (filterBits - 1)
		if f.words[pos>>6].Load()&(1<<(pos&63)) == 0 {
			return true
		}
	}
	return false
}

// errStopped ends loadFilter's scan when the store closes.
var errStopped = errors.New("store closing")

// loadFilter adds every key held when the store was opened, of every scope
// (any may be asked, through Scoped), then lets Seen trust the filter. Keys recorded meanwhile are added by
// Record. If the scan fails the filter is never trusted: checks read
// Badger, as they would without it.
func (s *Store) loadFilter() {
	defer s.wg.Done()
	began := time.Now()
	n, err := s.scanKeys(func(k []byte) { s.filter.add(k) })
	switch {
	case errors.Is(err, errStopped):
		return
	case err != nil:
		s.log.Warn("cannot load the key filter; every check reads the store", "error", err)
		return
	}
	s.filter.ready.Store(true)
	s.log.Debug("key filter loaded", "keys", n, "took", time.Since(began).Round(time.Millisecond).String())
}

// scanKeys calls fn with every unexpired stored idempotency key, of every
// scope, until Close.
func (s *Store) scanKeys(fn func(k []byte)) (n int, err error) {
	txn := s.db.NewTransactionAt(math.MaxUint64, false)
	defer txn.Discard()
	opt := badger.DefaultIteratorOptions
	opt.PrefetchValues = false
	opt.Prefix = []byte{keyPrefix}
	it := txn.NewIterator(opt)
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		if n%4096 == 0 {
			select {
			case <-s.stop:
				return n, errStopped
			default:
			}
		}
		fn(it.Item().Key())
		n++
	}
	return n, nil
}
