package dedup

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// KV is a key store shared by several couriers: processed keys live in a
// JetStream key-value bucket whose TTL is the dedup TTL, so replicas of one
// consumer recognise each other's keys. It assumes only what a bucket offers
// atomically: create-if-absent, with the bucket's TTL. Each check and each
// record is a round trip to the server, so it is slower than Store; use it
// when more than one courier consumes the same durable. Safe for concurrent
// use; it holds no resources of its own (the connection is the caller's).
type KV struct {
	kv       jetstream.KeyValue
	scope    string
	duration *durations // served through Collector
}

// errCodeStreamWrongLastSequence is the code a replicated bucket may answer
// a create with when the key exists (on the path where the old one expired):
// the same meaning as ErrKeyExists (10071).
const errCodeStreamWrongLastSequence = 10164

// OpenKV creates or updates the bucket, file-backed with the given replicas
// and TTL (whole seconds, at least 1s), and returns a store on it scoped by
// scope (typically stream/consumer).
func OpenKV(ctx context.Context, js jetstream.JetStream, bucket, scope string, ttl time.Duration, replicas int) (*KV, error) {
	if ttl < time.Second {
		return nil, fmt.Errorf("dedup: KV TTL %s: must be at least 1s", ttl)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "courier: processed idempotency keys",
		History:     1,
		TTL:         ttl,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("dedup: key-value bucket %q: %w", bucket, err)
	}
	return &KV{kv: kv, scope: base64.RawURLEncoding.EncodeToString([]byte(scope)), duration: newDurations()}, nil
}

// Collector returns the store's metric, courier_dedup_duration_seconds{op}
// (as Store serves it), for the caller to register once.
func (s *KV) Collector() prometheus.Collector { return s.duration.vec }

// kvKey maps a key to a valid bucket key: bucket keys allow only
// [-/_=.A-Za-z0-9], which base64url covers.
func (s *KV) kvKey(key string) (string, error) {
	if key == "" {
		return "", ErrEmptyKey
	}
	return s.scope + "." + base64.RawURLEncoding.EncodeToString([]byte(key)), nil
}

// Seen reports whether key was recorded and has not expired.
func (s *KV) Seen(ctx context.Context, key string) (bool, error) {
	defer since(s.duration.check, time.Now())
	k, err := s.kvKey(key)
	if err != nil {
		return false, err
	}
	_, err = s.kv.Get(ctx, k)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("dedup: check key: %w", err)
	}
}

// kvParallel bounds the creates one Record has in flight at once.
const kvParallel = 32

// Record records keys, creating each in the bucket; a key another courier
// recorded first is recorded. The creates of one call run concurrently, so a
// batch costs about one round trip, not one per key. Every key is validated
// before any is written. It returns once every create has been answered,
// with the first error if any failed (the others may be recorded).
func (s *KV) Record(ctx context.Context, keys ...string) error {
	defer since(s.duration.record, time.Now())
	kks := make([]string, len(keys))
	for i, key := range keys {
		k, err := s.kvKey(key)
		if err != nil {
			return err
		}
		kks[i] = k
	}
	if len(kks) == 1 {
		return s.create(ctx, kks[0])
	}
	errs := make([]error, len(kks))
	sem := make(chan struct{}, kvParallel)
	var wg sync.WaitGroup
	for i, k := range kks {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = s.create(ctx, k)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *KV) create(ctx context.Context, k string) error {
	_, err := s.kv.Create(ctx, k, nil)
	var apiErr *jetstream.APIError
	switch {
	case err == nil, errors.Is(err, jetstream.ErrKeyExists):
		return nil
	case errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStreamWrongLastSequence:
		return nil
	default:
		return fmt.Errorf("dedup: record key: %w", err)
	}
}
