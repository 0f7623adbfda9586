// Package partition splits a durable with order per key across its
// replicas (COURIER_ORDER_PARTITIONS; README, "Order per key"): a work-queue
// stream beside the consumed stream, which sources it with a subject
// transform that puts the partition of each message's key in front of its
// subject (the server computes it, from a subject token only); one durable
// consumer per partition on it, each pinned to one courier at a time (a
// priority group with the pinned policy); and the membership that shares
// the partitions out among the live replicas by rendezvous hashing
// (members.go). durable.go sets a partitioned durable up on the server
// and finds it again for the commands beside the sidecar. The pin, which
// the server enforces, is what lets one courier at a time deliver a
// partition; membership only balances them. The consumed stream is read,
// never changed.
package partition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/internal/subject"
)

// StreamName is the plain name of the work stream of consumer on stream:
// "COURIER_PART_<stream>_<consumer>", made safe by jsutil.SafeStreamName.
// It loses case and where one name ends (consumers x and X; stream A_B with
// consumer C, stream A with B_C): WorkStreamName is the name the durable's
// work stream has.
func StreamName(stream, consumer string) string {
	return jsutil.SafeStreamName("COURIER_PART_", stream+"_"+consumer, stream+"\x00"+consumer)
}

// WorkStreamName is the name of the work stream of consumer on stream, for
// EnsureStream to create or to find: StreamName, unless the work stream of
// that name is another durable's, then that name and a hash of both names
// (jsutil.OwnedStreamName). The first of two colliding durables to start
// keeps the plain name, as do work streams made before names could differ.
func WorkStreamName(ctx context.Context, js jetstream.JetStream, stream, consumer string) (string, error) {
	return jsutil.OwnedStreamName(ctx, js, StreamName(stream, consumer), jsutil.Owner{Stream: stream, Consumer: consumer}, workOwner)
}

// workOwner is the durable a work stream is for: the owner its metadata
// records, or, in one made before owners were recorded, the consumer its
// description names (StreamConfig's) and the stream it sources. ok is
// false for a stream that says neither.
func workOwner(cfg jetstream.StreamConfig) (o jsutil.Owner, ok bool) {
	if o, ok := jsutil.OwnerOf(cfg.Metadata); ok {
		return o, true
	}
	rest, ok := strings.CutPrefix(cfg.Description, "courier: consumer ")
	consumer, _, named := strings.Cut(rest, " of stream ")
	if !ok || !named || len(cfg.Sources) != 1 {
		return jsutil.Owner{}, false
	}
	return jsutil.Owner{Stream: cfg.Sources[0].Name, Consumer: consumer}, true
}

// ConsumerName is the durable consumer of partition i on the work stream:
// "<consumer>-p<i>".
func ConsumerName(consumer string, i int) string { return consumer + "-p" + strconv.Itoa(i) }

// FilterSubject is the subjects of partition i on the work stream.
func FilterSubject(i int) string { return strconv.Itoa(i) + ".>" }

// StreamOptions describe the work stream of a durable.
type StreamOptions struct {
	// Source is the consumed stream's configuration.
	Source jetstream.StreamConfig
	// Consumer is the durable's name (COURIER_CONSUMER).
	Consumer string
	// Filters are the durable's filter subjects (COURIER_SUBJECTS); none:
	// the stream's subjects.
	Filters []string
	// Token is the key's subject token (COURIER_ORDER_KEY=subject:N), and
	// Partitions how many partitions (COURIER_ORDER_PARTITIONS).
	Token, Partitions int
	// StartAt, when set, makes a new work stream start with the messages
	// stored from then on (COURIER_DELIVER_POLICY=new); zero: from the
	// first. StartAfter, when set, makes it start after that sequence of
	// the stream instead (the ack floor of a durable it replaces).
	StartAt    time.Time
	StartAfter uint64
}

// Metadata keys of the work stream, by which a courier tells that it
// partitions as the others do.
const (
	metaPartitions = "courier.partitions"
	metaKeyToken   = "courier.key_token"
)

