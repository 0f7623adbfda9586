package dedup

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
)

// What a key holds in the bucket. A processed key is empty, as the earlier
// kv store wrote them, so a bucket it filled is read correctly. A claim's
// holder is in its header (ClaimHolderHeader, claims.go), not in its value,
// which couriers of before compare whole.
var claimValue = []byte("claim")

// kvOperation is the header of a key-value delete marker (nats.go's kvop).
const kvOperation = "KV-Operation"

// maxEncodedKey bounds an idempotency key written as such into a bucket key
// (a subject); a longer one is written as its SHA-256.
const maxEncodedKey = 512

// claimTries bounds how many times Check re-reads a key that changed under
// it (a claim lapsing, a follower behind its leader) before giving up.
const claimTries = 5

// Shared is a key store shared by every courier of a durable: processed keys
// and claims live in a replicated JetStream key-value bucket, and the local
// Store caches the keys this courier has seen processed, so checking them
// costs no round trip.
//
// A key's life in the bucket: Check of a key unknown locally creates it
// (create-if-absent, with a per-key TTL of ClaimTTL) holding a claim, and
// answers New; Record overwrites it with a processed record (TTL); Release
// deletes the claim if it is still the caller's. While its holder lives, a
// claim is renewed every half ClaimTTL until Record or Release, however long
// the delivery is held (an app outage, the breaker, a success record that
// cannot be stored yet); a claim names its holder, so a renewal stored but
// acknowledged too late is recognised by the next (claims.go), and a claim
// lapses only when its holder is gone or cut off from the bucket for longer
// than ClaimTTL. A Check that finds a live claim answers Claimed;
// one that finds a processed record answers Processed and caches the key. A
// courier that dies holding a claim loses nothing: the claim lapses after
// ClaimTTL.
//
// Every bucket write is one publish awaited by its caller; concurrent
// callers' publishes share the connection (pipelined), and Record sends a
// batch's publishes together before awaiting any.
//
// Its methods take keys in the scope it was opened with
// (SharedOptions.Scope); Scoped gives the keys of any other scope in the
// same bucket and local Store, so that one process serving several
// consumers shares one of each.
//
// All methods are safe for concurrent use. Close it, which closes the local
// Store.
type Shared struct {
	js       jetstream.JetStream
	local    *Store
	log      *slog.Logger
	bucket   string
	stream   string // KV_<bucket>
	replicas int
	ttl      time.Duration // the bucket's, the longest a scope may have
	claimTTL time.Duration // own's, and the bucket's marker TTL
	timeout  time.Duration
	m        *sharedMetrics

	// own is the scope the store was opened with, which its own methods
	// serve.
	own *SharedScope

	// msgGet is the API subject readLast asks the stream leader.
	msgGet string

	// holder names this store in its claims, numbered by claimsMade
	// (claims.go).
	holder     string
	claimsMade atomic.Uint64

	// claims maps the bucket key of each claim this store holds to it,
	// for Release and renewal; entries not renewed for claimTTL are
	// dropped.
	claimsMu   sync.Mutex
	claims     map[string]*heldClaim
	claimsNext int // size at which the map is swept next

	// The renewal loop, and what Close calls to stop it (a renewal under
	// way included). renewTick is how often it looks for claims due (a
	// quarter of the shortest ClaimTTL of the scopes), retick wakes it
	// when a scope shortens it.
	renewCtx  context.Context
	stopRenew context.CancelFunc
	renewing  sync.WaitGroup
	renewTick atomic.Int64 // nanoseconds
	retick    chan struct{}

	recreateMu sync.Mutex

	closeOnce sync.Once
	closeErr  error
	closedMu  sync.RWMutex
	closed    bool
}

