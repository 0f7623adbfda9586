package giveup

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

	streamPrefix     = "COURIER_ADVISORIES_"
	consumerPrefix   = "courier-giveup-"
	maxStreamNameLen = 64
	// errCodeSubjectOverlap is the server's JSStreamSubjectOverlapErr, which
	// nats.go does not name.
	errCodeSubjectOverlap jetstream.ErrorCode = 10065
)

// AdvisorySubject returns the subject on which JetStream announces that
// consumer of stream gave up on a message (it reached MaxDeliver).
func AdvisorySubject(stream, consumer string) string {
	return AdvisorySubjectPrefix + "." + stream + "." + consumer
}

// StreamName returns the name of the stream EnsureStream creates for the
// advisories of consumer on stream: "COURIER_ADVISORIES_", the stream name,
// "_" and the consumer name, uppercased, every character other than a letter,
// digit, '-' or '_' replaced by '_'. Names longer than 64 characters are cut
// and end in a hash of both names, so they stay distinct.
func StreamName(stream, consumer string) string {
	var b strings.Builder
	b.WriteString(streamPrefix)
	for _, r := range stream + "_" + consumer {
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
	h.Write([]byte(stream + "\x00" + consumer))
	return fmt.Sprintf("%s_%08X", name[:maxStreamNameLen-9], h.Sum32())
}

// ConsumerName returns the name of the durable consumer through which the
// replicas of courier share the advisories of consumer.
func ConsumerName(consumer string) string {
	return consumerPrefix + consumer
}

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
	var refusals []string
	if cfg.Storage == jetstream.MemoryStorage {
		refusals = append(refusals, "uses memory storage, which loses advisories when the server restarts (use a stream with file storage)")
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
// advisories, and ErrCannotCreate when none exists and none can be created
// (no permission, JetStream not enabled, the name taken), its text giving the
// stream to create; neither goes away by retrying. Other errors (a time-out,
// a lost connection) may.
func EnsureStream(ctx context.Context, js jetstream.JetStream, stream, consumer string, replicas int, maxAge time.Duration) (*jetstream.StreamInfo, bool, error) {
	cfg := StreamConfig(stream, consumer, replicas, maxAge)
	subject := cfg.Subjects[0]
	name, err := js.StreamNameBySubject(ctx, subject)
	switch {
	case err == nil:
		info, err := existing(ctx, js, name, subject)
		return info, false, err
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, false, setupError(js, err, "STREAM.NAMES", "look up the stream capturing "+quote(subject), howToCreateStream(cfg))
	}

	s, err := js.CreateStream(ctx, cfg)
	if err == nil {
		return s.CachedInfo(), true, nil
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeSubjectOverlap {
		// Another replica created a stream capturing the subject since
		// the look-up: use it if it will do.
		if name, lerr := js.StreamNameBySubject(ctx, subject); lerr == nil {
			info, err := existing(ctx, js, name, subject)
			return info, false, err
		}
	}
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil, false, fmt.Errorf("%w: a stream named %q exists but does not capture %q (add the subject to it, or create a stream capturing it: %s): %w",
			ErrCannotCreate, cfg.Name, subject, howToCreateStream(cfg), err)
	}
	return nil, false, setupError(js, err, "STREAM.CREATE."+cfg.Name+`"`, "create a stream capturing "+quote(subject), howToCreateStream(cfg))
}

// existing fetches and checks the stream named name, which captures subject.
func existing(ctx context.Context, js jetstream.JetStream, name, subject string) (*jetstream.StreamInfo, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("giveup: stream %q capturing %q: %w", name, subject, err)
	}
	info := s.CachedInfo()
	if _, err := CheckStream(info.Config); err != nil {
		return nil, fmt.Errorf("%w (it captures the max-deliveries advisories %q)", err, subject)
	}
	return info, nil
}

// consumerConfig is the durable consumer on the advisory stream, shared by
// every replica of courier: explicit acks, no delivery limit (an advisory
// whose dead letter cannot be stored comes back until it can), no inactivity
// threshold (the server would delete it while courier is down).
func consumerConfig(stream, consumer string, ackWait time.Duration) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       ConsumerName(consumer),
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
// stream named streamName.
func ensureConsumer(ctx context.Context, js jetstream.JetStream, streamName string, cc jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, streamName, cc)
	if err == nil {
		return cons, nil
	}
	return nil, setupError(js, err, "CONSUMER.CREATE."+streamName+"."+cc.Durable,
		fmt.Sprintf("create or update consumer %q on stream %q", cc.Durable, streamName), howToCreateConsumer(streamName, cc))
}

