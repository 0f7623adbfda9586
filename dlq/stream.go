package dlq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/internal/subject"
)

// Errors of EnsureStream, for errors.Is. Both mean retrying will not help
// until someone changes the server's setup.
var (
	// ErrUnsuitableStream: the stream capturing the dead-letter subject
	// would not keep dead letters (interest retention, memory storage, no
	// acks, sealed).
	ErrUnsuitableStream = errors.New("dlq: stream would not keep dead letters")
	// ErrCannotCreateStream: no stream captures the dead-letter subject and
	// courier cannot create one (no permission, JetStream not enabled, the
	// name taken).
	ErrCannotCreateStream = errors.New("dlq: cannot create the dead-letter stream")
)

const (
	// DuplicateWindow is the duplicate window of the stream EnsureStream
	// creates. A dead letter is published again when courier stopped after
	// storing it but before terminating the original: the original comes back
	// after its ack wait (30s by default, minutes at most in sane setups) and
	// is dead-lettered again, and a letter from the max-deliveries advisory
	// may race the one from the last attempt. Ten minutes covers these with a
	// wide margin, while the server, which keeps every id of the window in
	// memory, is not made to hold hours of them.
	DuplicateWindow = 10 * time.Minute
	// MinDuplicateWindow is the shortest duplicate window CheckStream accepts
	// without a warning.
	MinDuplicateWindow = time.Minute

	streamPrefix = "COURIER_DLQ_"
)

// StreamName returns the name of the stream EnsureStream creates for subject:
// "COURIER_DLQ_" followed by the subject, made safe by jsutil.SafeStreamName (a name
// cut to 64 characters ends in a hash of the subject).
func StreamName(subject string) string {
	// The default subject starts with "dlq.", which the prefix says
	// already: COURIER_DLQ_ORDERS_COURIER, not COURIER_DLQ_DLQ_ORDERS_COURIER.
	// An existing stream is found by the subject it captures, whatever its
	// name, so streams named the earlier way keep being used.
	return jsutil.SafeStreamName(streamPrefix, strings.TrimPrefix(subject, "dlq."), subject)
}

// StreamConfig returns the configuration of the stream EnsureStream creates
// for subject: named StreamName(subject), capturing only subject, file
// storage, limits retention with no limit, discard old, the
// DuplicateWindow, direct gets allowed, and replicas replicas (1 when
// replicas < 1).
func StreamConfig(subject string, replicas int) jetstream.StreamConfig {
	if replicas < 1 {
		replicas = 1
	}
	return jetstream.StreamConfig{
		Name:              StreamName(subject),
		Description:       "courier dead letters",
		Subjects:          []string{subject},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          replicas,
		Discard:           jetstream.DiscardOld,
		MaxAge:            0,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgsPerSubject: -1,
		MaxMsgSize:        -1,
		MaxConsumers:      -1,
		Duplicates:        DuplicateWindow,
		AllowDirect:       true,
	}
}