// OpenShared opens the shared store on the bucket, creating the bucket when
// missing (file storage, SharedOptions.Replicas, TTL, per-key TTLs on, which
// needs nats-server 2.11+) and checking an existing one can serve (errors
// wrapping ErrBucket say what to change). local is this courier's Store, the
// cache; Shared takes it over and closes it in Close. On error the caller
// still owns local. Keys are cached in local under SharedOptions.Scope
// (local.Scoped), whatever the scope local was opened with.
func OpenShared(ctx context.Context, js jetstream.JetStream, local *Store, o SharedOptions) (*Shared, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if local == nil {
		return nil, errors.New("dedup: shared store needs a local store")
	}
	if o.Bucket == "" {
		o.Bucket = DefaultBucket
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Shared{
		js:       js,
		local:    local,
		log:      log.With("component", "dedup"),
		bucket:   o.Bucket,
		stream:   "KV_" + o.Bucket,
		replicas: max(o.Replicas, 1),
		ttl:      o.TTL,
		claimTTL: cmp0(o.ClaimTTL, DefaultClaimTTL),
		timeout:  cmp0(o.Timeout, DefaultSharedTimeout),
		holder:   newHolder(),
		claims:   map[string]*heldClaim{},
		retick:   make(chan struct{}, 1),
	}
	s.claimsNext = 1024
	s.renewTick.Store(int64(s.claimTTL / 4))
	var err error
	if s.own, err = s.newScope(o.Scope, SharedScopeOptions{TTL: s.ttl, ClaimTTL: s.claimTTL}); err != nil {
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.openBucket(ctx); err != nil {
		return nil, err
	}
	s.msgGet = jsutil.APIPrefix(js) + "STREAM.MSG.GET." + s.stream
	if s.m, err = newSharedMetrics(o.Registerer); err != nil {
		return nil, fmt.Errorf("dedup: shared store metrics: %w", err)
	}
	s.renewCtx, s.stopRenew = context.WithCancel(context.Background())
	s.renewing.Add(1)
	go s.renewClaims()
	s.log.Debug("shared dedup store open", "bucket", s.bucket, "scope", o.Scope,
		"ttl", s.ttl.String(), "claim_ttl", s.claimTTL.String())
	return s, nil
}

// bound gives ctx the store's timeout unless it has a deadline.
func (s *Shared) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.timeout)
}

// bucketKey is key's subject in the bucket: the scope's token, then the key
// in base64url (bucket keys allow only [-/_=.A-Za-z0-9]), or "h." and its
// SHA-256 for a long one (a third token, so never mistaken for a key).
func (v *SharedScope) bucketKey(key string) (string, error) {
	if key == "" {
		return "", ErrEmptyKey
	}
	if len(key) > maxEncodedKey {
		sum := sha256.Sum256([]byte(key))
		return v.subject + "h." + base64.RawURLEncoding.EncodeToString(sum[:]), nil
	}
	return v.subject + base64.RawURLEncoding.EncodeToString([]byte(key)), nil
}

// use runs f unless the store is closed.
func (s *Shared) use(f func() error) error {
	s.closedMu.RLock()
	defer s.closedMu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	return f()
}

// Check answers Processed for a key the local cache holds, without a round
// trip. Otherwise it claims the key in the bucket: New if the claim is made
// (the caller holds it and must Record or Release the key), Claimed if
// another claim is live, Processed if the bucket has the key recorded (it
// is then cached locally). A claim found lapsed is taken over. It returns an
// error, never New, when the bucket cannot be asked (unreachable, no
// answer within the context or the store's timeout): the caller must not
// send the message unchecked. Errors of the local Store (ErrDiskLow) are
// returned as they are.
func (s *Shared) Check(ctx context.Context, key string) (Verdict, error) {
	return s.own.Check(ctx, key)
}

