package main

import (
	"context"
	"io"
	"time"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/proxy"
)

// openStore opens the embedded dedup store (for the shared store, its local
// cache), unless every subscription has dedup off. One store serves every
// subscription, each in its own scope (dedupView); it is opened with the
// first one's, as courier with one subscription always has.
func (s *sidecar) openStore() (func(), error) {
	var ttl time.Duration
	batches := false
	for _, p := range s.paths {
		ttl = max(ttl, p.cfg.DedupTTL)
		batches = batches || p.cfg.BatchMax > 1
	}
	if ttl == 0 {
		s.log.Info("dedup off (COURIER_DEDUP_TTL=0): every delivery reaches the app")
		return nil, nil
	}
	store, err := dedup.Open(s.cfg.DedupDir, dedup.Options{
		TTL: ttl, Scope: s.paths[0].scope(), Logger: s.log, Registerer: s.reg,
		// Batches record keys several times as fast (README "Batches").
		HighRate: batches,
	})
	if err != nil {
		return nil, err
	}
	s.local, s.store = store, store
	if batches {
		s.log.Info("dedup store sized for batches: 4 MiB memtables and tables, about 20 MiB more memory", "component", "dedup")
	}
	return s.closer("dedup store", store), nil
}

// claimTTL is how long a claim in the shared store outlives a courier that
// died holding it: about an ack wait, when JetStream redelivers what that
// courier held; while it lives it renews its claims (every quarter of it),
// however long a request takes. With order per key, what a courier that
// died had out is delivered again as soon as the others see it gone (within
// memberTTL; proxy's redeliverOrphaned): its claims last a second longer
// than that, not an ack wait, for those messages not to wait for them.
func claimTTL(cfg config.Config) time.Duration {
	ttl := max(cfg.AckWait+time.Second-1, time.Second).Truncate(time.Second)
	if cfg.OrderKey != "" {
		ttl = min(ttl, orderClaimTTL)
	}
	return ttl
}

// orderClaimTTL is a claim's TTL with order per key: the membership's TTL
// and a second.
const orderClaimTTL = memberTTL + time.Second

// dedupView is the path's Deduper: the store itself for the one path of a
// courier without COURIER_SUBSCRIPTIONS, else the store's view of the
// path's scope, with its own TTL (and claim TTL); nil with dedup off.
func (p *path) dedupView() (proxy.Deduper, error) {
	if p.store == nil || !p.cfg.DedupEnabled() {
		return nil, nil
	}
	if p.name == "" {
		return p.store, nil
	}
	if shared, ok := p.store.(*dedup.Shared); ok {
		return shared.Scoped(p.scope(), dedup.SharedScopeOptions{TTL: p.cfg.DedupTTL, ClaimTTL: claimTTL(p.cfg)})
	}
	return p.local.Scoped(p.scope(), dedup.ScopeOptions{TTL: p.cfg.DedupTTL})
}

// openSharedStore opens the key-value bucket shared by every courier of the
// durable, with the embedded store as its local cache; the bucket is created
// like the other streams courier makes, retried while JetStream does not
// answer. The shared store takes the embedded one over and closes it.
func (s *sidecar) openSharedStore(ctx context.Context) (func(), error) {
	first := s.paths[0].cfg
	var ttl time.Duration
	for _, p := range s.paths {
		ttl = max(ttl, p.cfg.DedupTTL)
	}
	var shared *dedup.Shared
	err := retrySetup(ctx, s.log, "shared dedup bucket", func(ctx context.Context) error {
		var err error
		shared, err = dedup.OpenShared(ctx, s.js, s.local, dedup.SharedOptions{
			Bucket: s.cfg.DedupBucket, Replicas: s.cfg.StreamReplicas, TTL: ttl,
			ClaimTTL: claimTTL(first), Scope: s.paths[0].scope(), Logger: s.log, Registerer: s.reg,
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	s.store = shared
	s.log.Info("dedup keys in a shared key-value bucket", "bucket", s.cfg.DedupBucket, "ttl", ttl.String())
	return s.closer("shared dedup store", shared), nil
}

// closer returns what closes store, if it holds anything to close.
func (s *sidecar) closer(what string, store any) func() {
	c, ok := store.(io.Closer)
	if !ok {
		return nil
	}
	return func() {
		if err := c.Close(); err != nil {
			s.log.Error("closing the "+what, "error", err)
		}
	}
}

// scope is what dedup keys are scoped to: they are the consumer'p.
func (p *path) scope() string { return p.cfg.Stream + "/" + p.cfg.Consumer }

// orderMarks is the order marks store as the delivery loop takes it: nil
// without order per key.
func (p *path) orderMarks() proxy.OrderMarks {
	if p.marks == nil {
		return nil
	}
	return p.marks
}