// StreamConfig is the work stream: work-queue retention (an acked message
// is removed), the consumed stream's storage, replicas, duplicate window
// and per-message TTLs, and one source, the consumed stream, whose
// transforms prepend the partition. It refuses a consumed stream whose
// retention is not limits (sourcing takes nothing from a work-queue or
// interest stream, which would then keep every message, or lose them) and
// filters whose key token the server cannot partition by.
func StreamConfig(o StreamOptions) (jetstream.StreamConfig, error) {
	src := o.Source
	if src.Retention != jetstream.LimitsPolicy {
		return jetstream.StreamConfig{}, fmt.Errorf("stream %q has %s retention: COURIER_ORDER_PARTITIONS copies its messages into a work stream, and the stream would keep what courier acked (work-queue) or never hold it (interest); use it with a limits stream, or leave COURIER_ORDER_PARTITIONS at 0", src.Name, src.Retention)
	}
	filters := o.Filters
	if len(filters) == 0 {
		filters = src.Subjects
	}
	if len(filters) == 0 {
		filters = []string{">"}
	}
	trs, err := subject.PartitionTransforms(filters, o.Token, o.Partitions)
	if err != nil {
		return jetstream.StreamConfig{}, fmt.Errorf("stream %q cannot be partitioned by COURIER_ORDER_KEY=subject:%d: %w", src.Name, o.Token, err)
	}
	source := &jetstream.StreamSource{Name: src.Name}
	for _, t := range trs {
		source.SubjectTransforms = append(source.SubjectTransforms, jetstream.SubjectTransformConfig{Source: t.Source, Destination: t.Destination})
	}
	switch {
	case o.StartAfter > 0:
		source.OptStartSeq = o.StartAfter + 1
	case !o.StartAt.IsZero():
		at := o.StartAt.UTC()
		source.OptStartTime = &at
	}
	return jetstream.StreamConfig{
		Name: StreamName(src.Name, o.Consumer),
		Description: fmt.Sprintf("courier: consumer %s of stream %s in %d partitions by subject token %d %s; each message until it is settled",
			o.Consumer, src.Name, o.Partitions, o.Token, streamDescriptionMark),
		Retention: jetstream.WorkQueuePolicy,
		Storage:   src.Storage,
		Replicas:  max(src.Replicas, 1),
		// No duplicate window: the stream dedups what is published to it,
		// and a source copies each of its messages once (it resumes after
		// the last it copied), but a rewind copies them again, under the
		// same Nats-Msg-Id (resource.go). Zero is none for a stream with
		// a source (the server's default window is for those without).
		Duplicates:  0,
		AllowMsgTTL: src.AllowMsgTTL,
		AllowDirect: true,
		Discard:     jetstream.DiscardOld,
		MaxMsgs:     -1, MaxBytes: -1, MaxAge: 0, MaxMsgsPerSubject: -1,
		Sources: []*jetstream.StreamSource{source},
		Metadata: jsutil.Owner{Stream: src.Name, Consumer: o.Consumer}.Metadata(map[string]string{
			metaPartitions: strconv.Itoa(o.Partitions),
			metaKeyToken:   strconv.Itoa(o.Token),
		}),
	}, nil
}

// EnsureStream creates the work stream cfg (StreamConfig) if it is
// missing, and returns it, with created true if it made it; its name is
// WorkStreamName's, which is cfg's unless another durable has that one. An
// existing one must partition as cfg does (the same count, key and
// transforms): keys would otherwise change partitions while messages are in
// flight, so the error says how to change them.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, bool, error) {
	plain := cfg.Name
	var s jetstream.Stream
	var err error
	for try := 0; ; try++ {
		if owner, ok := jsutil.OwnerOf(cfg.Metadata); ok {
			if cfg.Name, err = jsutil.OwnedStreamName(ctx, js, plain, owner, workOwner); err != nil {
				return nil, false, fmt.Errorf("the partitions' work stream: %w", err)
			}
		}
		s, err = js.Stream(ctx, cfg.Name)
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			break
		}
		s, err = js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && try == 0 {
			continue // made meanwhile, by another courier: whose?
		}
		if err != nil {
			return nil, false, fmt.Errorf("cannot create the partitions' work stream %s: %w", cfg.Name, err)
		}
		return s, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	have := s.CachedInfo().Config
	if !samePartitioning(have, cfg) {
		return nil, false, fmt.Errorf("the partitions' work stream %s was made for %s partitions by subject token %s (sourcing %s); COURIER_ORDER_PARTITIONS, COURIER_ORDER_KEY or COURIER_SUBJECTS now say otherwise, which would move keys between partitions while messages are in flight: to change them, stop every courier of the durable, let the work stream empty or accept that its messages are delivered again, and delete it (`nats stream rm %s`)",
			cfg.Name, have.Metadata[metaPartitions], have.Metadata[metaKeyToken], describeSources(have), cfg.Name)
	}
	return s, false, nil
}

// samePartitioning reports whether have partitions as want does, whatever
// generation of its source a rewind left it at (resource.go).
func samePartitioning(have, want jetstream.StreamConfig) bool {
	if have.Metadata[metaPartitions] != want.Metadata[metaPartitions] || have.Metadata[metaKeyToken] != want.Metadata[metaKeyToken] ||
		len(have.Sources) != 1 || have.Sources[0].Name != want.Sources[0].Name {
		return false
	}
	return slices.Equal(atGeneration(have.Sources[0].SubjectTransforms, 0), atGeneration(want.Sources[0].SubjectTransforms, 0))
}

func describeSources(cfg jetstream.StreamConfig) string {
	var parts []string
	for _, s := range cfg.Sources {
		var trs []string
		for _, t := range s.SubjectTransforms {
			trs = append(trs, t.Source+" → "+t.Destination)
		}
		parts = append(parts, s.Name+" ["+strings.Join(trs, ", ")+"]")
	}
	return strings.Join(parts, "; ")
}

// Partitioning reads, from a work stream's configuration (StreamConfig),
// how many partitions it was made for and the subject token of the key
// (COURIER_ORDER_PARTITIONS and COURIER_ORDER_KEY=subject:N); ok is false
// for a stream that does not say.
func Partitioning(cfg jetstream.StreamConfig) (partitions, keyToken int, ok bool) {
	p, err1 := strconv.Atoi(cfg.Metadata[metaPartitions])
	k, err2 := strconv.Atoi(cfg.Metadata[metaKeyToken])
	return p, k, err1 == nil && err2 == nil
}
