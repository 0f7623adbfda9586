package main

import (
	"context"
	"io"
	"time"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/proxy"
)

// openStore opens the embedded dedup store (for the shared store, its local
// cache), unless dedup is off.
func (s *sidecar) openStore() (func(), error) {
	if !s.cfg.DedupEnabled() {
		s.log.Info("dedup off (COURIER_DEDUP_TTL=0): every delivery reaches the app")
		return nil, nil
	}
	store, err := dedup.Open(s.cfg.DedupDir, dedup.Options{
		TTL: s.cfg.DedupTTL, Scope: s.scope(), Logger: s.log, Registerer: s.reg,
		// Batches record keys several times as fast (README "Batches").
		HighRate: s.cfg.BatchMax > 1,
	})
	if err != nil {
		return nil, err
	}
	s.local, s.dd = store, store
	if s.cfg.BatchMax > 1 {
		s.log.Info("dedup store sized for batches: 4 MiB memtables and tables, about 20 MiB more memory", "component", "dedup")
	}
	return s.closer("dedup store", store), nil
}

// openSharedStore opens the key-value bucket shared by every courier of the
// durable, with the embedded store as its local cache; the bucket is created
// like the other streams courier makes, retried while JetStream does not
// answer. The shared store takes the embedded one over and closes it.
func (s *sidecar) openSharedStore(ctx context.Context) (func(), error) {
	var shared *dedup.Shared
	err := retrySetup(ctx, s.log, "shared dedup bucket", func(ctx context.Context) error {
		var err error
		shared, err = dedup.OpenShared(ctx, s.js, s.local, dedup.SharedOptions{
			Bucket: s.cfg.DedupBucket, Replicas: s.cfg.StreamReplicas, TTL: s.cfg.DedupTTL,
			// A claim lapses about an ack wait after its courier died,
			// when JetStream redelivers what that courier held; while it
			// lives it renews its claims, however long a request takes.
			ClaimTTL: max(s.cfg.AckWait+time.Second-1, time.Second).Truncate(time.Second),
			Scope:    s.scope(), Logger: s.log, Registerer: s.reg,
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	s.dd = shared
	s.log.Info("dedup keys in a shared key-value bucket", "bucket", s.cfg.DedupBucket, "ttl", s.cfg.DedupTTL.String())
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

// scope is what dedup keys are scoped to: they are the consumer's.
func (s *sidecar) scope() string { return s.cfg.Stream + "/" + s.cfg.Consumer }

// orderMarks is the order marks store as the delivery loop takes it: nil
// without order per key.
func (s *sidecar) orderMarks() proxy.OrderMarks {
	if s.marks == nil {
		return nil
	}
	return s.marks
}
