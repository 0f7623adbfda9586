package dedup

import (
	"encoding/base64"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// SharedScope is the keys of one scope in a Shared store: those a Shared
// store opened with SharedOptions.Scope set to it takes, under the same
// bucket keys (and cached locally under the same Badger keys), so that a
// process that serves one consumer with a Shared store of its own and later
// several with scopes of one Shared store (or the other way round), and the
// other replicas whichever they run, find each other's keys and claims.
// Get it from Shared.Scoped.
//
// It shares everything of its Shared store (the connection, the bucket,
// the local Store, the renewal of claims, the metrics) and has no Close:
// the Shared store's owner closes it once, after which every scope of it
// answers ErrClosed, and claims still held lapse after their ClaimTTL.
//
// Its methods are the Shared store's for keys of its scope, and safe for
// concurrent use.
type SharedScope struct {
	s        *Shared
	scope    string
	local    *StoreScope   // the local cache's keys of the scope
	subject  string        // $KV.<bucket>.<base64url scope>.
	ttl      time.Duration // how long a processed key is remembered
	claimTTL time.Duration // how long a claim lives unrenewed

	// The header of a processed record and the TTL value of a claim's,
	// built once and shared by every publish: read-only, as jetstream
	// leaves a message's headers alone when it is given no options.
	processedHdr  nats.Header
	claimTTLValue []string
}

// SharedScopeOptions tunes a scope of a Shared store. Every zero value
// means the documented default.
type SharedScopeOptions struct {
	// TTL is how long a processed key of the scope is remembered: whole
	// seconds, at least 1s, at most the Shared store's TTL (the bucket
	// keeps nothing longer; open the Shared store with the longest TTL of
	// its scopes). Zero means the Shared store's (SharedOptions.TTL).
	TTL time.Duration
	// ClaimTTL is how long a claim of the scope lives if its holder
	// neither records nor releases it (SharedOptions.ClaimTTL says why):
	// about the AckWait of the scope's consumer. Whole seconds, at least
	// 1s. Zero means the Shared store's (SharedOptions.ClaimTTL).
	ClaimTTL time.Duration
}

// Scoped returns the keys of scope in s (scope as in SharedOptions.Scope;
// typically stream/consumer). The scope s was opened with, with the same
// TTLs, answers as s itself does. It may be called any number of times,
// for any scope, and concurrently; scopes need no Close. It fails only for
// a bad scope or TTL.
func (s *Shared) Scoped(scope string, o SharedScopeOptions) (*SharedScope, error) {
	o.TTL = cmp0(o.TTL, s.ttl)
	o.ClaimTTL = cmp0(o.ClaimTTL, s.claimTTL)
	if err := (SharedOptions{TTL: o.TTL, ClaimTTL: o.ClaimTTL}).validate(); err != nil {
		return nil, fmt.Errorf("dedup: scope %q: %w", scope, err)
	}
	if o.TTL > s.ttl {
		return nil, fmt.Errorf("dedup: scope %q: TTL %v: must be at most the shared store's, %v "+
			"(the bucket keeps keys no longer; open the shared store with the longest TTL)", scope, o.TTL, s.ttl)
	}
	return s.newScope(scope, o)
}

// newScope builds scope with o's TTLs, taken as valid, and has the renewal
// loop tick often enough for its claims.
func (s *Shared) newScope(scope string, o SharedScopeOptions) (*SharedScope, error) {
	local, err := s.local.Scoped(scope, ScopeOptions{TTL: o.TTL})
	if err != nil {
		return nil, err
	}
	v := &SharedScope{
		s:             s,
		scope:         scope,
		local:         local,
		subject:       "$KV." + s.bucket + "." + base64.RawURLEncoding.EncodeToString([]byte(scope)) + ".",
		ttl:           o.TTL,
		claimTTL:      o.ClaimTTL,
		processedHdr:  nats.Header{jetstream.MsgTTLHeader: {o.TTL.String()}},
		claimTTLValue: []string{o.ClaimTTL.String()},
	}
	s.renewAtLeastEvery(o.ClaimTTL / 4)
	return v, nil
}

// Scope is the scope's name.
func (v *SharedScope) Scope() string { return v.scope }

// Healthy is the local Store's: nil while it can take writes.
func (v *SharedScope) Healthy() error { return v.s.Healthy() }
