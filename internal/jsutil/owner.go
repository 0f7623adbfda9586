package jsutil

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// A bucket courier makes for one durable consumer is named after the
// durable's stream and consumer, and names lose what sets them apart
// (A_B and C, A and B_C both give A_B_C): two durables would share one
// bucket silently. So the bucket records its owner in its metadata when it
// is made, and a courier of another durable is refused it. A stream made
// for one durable (the partitions' work stream) records its owner too, and
// another durable's goes under a name of its own (OwnedStreamName).

// Metadata keys of the owner of what courier makes for one durable.
const (
	MetaOwnerStream   = "courier_stream"
	MetaOwnerConsumer = "courier_consumer"
)

// Owner is the durable consumer a bucket is made for.
type Owner struct {
	Stream, Consumer string
}

// Metadata is md with o recorded in it, for the configuration of what
// courier makes for o (OwnerOf reads it back).
func (o Owner) Metadata(md map[string]string) map[string]string {
	out := make(map[string]string, len(md)+2)
	for k, v := range md {
		out[k] = v
	}
	out[MetaOwnerStream], out[MetaOwnerConsumer] = o.Stream, o.Consumer
	return out
}

// OwnerOf is the owner md records; ok is false when it records none.
func OwnerOf(md map[string]string) (o Owner, ok bool) {
	stream, hasStream := md[MetaOwnerStream]
	consumer, hasConsumer := md[MetaOwnerConsumer]
	return Owner{Stream: stream, Consumer: consumer}, hasStream || hasConsumer
}

// OwnerError is a bucket or stream that belongs to another durable than the
// one that asked for it.
type OwnerError struct {
	// What is what it is ("key-value bucket"), Name its name.
	What, Name string
	// Owner is the durable its metadata names; Wanted the one that asked.
	Owner, Wanted Owner
}

func (e *OwnerError) Error() string {
	return fmt.Sprintf("%s %q belongs to consumer %q on stream %q (its metadata says so), not to consumer %q on stream %q: "+
		"the two durables' names make the same name, and sharing it would mix what each keeps there; "+
		"rename one of the consumers (COURIER_CONSUMER), or, if that durable is gone for good, remove it (`courier cleanup` with that durable's COURIER_STREAM and COURIER_CONSUMER)",
		e.What, e.Name, e.Owner.Consumer, e.Owner.Stream, e.Wanted.Consumer, e.Wanted.Stream)
}

// CheckOwner returns an *OwnerError when md records an owner other than
// o, and nil when it records o or none (made before owners were recorded).
func CheckOwner(what, name string, md map[string]string, o Owner) error {
	had, ok := OwnerOf(md)
	if !ok || had == o {
		return nil
	}
	return &OwnerError{What: what, Name: name, Owner: had, Wanted: o}
}

// OwnedKeyValue creates the bucket cfg describes for owner, recording owner
// in its metadata, or updates it to cfg when it is owner's. A bucket that
// records no owner (made before owners were recorded) is taken as owner's.
// A bucket of another owner is left as it is and refused with an
// *OwnerError.
func OwnedKeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, owner Owner) (jetstream.KeyValue, error) {
	cfg.Metadata = owner.Metadata(cfg.Metadata)
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if !errors.Is(err, jetstream.ErrBucketExists) {
			return kv, err
		}
		// Made meanwhile, by another courier: whose?
		kv, err = js.KeyValue(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, err
	}
	if err := CheckOwner("key-value bucket", cfg.Bucket, st.Metadata(), owner); err != nil {
		return nil, err
	}
	return js.CreateOrUpdateKeyValue(ctx, cfg)
}

// OwnedStreamName returns the name of the stream of owner whose name, made
// from owner's stream and consumer, is name; a stream of that name may
// already be another durable's (consumers x and X: stream names are
// upper-cased). It is the first of name and DistinctName(name, owner's
// names) whose stream owner has (whose says: ok false for a stream that does
// not say, which is then taken as owner's, for the caller to check), else
// the first that no stream has, so that a stream made under either name is
// found again, and one made before there were two durables keeps its name.
// When both are other durables', the error is an *OwnerError naming the
// first.
func OwnedStreamName(ctx context.Context, js jetstream.JetStream, name string, owner Owner, whose func(jetstream.StreamConfig) (Owner, bool)) (string, error) {
	free := ""
	var taken *OwnerError
	for _, candidate := range []string{name, DistinctName(name, owner.Stream+"\x00"+owner.Consumer)} {
		s, err := js.Stream(ctx, candidate)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if free == "" {
				free = candidate
			}
			continue
		}
		if err != nil {
			return "", fmt.Errorf("looking up stream %q: %w", candidate, err)
		}
		had, ok := whose(s.CachedInfo().Config)
		if !ok || had == owner {
			return candidate, nil
		}
		if taken == nil {
			taken = &OwnerError{What: "stream", Name: candidate, Owner: had, Wanted: owner}
		}
	}
	if free != "" {
		return free, nil
	}
	return "", taken
}
