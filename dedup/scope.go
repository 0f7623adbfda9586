package dedup

import (
	"fmt"
	"strings"
	"time"
)

// StoreScope is the keys of one scope in a Store: those a Store opened with
// Options.Scope set to it takes, stored as the same Badger keys, so that a
// process that serves one consumer with a Store of its own and later
// several with scopes of one Store (or the other way round) finds the keys
// it recorded. Get it from Store.Scoped.
//
// It shares everything of its Store (the Badger database, the key filter,
// the disk watch, the metrics) and has no Close: the Store's owner closes
// the Store once, after which every scope of it answers ErrClosed.
//
// Its methods are the Store's for keys of its scope, and safe for
// concurrent use.
type StoreScope struct {
	s      *Store
	scope  string
	prefix []byte        // keyPrefix + scope + NUL
	ttl    time.Duration // how long Record remembers a key
}

// ScopeOptions tunes a scope of a Store. Every zero value means the
// documented default.
type ScopeOptions struct {
	// TTL is how long Record remembers a key of the scope: at least one
	// second. Zero means the Store's (Options.TTL).
	TTL time.Duration
}

// Scoped returns the keys of scope in s (scope as in Options.Scope: no NUL
// byte; typically stream/consumer). The scope s was opened with answers as
// s itself does. It may be called any number of times, for any scope, and
// concurrently; scopes need no Close. It fails only for a bad scope or TTL.
func (s *Store) Scoped(scope string, o ScopeOptions) (*StoreScope, error) {
	if o.TTL == 0 {
		o.TTL = s.own.ttl
	}
	if o.TTL < time.Second {
		return nil, fmt.Errorf("dedup: scope %q: TTL %v: must be at least 1s (Badger keeps expiry in whole seconds)", scope, o.TTL)
	}
	if err := checkScope(scope); err != nil {
		return nil, err
	}
	return newStoreScope(s, scope, o.TTL), nil
}

func newStoreScope(s *Store, scope string, ttl time.Duration) *StoreScope {
	prefix := make([]byte, 0, len(scope)+2)
	prefix = append(prefix, keyPrefix)
	prefix = append(prefix, scope...)
	prefix = append(prefix, 0)
	return &StoreScope{s: s, scope: scope, prefix: prefix, ttl: ttl}
}

// checkScope refuses a scope with a NUL byte, which ends a scope in a
// stored key.
func checkScope(scope string) error {
	if strings.IndexByte(scope, 0) >= 0 {
		return fmt.Errorf("dedup: scope %q: must not contain a NUL byte", scope)
	}
	return nil
}

// Scope is the scope's name.
func (v *StoreScope) Scope() string { return v.scope }

// Healthy is the Store's: nil while it can take writes.
func (v *StoreScope) Healthy() error { return v.s.Healthy() }

// QuickCheck reports true, as the Store's.
func (v *StoreScope) QuickCheck() bool { return true }
