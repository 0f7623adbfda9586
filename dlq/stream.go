package dlq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

	streamPrefix     = "COURIER_DLQ_"
	maxStreamNameLen = 64
	// errCodeSubjectOverlap is the server's JSStreamSubjectOverlapErr, which
	// nats.go does not name.
	errCodeSubjectOverlap jetstream.ErrorCode = 10065
)

// StreamName returns the name of the stream EnsureStream creates for subject:
// "COURIER_DLQ_" and the subject uppercased, every character other than a
// letter, digit, '-' or '_' replaced by '_'. Names longer than 64 characters
// are cut and end in a hash of the whole subject, so they stay distinct.
func StreamName(subject string) string {
	var b strings.Builder
	b.WriteString(streamPrefix)
	for _, r := range subject {
		switch {
		case r >= 'a' && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	name := b.String()
	if len(name) <= maxStreamNameLen {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(subject))
	return fmt.Sprintf("%s_%08X", name[:maxStreamNameLen-9], h.Sum32())
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
	var refusals []string
	if cfg.Retention == jetstream.InterestPolicy {
		refusals = append(refusals, "uses interest retention, which stores nothing while no consumer is interested and removes what all consumers acked (use a stream with limits retention)")
	}
	if cfg.Storage == jetstream.MemoryStorage {
		refusals = append(refusals, "uses memory storage, which loses dead letters when the server restarts (use a stream with file storage; storage cannot be changed on an existing stream)")
	}
	if cfg.NoAck {
		refusals = append(refusals, "has no_ack set, so no publish to it is ever acknowledged (set no_ack to false)")
	}
	if cfg.Sealed {
		refusals = append(refusals, "is sealed and accepts no new messages (capture the subject in another stream)")
	}
	if len(refusals) > 0 {
		err = fmt.Errorf("%w: stream %q %s", ErrUnsuitableStream, name, strings.Join(refusals, "; it "))
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
// dead letters, and ErrCannotCreateStream when none exists and none can be
// created (no permission, JetStream not enabled), its text giving the stream
// configuration to create; neither goes away by retrying. Other errors (a
// time-out, a lost connection) may. subject must be a literal subject: dead
// letters are published to it.
func EnsureStream(ctx context.Context, js jetstream.JetStream, subject string, replicas int) (*jetstream.StreamInfo, bool, error) {
	if err := checkSubject(subject); err != nil {
		return nil, false, err
	}
	name, err := js.StreamNameBySubject(ctx, subject)
	switch {
	case err == nil:
		info, err := existing(ctx, js, name, subject)
		return info, false, err
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, false, setupError(js, err, "STREAM.NAMES", "look up the stream capturing", StreamConfig(subject, replicas))
	}

	cfg := StreamConfig(subject, replicas)
	s, err := js.CreateStream(ctx, cfg)
	if err == nil {
		return s.CachedInfo(), true, nil
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeSubjectOverlap {
		// Another instance created a stream capturing the subject since
		// the look-up: use it if it will do.
		if name, lerr := js.StreamNameBySubject(ctx, subject); lerr == nil {
			info, err := existing(ctx, js, name, subject)
			return info, false, err
		}
	}
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil, false, fmt.Errorf("%w: a stream named %q exists but does not capture %q (add the subject to it, or create a stream capturing it: %s): %w",
			ErrCannotCreateStream, cfg.Name, subject, howToCreate(cfg), err)
	}
	return nil, false, setupError(js, err, "STREAM.CREATE."+cfg.Name, "create a stream capturing", cfg)
}

// existing fetches and checks the stream named name, which captures subject.
func existing(ctx context.Context, js jetstream.JetStream, name, subject string) (*jetstream.StreamInfo, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("dlq: stream %q capturing %q: %w", name, subject, err)
	}
	info := s.CachedInfo()
	if _, err := CheckStream(info.Config); err != nil {
		return nil, fmt.Errorf("%w (it captures the dead-letter subject %q)", err, subject)
	}
	return info, nil
}

// setupError explains a failed JetStream API request of EnsureStream. Denied
// permission and JetStream being off wrap ErrCannotCreateStream and say what
// to create; anything else is returned wrapped as it is. api is the tail of
// the request's subject (after any API prefix), as the server's permissions
// violation names it.
func setupError(js jetstream.JetStream, err error, api, doing string, cfg jetstream.StreamConfig) error {
	subject := cfg.Subjects[0]
	var why error
	switch {
	case errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		why = fmt.Errorf("JetStream is not enabled for this server or account (enable it): %w", err)
	default:
		if perr := permissionDenied(js, err, api+`"`); perr != nil {
			why = fmt.Errorf("no permission (grant it, or have an administrator create the stream): %w", perr)
		}
	}
	if why == nil {
		return fmt.Errorf("dlq: %s %q: %w", doing, subject, err)
	}
	return fmt.Errorf("%w: cannot %s %q: %w; the stream needed is: %s", ErrCannotCreateStream, doing, subject, why, howToCreate(cfg))
}

// howToCreate renders cfg as a nats CLI command and as the JetStream API's
// JSON, for an operator to create the stream by hand.
func howToCreate(cfg jetstream.StreamConfig) string {
	cmd := fmt.Sprintf("nats stream add %s --subjects=%s --storage=file --retention=limits --discard=old --replicas=%d --dupe-window=%s --max-age=0 --max-msgs=-1 --max-bytes=-1 --max-msgs-per-subject=-1 --max-msg-size=-1 --allow-direct --defaults",
		cfg.Name, strings.Join(cfg.Subjects, ","), cfg.Replicas, cfg.Duplicates)
	doc, err := json.Marshal(map[string]any{
		"name":                 cfg.Name,
		"subjects":             cfg.Subjects,
		"retention":            "limits",
		"storage":              "file",
		"num_replicas":         cfg.Replicas,
		"discard":              "old",
		"max_age":              0,
		"max_msgs":             cfg.MaxMsgs,
		"max_bytes":            cfg.MaxBytes,
		"max_msgs_per_subject": cfg.MaxMsgsPerSubject,
		"max_msg_size":         cfg.MaxMsgSize,
		"duplicate_window":     cfg.Duplicates.Nanoseconds(),
		"allow_direct":         cfg.AllowDirect,
	})
	if err != nil {
		return cmd
	}
	return cmd + " (API config " + string(doc) + ")"
}

// checkSubject rejects subjects dead letters cannot be published to.
func checkSubject(subject string) error {
	bad := subject == "" || strings.ContainsAny(subject, " \t\r\n")
	for tok := range strings.SplitSeq(subject, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			bad = true
		}
	}
	if bad {
		return fmt.Errorf("dlq: dead-letter subject %q is not a valid literal subject", subject)
	}
	return nil
}