// Check is Shared.Check for a key of this scope.
func (v *SharedScope) Check(ctx context.Context, key string) (verdict Verdict, err error) {
	s := v.s
	bk, err := v.bucketKey(key)
	if err != nil {
		return New, err
	}
	err = s.use(func() error {
		if verdict, err = v.local.Check(ctx, key); err != nil || verdict == Processed {
			if err == nil {
				s.m.checks.WithLabelValues("local").Inc()
			}
			return err
		}
		ctx, cancel := s.bound(ctx)
		defer cancel()
		verdict, err = v.claim(ctx, key, bk)
		return err
	})
	if err != nil {
		s.m.checks.WithLabelValues("error").Inc()
		return New, err
	}
	s.m.checks.WithLabelValues(verdict.String()).Inc()
	return verdict, nil
}

// claim creates bk holding a claim, expecting it absent (revision 0) or
// holding a delete marker, as a key-value Create does, and reads what it
// holds when it exists.
func (v *SharedScope) claim(ctx context.Context, key, bk string) (Verdict, error) {
	s := v.s
	var expect uint64
	recreated := false
	id := s.claimID()
	for range claimTries {
		ack, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: bk, Header: v.claimHeader(expect, id), Data: claimValue})
		switch {
		case err == nil:
			s.hold(v, key, bk, id, ack.Sequence)
			return New, nil
		case (errors.Is(err, jetstream.ErrNoStreamResponse) || isTTLDisabled(err)) && !recreated:
			if !s.recreate(ctx) {
				return New, s.bucketError(opClaim, err)
			}
			recreated = true
			continue
		case !isWrongLastSeq(err):
			return New, s.bucketError(opClaim, err)
		}
		// The key exists: read what it holds.
		r, err := s.readLast(ctx, bk)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound) && expect == 0:
			// Refused, yet nothing stored: on a replicated bucket the
			// leader refuses a write while another to the key is still
			// being replicated. Someone's claim (or record) is on its way.
			return Claimed, nil
		case errors.Is(err, jetstream.ErrMsgNotFound):
			expect = 0 // the marker expired meanwhile: create
			continue
		case err != nil:
			return New, s.bucketError(opRead, err)
		}
		switch {
		case r.deleted():
			expect = r.rev // released or lapsed: claim over the marker
		case r.claim():
			return Claimed, nil
		default:
			v.cache(ctx, key, r.time)
			return Processed, nil
		}
	}
	return New, s.bucketError(opClaim, fmt.Errorf("key kept changing over %d tries", claimTries))
}

// cache records locally a key the bucket holds as processed, for what is
// left of its life there. A failure only costs a round trip next time.
func (v *SharedScope) cache(ctx context.Context, key string, recorded time.Time) {
	left := v.ttl - time.Since(recorded)
	if left < time.Second {
		return
	}
	if err := v.local.record(ctx, left, []string{key}); err != nil {
		v.s.log.Debug("cannot cache a key processed elsewhere", "error", err)
	}
}

// Record records keys as processed, in the bucket (every key's write sent
// before any is awaited) and in the local cache at once, and returns nil
// only once both hold every key; otherwise the errors of both, joined (a
// key the bucket missed is recorded where the error says, and its claim
// lapses after ClaimTTL). A processed record replaces whatever the key held
// (this caller's claim, a claim that took over a lapsed one, an earlier
// record). Every key is validated before any is written.
func (s *Shared) Record(ctx context.Context, keys ...string) error { return s.own.Record(ctx, keys...) }

// Record is Shared.Record for keys of this scope, remembered for the
// scope's TTL.
func (v *SharedScope) Record(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	s := v.s
	bks := make([]string, len(keys))
	for i, key := range keys {
		bk, err := v.bucketKey(key)
		if err != nil {
			return err
		}
		bks[i] = bk
	}
	return s.use(func() error {
		ctx, cancel := s.bound(ctx)
		defer cancel()
		// The claims end here, whatever the outcome: a key the bucket
		// misses is not renewed, and lapses.
		s.end(bks...)
		// The bucket's writes go out first; the local commit runs while
		// they travel.
		futures, sendErr := v.sendProcessed(bks)
		localErr := v.local.Record(ctx, keys...)
		err := v.awaitProcessed(ctx, bks, futures, sendErr, true)
		return errors.Join(err, localErr)
	})
}