// setupError explains a failed JetStream API request of the set-up. Denied
// permission and JetStream being off wrap ErrCannotCreate and say what to
// create; anything else is returned wrapped as it is, so that a time-out
// stays a time-out. api is the part of the request's subject (after any API
// prefix) that the server's permissions violation names.
func setupError(js jetstream.JetStream, err error, api, doing, howTo string) error {
	var why error
	switch {
	case errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		why = fmt.Errorf("JetStream is not enabled for this server or account (enable it): %w", err)
	default:
		if perr := permissionDenied(js, err, api); perr != nil {
			why = fmt.Errorf("no permission (grant it, or have an administrator create it): %w", perr)
		}
	}
	if why == nil {
		return fmt.Errorf("giveup: %s: %w", doing, err)
	}
	return fmt.Errorf("%w: cannot %s: %w; what is needed: %s", ErrCannotCreate, doing, why, howTo)
}

// permissionDenied returns the connection's permissions violation when err
// is the time-out of a request the server refused for lack of permission.
// The server answers such a request with an asynchronous -ERR and drops it,
// so the request only times out; the violation, naming the subject, is the
// connection's last error, and api is matched against its text, the only
// place the subject appears.
func permissionDenied(js jetstream.JetStream, err error, api string) error {
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
		return nil
	}
	nc := js.Conn()
	if nc == nil {
		return nil
	}
	last := nc.LastError()
	if last == nil || !errors.Is(last, nats.ErrPermissionViolation) || !strings.Contains(last.Error(), api) {
		return nil
	}
	return last
}

// howToCreateStream renders cfg as a nats CLI command and as the JetStream
// API's JSON, for an operator to create the stream by hand.
func howToCreateStream(cfg jetstream.StreamConfig) string {
	cmd := fmt.Sprintf("nats stream add %s --subjects='%s' --storage=file --retention=limits --discard=old --replicas=%d --max-age=%s --dupe-window=%s --max-msgs=-1 --max-bytes=-1 --max-msgs-per-subject=-1 --max-msg-size=-1 --defaults",
		cfg.Name, strings.Join(cfg.Subjects, ","), cfg.Replicas, cfg.MaxAge, cfg.Duplicates)
	doc, err := json.Marshal(map[string]any{
		"name":                 cfg.Name,
		"subjects":             cfg.Subjects,
		"retention":            "limits",
		"storage":              "file",
		"num_replicas":         cfg.Replicas,
		"discard":              "old",
		"max_age":              cfg.MaxAge.Nanoseconds(),
		"max_msgs":             cfg.MaxMsgs,
		"max_bytes":            cfg.MaxBytes,
		"max_msgs_per_subject": cfg.MaxMsgsPerSubject,
		"max_msg_size":         cfg.MaxMsgSize,
		"duplicate_window":     cfg.Duplicates.Nanoseconds(),
	})
	if err != nil {
		return cmd
	}
	return cmd + " (API config " + string(doc) + ")"
}

// howToCreateConsumer renders cc as a nats CLI command, for an operator to
// create the consumer by hand.
func howToCreateConsumer(streamName string, cc jetstream.ConsumerConfig) string {
	return fmt.Sprintf("nats consumer add %s %s --pull --filter='%s' --ack=explicit --deliver=all --max-deliver=-1 --wait=%s --max-pending=%d --defaults",
		streamName, cc.Durable, cc.FilterSubject, cc.AckWait, cc.MaxAckPending)
}

func quote(s string) string { return `"` + s + `"` }
