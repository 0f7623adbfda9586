// Package ordermark keeps the marks of order per key (COURIER_ORDER_KEY)
// in a replicated JetStream key-value bucket of the durable consumer's own:
// for each key whose first message is unsettled while later ones wait, or
// which is being retried, the stream sequence of that first message. A
// courier that starts, or takes over the durable from another replica,
// reads them so that a later message of such a key, redelivered first,
// waits for it. Marks are few: one per key under contention or retry.
package ordermark

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Description is the description Open gives the bucket it creates: `courier
// cleanup` removes only a bucket that carries it.
const Description = "courier: order per key (COURIER_ORDER_KEY), the first unsettled message of busy keys"

// Store is the marks of one durable consumer. Safe for concurrent use.
type Store struct {
	kv jetstream.KeyValue
}

// BucketName is the bucket of the marks of consumer on stream: one per
// durable, its name made of theirs (characters a bucket name cannot hold
// become "_").
func BucketName(stream, consumer string) string {
	clean := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
				return r
			}
			return '_'
		}, s)
	}
	return "COURIER_ORDER_" + clean(stream) + "_" + clean(consumer)
}

// Open creates the bucket if it is missing (replicas as given) and returns
// its store.
func Open(ctx context.Context, js jetstream.JetStream, stream, consumer string, replicas int) (*Store, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      BucketName(stream, consumer),
		Description: Description,
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("order marks bucket %s: %w", BucketName(stream, consumer), err)
	}
	return &Store{kv: kv}, nil
}

// id is the bucket key of an ordering key: a digest, as ordering keys may
// hold any characters.
func id(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:20])
}

// Mark is a key's first unsettled message: its stream sequence, and when
// it is due back from a retry (zero: it is not being retried, and comes
// back within an ack wait of the death of a courier that held it).
type Mark struct {
	Seq uint64
	Due time.Time
}

// Mark records key's first unsettled message.
func (s *Store) Mark(ctx context.Context, key string, m Mark) error {
	v := strconv.FormatUint(m.Seq, 10)
	if !m.Due.IsZero() {
		v += " " + strconv.FormatInt(m.Due.UnixMilli(), 10)
	}
	_, err := s.kv.PutString(ctx, id(key), v+"\n"+key)
	return err
}

// Unmark removes key's mark.
func (s *Store) Unmark(ctx context.Context, key string) error {
	err := s.kv.Purge(ctx, id(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	return err
}

// Marks returns every mark, by ordering key.
func (s *Store) Marks(ctx context.Context) (map[string]Mark, error) {
	out := map[string]Mark{}
	lister, err := s.kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	for k := range lister.Keys() {
		ids = append(ids, k)
	}
	for _, k := range ids {
		e, err := s.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		m, key, ok := parse(string(e.Value()))
		if !ok {
			continue // not a mark of ours
		}
		out[key] = m
	}
	return out, nil
}

// parse reads a mark as Mark writes it: "<seq>[ <due, Unix ms>]\n<key>".
func parse(v string) (m Mark, key string, ok bool) {
	head, key, ok := strings.Cut(v, "\n")
	seqText, dueText, retried := strings.Cut(head, " ")
	seq, err := strconv.ParseUint(seqText, 10, 64)
	if !ok || err != nil || seq == 0 {
		return Mark{}, "", false
	}
	m.Seq = seq
	if retried {
		ms, err := strconv.ParseInt(dueText, 10, 64)
		if err != nil {
			return Mark{}, "", false
		}
		m.Due = time.UnixMilli(ms)
	}
	return m, key, true
}
