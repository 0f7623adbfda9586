package giveup

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
)

// Errors of EnsureStream and Catcher.Setup, for errors.Is. Both mean
// retrying will not help until someone changes the server's setup.
var (
	// ErrUnsuitableStream: the stream capturing the advisory subject would
	// not keep advisories (memory storage, sealed).
	ErrUnsuitableStream = errors.New("giveup: stream would not keep max-deliveries advisories")
	// ErrCannotCreate: the advisory stream or its consumer does not exist
	// and courier cannot create it (no permission, JetStream not enabled,
	// the name taken). The error's text says what to create.
	ErrCannotCreate = errors.New("giveup: cannot set up the capture of max-deliveries advisories")
)

const (
	// AdvisorySubjectPrefix starts the subject of JetStream's max-deliveries
	// advisory; the stream and consumer names follow.
	AdvisorySubjectPrefix = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"
	// AdvisoryType is the "type" of a max-deliveries advisory.
	AdvisoryType = "io.nats.jetstream.advisory.v1.max_deliver"

	// DefaultMaxAge is the MaxAge of the stream EnsureStream creates:
	// courier may be down for up to this long and still handle the
	// advisories fired meanwhile, and the stream cannot grow forever.
	DefaultMaxAge = 7 * 24 * time.Hour
	// MinMaxAge is the shortest MaxAge CheckStream accepts without a
	// warning.
	MinMaxAge = 24 * time.Hour
	// DuplicateWindow is the duplicate window of the stream EnsureStream
	// creates. Advisories carry no Nats-Msg-Id, so it matters little; it
	// is the server's default, stated so the config is complete.
	DuplicateWindow = 2 * time.Minute

	streamPrefix   = "COURIER_ADVISORIES_"
	consumerPrefix = "courier-giveup-"
)

// AdvisorySubject returns the subject on which JetStream announces that
// consumer of stream gave up on a message (it reached MaxDeliver).
func AdvisorySubject(stream, consumer string) string {
	return AdvisorySubjectPrefix + "." + stream + "." + consumer
}

// StreamName returns the name of the stream EnsureStream creates for the
// advisories of consumer on stream: "COURIER_ADVISORIES_" followed by the
// stream name, "_" and the consumer name, made safe by jsutil.SafeStreamName (a
// name cut to 64 characters ends in a hash of both names).
func StreamName(stream, consumer string) string {
	return jsutil.SafeStreamName(streamPrefix, stream+"_"+consumer, stream+"\x00"+consumer)
}

// AllConsumers, given to New as the consumer, catches the advisories of
// every consumer of the stream (the partitions' work stream, whose
// consumers are all courier's).
const AllConsumers = "*"

// ConsumerName returns the name of the durable consumer through which the
// replicas of courier share the advisories of consumer, in the stream
// EnsureStream creates for them (StreamName), which holds no other
// consumer's advisories.
func ConsumerName(consumer string) string {
	if consumer == AllConsumers {
		consumer = "all" // a consumer's name holds no wildcard
	}
	return consumerPrefix + consumer
}

// SharedConsumerName returns the name of that durable consumer in a stream
// courier did not create, which may capture the advisories of every stream
// (an audit stream of $JS.EVENT.ADVISORY.>): there, two couriers with the
// same consumer name on two streams (the default name, "courier") would
// share one durable, each rewriting its filter. The name holds both names
// and a hash of them, so that it stays distinct.
func SharedConsumerName(stream, consumer string) string {
	h := fnv.New32a()
	h.Write([]byte(stream + "\x00" + consumer))
	name := fmt.Sprintf("%s%s-%s-%08x", consumerPrefix, consumer, stream, h.Sum32())
	if len(name) > maxConsumerNameLen {
		name = fmt.Sprintf("%s%08x", consumerPrefix, h.Sum32())
	}
	return name
}

// maxConsumerNameLen bounds SharedConsumerName's names, well within the
// server's limit.
const maxConsumerNameLen = 200

// StreamConfig returns the configuration of the stream EnsureStream creates
// for the advisories of consumer on stream: named StreamName, capturing only
// AdvisorySubject, file storage, limits retention with maxAge (DefaultMaxAge
// when maxAge <= 0) and no other limit, discard old, the DuplicateWindow, and
// replicas replicas (1 when replicas < 1).
func StreamConfig(stream, consumer string, replicas int, maxAge time.Duration) jetstream.StreamConfig {
	if replicas < 1 {
		replicas = 1
	}
	if maxAge <= 0 {
		maxAge = DefaultMaxAge
	}
	return jetstream.StreamConfig{
		Name:        StreamName(stream, consumer),
		Description: "courier: max-deliveries advisories of consumer " + consumer + " on stream " + stream,
		Subjects:    []string{AdvisorySubject(stream, consumer)},
		// Work-queue retention: an advisory is removed once courier has
		// acked it, so a durable created again later cannot replay old
		// advisories (and store their dead letters a second time once the
		// DLQ's duplicate window has passed). MaxAge still bounds what an
		// absent courier leaves behind.
		Retention:         jetstream.WorkQueuePolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          replicas,
		Discard:           jetstream.DiscardOld,
		MaxAge:            maxAge,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgsPerSubject: -1,
		MaxMsgSize:        -1,
		MaxConsumers:      -1,
		Duplicates:        min(DuplicateWindow, maxAge),
	}
}

