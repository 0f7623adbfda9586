package dedup

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The claims a Shared store holds: how each is named, remembered, renewed
// while its delivery runs, and released.
//
// A claim names its holder in a header, ClaimHolderHeader: the store's
// random id and the claim's number. Its value stays claimValue, so a
// courier of before (which tells a claim by its value alone) still reads
// it as a claim, and a claim of such a courier (no header) is never taken
// for this store's. The name is what lets a holder recognise its own
// claim at a revision it did not see acknowledged: a renewal stored whose
// answer came too late (a leader election, a stalled connection). Without
// it, every later renewal expected the old revision, was refused, and the
// claim lapsed one TTL later under a live holder.

// ClaimHolderHeader is the header of a claim in the bucket naming the
// store that made it and which of its claims it is.
const ClaimHolderHeader = "Courier-Claim-Holder"

// errClaimLost says a claim is no longer its holder's: it lapsed (the
// holder was cut off for longer than ClaimTTL) and the key now holds a
// marker, another courier's claim or a record.
var errClaimLost = errors.New("the key no longer holds this claim")

// heldClaim is a claim this store holds. mu orders a renewal against the
// Release that ends the claim, so that no renewal follows the release
// (which would leave the claim live until it lapses).
type heldClaim struct {
	scope *SharedScope // whose ClaimTTL it lives
	key   string       // the idempotency key, for the log
	id    string       // its ClaimHolderHeader value
	ended atomic.Bool  // recorded or released: renew no more

	mu      sync.Mutex
	rev     uint64    // the key's revision this claim was last written at
	at      time.Time // made or last renewed
	failing bool      // a renewal failed since the last that succeeded (logged once)
	lost    bool      // errClaimLost: renew and release no more
}

