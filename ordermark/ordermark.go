// Package ordermark keeps the marks of order per key (COURIER_ORDER_KEY)
// in a replicated JetStream key-value bucket of the durable consumer's own:
// for each key whose first message is unsettled while later ones wait, or
// which is being retried, the stream sequence of that first message. A
// courier that starts, or takes over the durable from another replica,
// reads them so that a later message of such a key, redelivered first,
// waits for it. Marks are few: one per key under contention or retry.
// What is read back is another's to write too: a mark's due time is
// believed only as far as courier writes one (Capped, cap.go).
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

	"github.com/courierhq/courier/internal/jsutil"
)

// Description is the description Open gives the bucket it creates: `courier
// cleanup` removes only a bucket that carries it.
const Description = "courier: order per key (COURIER_ORDER_KEY), the first unsettled message of busy keys"

// Store is the marks of one durable consumer, or of one partition of a
// partitioned one (Partition). Safe for concurrent use.
type Store struct {
	kv     jetstream.KeyValue
	prefix string // "p<i>." for a partition's marks; "" for a durable's
}

// BucketName is the bucket of the marks of consumer on stream: one per
// durable, its name made of theirs (characters a bucket name cannot hold
// become "_").
func BucketName(stream, consumer string) string {
	return "COURIER_ORDER_" + jsutil.NameToken(stream) + "_" + jsutil.NameToken(consumer)
}

// PartitionsBucketName is the bucket of the marks of consumer on stream
// split into partitions (COURIER_ORDER_PARTITIONS): their sequences are
// the work stream's, not the stream's, so they are kept apart from the
// durable's own.
func PartitionsBucketName(stream, consumer string) string {
	return "COURIER_PARTORDER_" + jsutil.NameToken(stream) + "_" + jsutil.NameToken(consumer)
}

// Open creates the bucket of consumer on stream if it is missing (replicas
// as given) and returns its store. Names can collide (A_B and C, A and B_C):
// the bucket records its durable in its metadata, and a bucket of another
// durable is refused with a *jsutil.OwnerError.
func Open(ctx context.Context, js jetstream.JetStream, stream, consumer string, replicas int) (*Store, error) {
	return open(ctx, js, BucketName(stream, consumer), jsutil.Owner{Stream: stream, Consumer: consumer}, replicas)
}

// OpenPartitions is Open for a durable split into partitions: the store of
// each partition is Partition of the one it returns.
func OpenPartitions(ctx context.Context, js jetstream.JetStream, stream, consumer string, replicas int) (*Store, error) {
	return open(ctx, js, PartitionsBucketName(stream, consumer), jsutil.Owner{Stream: stream, Consumer: consumer}, replicas)
}

func open(ctx context.Context, js jetstream.JetStream, bucket string, owner jsutil.Owner, replicas int) (*Store, error) {
	kv, err := jsutil.OwnedKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: Description,
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}, owner)
	if err != nil {
		return nil, fmt.Errorf("order marks bucket %s: %w", bucket, err)
	}
	return &Store{kv: kv}, nil
}

// Partition is the store of partition i's marks, in s's bucket (one that
// OpenPartitions returned).
func (s *Store) Partition(i int) *Store {
	return &Store{kv: s.kv, prefix: "p" + strconv.Itoa(i) + "."}
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
	_, err := s.kv.PutString(ctx, s.prefix+id(key), v+"\n"+key)
	return err
}

// Unmark removes key's mark.
func (s *Store) Unmark(ctx context.Context, key string) error {
	err := s.kv.Purge(ctx, s.prefix+id(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	return err
}

// Marks returns every mark, by ordering key.
func (s *Store) Marks(ctx context.Context) (map[string]Mark, error) {
	out := map[string]Mark{}
	var lister jetstream.KeyLister
	var err error
	if s.prefix == "" {
		lister, err = s.kv.ListKeys(ctx)
	} else {
		lister, err = s.kv.ListKeysFiltered(ctx, s.prefix+">")
	}
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