// CheckStream says whether a stream with cfg can be trusted to keep
// advisories until courier handles them. The error, wrapping
// ErrUnsuitableStream, names what loses every advisory: memory storage (lost
// when the server restarts) or a sealed stream. The warnings name settings
// that can drop advisories before courier handles them: a MaxAge shorter than
// MinMaxAge, MaxMsgs, MaxBytes or MaxMsgsPerSubject limits. Interest and
// work-queue retention are accepted: courier's durable consumer keeps
// advisories in such a stream until it acks them.
func CheckStream(cfg jetstream.StreamConfig) (warnings []string, err error) {
	name := cfg.Name
	// The server publishes advisories, waiting for no ack, and courier's
	// durable consumer keeps them until it acks them, whatever the
	// retention.
	if why := jsutil.Unsuitable(cfg, jsutil.Keeping{What: "advisories"}); why != nil {
		err = fmt.Errorf("%w: %w", ErrUnsuitableStream, why)
	}
	warn := func(format string, args ...any) {
		warnings = append(warnings, fmt.Sprintf("stream %q ", name)+fmt.Sprintf(format, args...))
	}
	if cfg.MaxAge > 0 && cfg.MaxAge < MinMaxAge {
		warn("has max_age %s: a max-deliveries advisory fired while courier is down longer than that is lost, and its message never dead-lettered (set max_age to %s or more)", cfg.MaxAge, DefaultMaxAge)
	}
	if cfg.MaxMsgs > 0 {
		warn("has max_msgs %d: beyond it advisories are dropped before courier handles them (set max_msgs to -1 and bound it by max_age)", cfg.MaxMsgs)
	}
	if cfg.MaxBytes > 0 {
		warn("has max_bytes %d: beyond it advisories are dropped before courier handles them (set max_bytes to -1 and bound it by max_age)", cfg.MaxBytes)
	}
	if cfg.MaxMsgsPerSubject > 0 {
		warn("has max_msgs_per_subject %d, and all advisories of a consumer share one subject: beyond it they are dropped before courier handles them (set max_msgs_per_subject to -1)", cfg.MaxMsgsPerSubject)
	}
	return warnings, err
}

// EnsureStream makes sure a stream captures the max-deliveries advisories of
// consumer on stream and keeps them. If one does (js.StreamNameBySubject), it
// is checked with CheckStream and returned with created false; call
// CheckStream on its Config for the warnings. If none does, one configured by
// StreamConfig(stream, consumer, replicas, maxAge) is created and returned
// with created true.
//
// Errors wrap ErrUnsuitableStream when the capturing stream would not keep
// advisories, and ErrCannotCreate and a *jsutil.SetupError when none exists and
// none can be created (no permission, JetStream not enabled, the name taken),
// its text giving the stream to create; neither goes away by retrying.
// Other errors (a time-out, a lost connection) may.
func EnsureStream(ctx context.Context, js jetstream.JetStream, stream, consumer string, replicas int, maxAge time.Duration) (*jetstream.StreamInfo, bool, error) {
	info, created, err := jsutil.EnsureCapture(ctx, js, StreamConfig(stream, consumer, replicas, maxAge), CheckStream)
	var serr *jsutil.SetupError
	if errors.As(err, &serr) {
		return nil, false, fmt.Errorf("%w: %w", ErrCannotCreate, err)
	}
	return info, created, err
}

// consumerConfig is the durable consumer on the advisory stream, shared by
// every replica of courier: explicit acks, no delivery limit (an advisory
// whose dead letter cannot be stored comes back until it can), no inactivity
// threshold (the server would delete it while courier is down).
func consumerConfig(durable, stream, consumer string, ackWait time.Duration) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       durable,
		Description:   "courier: dead-letters what consumer " + consumer + " of stream " + stream + " gave up on",
		FilterSubject: AdvisorySubject(stream, consumer),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		MaxAckPending: 64,
	}
}

// ensureConsumer creates or updates the durable consumer on the advisory
// stream named streamName. Errors wrap ErrCannotCreate and a *jsutil.SetupError
// when retrying will not help.
func ensureConsumer(ctx context.Context, js jetstream.JetStream, streamName string, cc jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, streamName, cc)
	if err == nil {
		return cons, nil
	}
	doing := fmt.Sprintf("create or update consumer %q on stream %q", cc.Durable, streamName)
	if serr := jsutil.ExplainSetup(js, err, "CONSUMER.CREATE."+streamName+"."+cc.Durable, doing, howToCreateConsumer(streamName, cc)); serr != nil {
		return nil, fmt.Errorf("%w: %w", ErrCannotCreate, serr)
	}
	return nil, fmt.Errorf("giveup: %s: %w", doing, err)
}

// howToCreateConsumer renders cc as a nats CLI command, for an operator to
// create the consumer by hand.
func howToCreateConsumer(streamName string, cc jetstream.ConsumerConfig) string {
	return fmt.Sprintf("nats consumer add %s %s --pull --filter='%s' --ack=explicit --deliver=all --max-deliver=-1 --wait=%s --max-pending=%d --defaults",
		streamName, cc.Durable, cc.FilterSubject, cc.AckWait, cc.MaxAckPending)
}