// newHolder is a store's id in the claims it makes: random, so that two
// couriers (or two stores of one process) never share one.
func newHolder() string {
	var b [9]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// claimID names a new claim of this store.
func (s *Shared) claimID() string {
	var b strings.Builder
	b.Grow(len(s.holder) + 1 + 13) // 13: the base-36 digits of a uint64
	b.WriteString(s.holder)
	b.WriteByte('.')
	var n [13]byte
	b.Write(strconv.AppendUint(n[:0], s.claimsMade.Add(1), 36))
	return b.String()
}

// claimHeader is the header of claim id expecting the key's last revision
// to be expect (0: absent), living the scope's ClaimTTL: what jetstream's
// WithExpectLastSequencePerSubject and WithMsgTTL options write, and the
// holder's name.
func (v *SharedScope) claimHeader(expect uint64, id string) nats.Header {
	h := nats.Header{
		jetstream.MsgTTLHeader: v.claimTTLValue,
		ClaimHolderHeader:      {id},
	}
	if expect == 0 {
		h[jetstream.ExpectedLastSubjSeqHeader] = expectAbsent
	} else {
		h[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(expect, 10)}
	}
	return h
}

// expectAbsent is the expected last revision of a key that holds nothing;
// shared read-only by every claim's header.
var expectAbsent = []string{"0"}

// hold remembers claim id of scope v on bk, made at revision rev.
func (s *Shared) hold(v *SharedScope, key, bk, id string, rev uint64) {
	now := time.Now()
	s.claimsMu.Lock()
	defer s.claimsMu.Unlock()
	s.claims[bk] = &heldClaim{scope: v, key: key, id: id, rev: rev, at: now}
	if len(s.claims) < s.claimsNext {
		return
	}
	// Claims neither recorded nor released (a caller that forgot) have
	// lapsed in the bucket: forget them here too.
	for k, c := range s.claims {
		if !c.mu.TryLock() {
			continue // being renewed
		}
		at := c.at
		c.mu.Unlock()
		if now.Sub(at) > c.scope.claimTTL {
			delete(s.claims, k)
		}
	}
	s.claimsNext = max(1024, 2*len(s.claims))
}

// take forgets the claim held on bk and returns its name and revision,
// unless it is known lost. A renewal under way is waited for, and none
// follows.
func (s *Shared) take(bk string) (id string, rev uint64, ok bool) {
	s.claimsMu.Lock()
	c, ok := s.claims[bk]
	delete(s.claims, bk)
	s.claimsMu.Unlock()
	if !ok {
		return "", 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended.Store(true)
	return c.id, c.rev, !c.lost
}

// end forgets the claims held on bks, which are being recorded: a renewal
// under way is not waited for (its expected revision keeps it from
// overwriting the record), and is not logged as a claim lost when it meets
// the record.
func (s *Shared) end(bks ...string) {
	s.claimsMu.Lock()
	defer s.claimsMu.Unlock()
	for _, bk := range bks {
		if c, ok := s.claims[bk]; ok {
			c.ended.Store(true)
			delete(s.claims, bk)
		}
	}
}

// release deletes claim id, last seen at revision rev, from bk, if the key
// still holds it: when the key's last revision is another, it is read, and
// the claim deleted at the newer revision if it is still this one (a
// renewal stored whose answer never came).
func (v *SharedScope) release(ctx context.Context, bk, id string, rev uint64) error {
	s := v.s
	for range claimTries {
		m := nats.NewMsg(bk)
		m.Header.Set(kvOperation, "DEL")
		_, err := s.js.PublishMsg(ctx, m,
			jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(v.claimTTL))
		switch {
		case err == nil, errors.Is(err, jetstream.ErrNoStreamResponse):
			return nil // released; or the bucket is gone
		case !isWrongLastSeq(err):
			return s.bucketError(opRelease, err)
		}
		if rev, err = s.ownClaim(ctx, bk, id); errors.Is(err, errClaimLost) {
			return nil // no longer this store's
		} else if err != nil {
			return s.bucketError(opRead, err)
		}
	}
	return nil
}

// ownClaim reads bk and returns the revision it holds claim id at, or
// errClaimLost if it holds anything else.
func (s *Shared) ownClaim(ctx context.Context, bk, id string) (uint64, error) {
	r, err := s.readLast(ctx, bk)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, errClaimLost // lapsed, and its marker gone too
	case err != nil:
		return 0, err
	case !r.claim() || r.header.Get(ClaimHolderHeader) != id:
		return 0, errClaimLost
	}
	return r.rev, nil
}

// renewClaims renews, until Close, every claim held for half its scope's
// ClaimTTL, so that a claim lapses when its holder is gone, not while its
// delivery is held longer than ClaimTTL. A renewal that fails is tried
// again at the next tick (a quarter of the shortest ClaimTTL), as long as
// the claim lives.
func (s *Shared) renewClaims() {
	defer s.renewing.Done()
	every := s.renewEvery()
	t := time.NewTicker(every)
	defer t.Stop()
	var due []*heldClaim
	var keys []string
	for {
		select {
		case <-s.renewCtx.Done():
			return
		case <-s.retick:
			if d := s.renewEvery(); d != every {
				every = d
				t.Reset(d)
			}
			continue
		case <-t.C:
		}
		now := time.Now()
		due, keys = due[:0], keys[:0]
		s.claimsMu.Lock()
		for bk, c := range s.claims {
			c.mu.Lock()
			if !c.lost && now.Sub(c.at) >= c.scope.claimTTL/2 {
				due, keys = append(due, c), append(keys, bk)
			}
			c.mu.Unlock()
		}
		s.claimsMu.Unlock()
		for i, c := range due {
			if s.renewCtx.Err() != nil {
				return
			}
			s.renew(keys[i], c)
		}
		clear(due)
	}
}

// renewEvery is the renewal loop's tick: a quarter of the shortest
// ClaimTTL of the scopes, so that a claim is renewed between half and
// three quarters of its life.
func (s *Shared) renewEvery() time.Duration {
	return max(time.Duration(s.renewTick.Load()), 10*time.Millisecond)
}

// renewAtLeastEvery shortens the renewal loop's tick to d if it is longer,
// and wakes the loop to take it.
func (s *Shared) renewAtLeastEvery(d time.Duration) {
	for {
		cur := s.renewTick.Load()
		if int64(d) >= cur {
			return
		}
		if s.renewTick.CompareAndSwap(cur, int64(d)) {
			select {
			case s.retick <- struct{}{}:
			default: // a wake-up is pending; it reads the newest tick
			}
			return
		}
	}
}

// renew writes claim c on bk again to live another ClaimTTL, and logs the
// first renewal of c that fails (a warning: if none succeeds within
// ClaimTTL, another delivery of the key may go ahead), the one that
// succeeds after it, and a claim found lost; not every tick's attempt.
func (s *Shared) renew(bk string, c *heldClaim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended.Load() || c.lost {
		return
	}
	ctx, cancel := context.WithTimeout(s.renewCtx, min(s.timeout, c.scope.claimTTL/2))
	defer cancel()
	err := s.rewrite(ctx, bk, c)
	switch {
	case err == nil:
		if c.failing {
			c.failing = false
			s.log.Info("claim renewed again", "key", c.key)
		}
	case s.renewCtx.Err() != nil:
		// Closing: the claim lapses after ClaimTTL, as Close says.
	case errors.Is(err, errClaimLost):
		c.lost = true
		if c.ended.Load() {
			return // recorded meanwhile: the record is what the renewal met
		}
		s.log.Warn("claim lost: it lapsed while this courier could not renew it (cut off for longer than the claim TTL), "+
			"so another delivery of the key may reach the app", "key", c.key, "error", s.bucketError(opRenew, err),
			"claim_ttl", c.scope.claimTTL.String())
	default:
		err = s.bucketError(opRenew, err)
		if !c.failing {
			c.failing = true
			s.log.Warn("cannot renew a claim; trying again every quarter claim TTL until it lapses",
				"key", c.key, "error", err, "claim_ttl", c.scope.claimTTL.String())
		}
	}
}

// rewrite writes claim c on bk again, expecting it at its revision. When
// the key's last revision is another, the key is read: if it holds c at a
// newer revision (an earlier renewal stored, its answer too late), c
// carries on from there; if not (recorded, or lapsed and taken over),
// errClaimLost.
func (s *Shared) rewrite(ctx context.Context, bk string, c *heldClaim) error {
	for range claimTries {
		ack, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: bk, Header: c.scope.claimHeader(c.rev, c.id), Data: claimValue})
		if err == nil {
			c.rev, c.at = ack.Sequence, time.Now()
			return nil
		}
		if !isWrongLastSeq(err) {
			return err
		}
		rev, err := s.ownClaim(ctx, bk, c.id)
		if err != nil {
			return err
		}
		c.rev = rev
	}
	return fmt.Errorf("key kept changing over %d tries", claimTries)
}