// sendProcessed publishes a processed record for each key without waiting
// for any acknowledgement. It stops at the first publish that cannot be
// sent.
func (v *SharedScope) sendProcessed(bks []string) ([]jetstream.PubAckFuture, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(bks))
	for _, bk := range bks {
		f, err := v.s.js.PublishMsgAsync(&nats.Msg{Subject: bk, Header: v.processedHdr})
		if err != nil {
			return futures, err
		}
		futures = append(futures, f)
	}
	return futures, nil
}

// awaitProcessed awaits the acknowledgements of sendProcessed. If every
// failure says no stream answered, or per-key TTLs are off, and the bucket
// turns out deleted or made again without them, it is created again or
// has them turned on, and those keys are written into it (once, if
// mayRecreate).
func (v *SharedScope) awaitProcessed(ctx context.Context, bks []string, futures []jetstream.PubAckFuture, sendErr error, mayRecreate bool) error {
	s := v.s
	if sendErr != nil {
		return s.bucketError(opRecord, sendErr)
	}
	var failed []string
	var errs []error
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if errors.Is(err, jetstream.ErrNoStreamResponse) || isTTLDisabled(err) {
				failed = append(failed, bks[i])
			}
			errs = append(errs, err)
		case <-ctx.Done():
			return s.bucketError(opRecord, fmt.Errorf("%d of %d keys unacknowledged: %w", len(futures)-i, len(futures), ctx.Err()))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	if mayRecreate && len(failed) == len(errs) && s.recreate(ctx) {
		futures, sendErr := v.sendProcessed(failed)
		return v.awaitProcessed(ctx, failed, futures, sendErr, false)
	}
	return s.bucketError(opRecord, fmt.Errorf("%d of %d keys not recorded: %w", len(errs), len(bks), errs[0]))
}

// Release gives up the claim this store holds on key after a failed
// attempt, so that another delivery may go ahead at once: the claim is
// deleted if it is still this store's (not lapsed and taken over, not
// recorded). Without a claim it does nothing. An error leaves the claim to
// lapse after ClaimTTL.
func (s *Shared) Release(ctx context.Context, key string) error { return s.own.Release(ctx, key) }

// Release is Shared.Release for a key of this scope.
func (v *SharedScope) Release(ctx context.Context, key string) error {
	s := v.s
	bk, err := v.bucketKey(key)
	if err != nil {
		return err
	}
	id, rev, ok := s.take(bk)
	if !ok {
		return nil
	}
	return s.use(func() error {
		ctx, cancel := s.bound(ctx)
		defer cancel()
		return v.release(ctx, bk, id, rev)
	})
}

// Seen reports whether key is recorded, locally or in the bucket, without
// claiming it: for a caller that only asks (the delivery loop's marks of
// reference dead letters, and callers of the Seen/Record interface of
// before). Check is what makes concurrent deliveries on different couriers
// call the app once.
func (s *Shared) Seen(ctx context.Context, key string) (bool, error) { return s.own.Seen(ctx, key) }

// Seen is Shared.Seen for a key of this scope.
func (v *SharedScope) Seen(ctx context.Context, key string) (bool, error) {
	verdict, err := v.Peek(ctx, key)
	return verdict == Processed, err
}

// Healthy is the local Store's: nil while it can take writes.
func (s *Shared) Healthy() error { return s.local.Healthy() }

// Close closes the local Store (bounded by its CloseTimeout) and
// unregisters the metrics. Claims still held lapse after ClaimTTL. The
// connection is the caller's. Idempotent: later calls return the first's
// result.
func (s *Shared) Close() error {
	s.closeOnce.Do(func() {
		s.closedMu.Lock()
		s.closed = true
		s.closedMu.Unlock()
		s.stopRenew()
		s.renewing.Wait()
		s.m.unregister()
		s.closeErr = s.local.Close()
	})
	return s.closeErr
}