// CheckStream says whether a stream with cfg can be trusted with dead letters.
// The error, wrapping ErrUnsuitableStream, lists what makes it lose or refuse
// every dead letter: interest retention, memory storage, NoAck, Sealed. The
// warnings name settings that can drop some dead letters silently (MaxAge;
// MaxMsgs, MaxBytes with discard old; MaxMsgsPerSubject), refuse some, keep
// a duplicate window shorter than MinDuplicateWindow, or stop replay from
// removing dead letters, each with what to change.
func CheckStream(cfg jetstream.StreamConfig) (warnings []string, err error) {
	name := cfg.Name
	// Courier publishes dead letters and waits for the stream's ack, and
	// they stay until replayed or removed, whoever consumes them.
	if why := jsutil.Unsuitable(cfg, jsutil.Keeping{What: "dead letters", Acked: true, WithoutInterest: true}); why != nil {
		err = fmt.Errorf("%w: %w", ErrUnsuitableStream, why)
	}

	warn := func(format string, args ...any) {
		warnings = append(warnings, fmt.Sprintf("stream %q ", name)+fmt.Sprintf(format, args...))
	}
	if cfg.Retention == jetstream.WorkQueuePolicy {
		warn("uses work-queue retention: a consumer acking a dead letter removes it (use limits retention to keep them until replayed)")
	}
	if cfg.MaxAge > 0 {
		warn("has max_age %s: older dead letters are deleted silently (set max_age to 0)", cfg.MaxAge)
	}
	discardOld := cfg.Discard == jetstream.DiscardOld
	if cfg.MaxMsgs > 0 && discardOld {
		warn("has max_msgs %d with discard old: beyond it the oldest dead letters are deleted silently (set max_msgs to -1)", cfg.MaxMsgs)
	}
	if cfg.MaxBytes > 0 && discardOld {
		warn("has max_bytes %d with discard old: beyond it the oldest dead letters are deleted silently (set max_bytes to -1)", cfg.MaxBytes)
	}
	perSubjectNew := cfg.Discard == jetstream.DiscardNew && cfg.DiscardNewPerSubject
	if cfg.MaxMsgsPerSubject > 0 && !perSubjectNew {
		warn("has max_msgs_per_subject %d and all dead letters of a consumer share one subject: beyond it the oldest are deleted silently (set max_msgs_per_subject to -1)", cfg.MaxMsgsPerSubject)
	}
	if cfg.Discard == jetstream.DiscardNew && (cfg.MaxMsgs > 0 || cfg.MaxBytes > 0 || (cfg.MaxMsgsPerSubject > 0 && perSubjectNew)) {
		warn("has limits with discard new: once full it refuses dead letters, and their originals are redelivered until space is freed (remove the limits)")
	}
	if cfg.MaxMsgSize > 0 {
		warn("has max_msg_size %d: a larger dead letter (body and headers) is refused and its original redelivered (set max_msg_size to -1)", cfg.MaxMsgSize)
	}
	if cfg.Duplicates < MinDuplicateWindow {
		warn("has a duplicate window of %s: a dead letter published again after it is stored twice (set duplicate_window to %s)", cfg.Duplicates, DuplicateWindow)
	}
	if cfg.DenyDelete {
		warn("has deny_delete set: replay cannot remove a dead letter once republished")
	}
	if cfg.DenyPurge {
		warn("has deny_purge set: dead letters cannot be purged")
	}
	return warnings, err
}

// EnsureStream makes sure a stream captures the dead-letter subject and will
// keep what it receives. If one does (js.StreamNameBySubject), it is checked
// with CheckStream and returned, with created false; call CheckStream on its
// Config for the warnings. If none does, one configured by
// StreamConfig(subject, replicas) is created and returned with created true.
//
// Errors wrap ErrUnsuitableStream when the capturing stream would not keep
// dead letters, and ErrCannotCreateStream and a *jsutil.SetupError when none exists
// and none can be created (no permission, JetStream not enabled, the name
// taken), its text giving the stream configuration to create; neither goes
// away by retrying. Other errors (a
// time-out, a lost connection) may. subject must be a literal subject: dead
// letters are published to it.
func EnsureStream(ctx context.Context, js jetstream.JetStream, subject string, replicas int) (*jetstream.StreamInfo, bool, error) {
	if err := checkSubject(subject); err != nil {
		return nil, false, err
	}
	info, created, err := jsutil.EnsureCapture(ctx, js, StreamConfig(subject, replicas), CheckStream)
	var serr *jsutil.SetupError
	if errors.As(err, &serr) {
		return nil, false, fmt.Errorf("%w: %w", ErrCannotCreateStream, err)
	}
	return info, created, err
}

// checkSubject rejects subjects dead letters cannot be published to.
func checkSubject(s string) error {
	if err := subject.CheckLiteral(s); err != nil {
		return fmt.Errorf("dlq: dead-letter subject %w", err)
	}
	return nil
}
