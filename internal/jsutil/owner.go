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
// is made, and a courier of another durable is refused it.

// Metadata keys of the owner of what courier makes for one durable.
const (
	MetaOwnerStream   = "courier_stream"
	MetaOwnerConsumer = "courier_consumer"
)

// Owner is the durable consumer a bucket is made for.
type Owner struct {
	Stream, Consumer string
}

// metadata is md with o recorded in it.
func (o Owner) metadata(md map[string]string) map[string]string {
	out := make(map[string]string, len(md)+2)
	for k, v := range md {
		out[k] = v
	}
	out[MetaOwnerStream], out[MetaOwnerConsumer] = o.Stream, o.Consumer
	return out
}

// OwnerError is a bucket that belongs to another durable than the one that
// asked for it.
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
	stream, hasStream := md[MetaOwnerStream]
	consumer, hasConsumer := md[MetaOwnerConsumer]
	if !hasStream && !hasConsumer {
		return nil
	}
	if stream == o.Stream && consumer == o.Consumer {
		return nil
	}
	return &OwnerError{What: what, Name: name, Owner: Owner{Stream: stream, Consumer: consumer}, Wanted: o}
}

// OwnedKeyValue creates the bucket cfg describes for owner, recording owner
// in its metadata, or updates it to cfg when it is owner's. A bucket that
// records no owner (made before owners were recorded) is taken as owner's.
// A bucket of another owner is left as it is and refused with an
// *OwnerError.
func OwnedKeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, owner Owner) (jetstream.KeyValue, error) {
	cfg.Metadata = owner.metadata(cfg.Metadata)
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
