// Package jsutil holds the JetStream set-up helpers that more than one of
// courier's packages needs: making sure a stream captures a subject and will
// keep what it receives (Unsuitable says why one would not), explaining a
// set-up request the server refused (no permission, JetStream not enabled)
// with what to create by hand, and making stream names from arbitrary text.
// It imports nothing of courier's.
package jsutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// createdWait bounds how long a stream named by the subject look-up may
// answer "not found" while it is being created (see captured).
const createdWait = 5 * time.Second

// errCodeSubjectOverlap is the server's JSStreamSubjectOverlapErr, which
// nats.go does not name.
const errCodeSubjectOverlap jetstream.ErrorCode = 10065

// EnsureCapture makes sure a stream captures cfg.Subjects[0] and that check
// accepts it. If one does (js.StreamNameBySubject), check is called on its
// configuration and the stream returned with created false; the warnings of
// check are dropped, call it again for them. If none does, a stream with cfg
// is created and returned with created true. dlq.EnsureStream is
// EnsureCapture for dead letters.
//
// When the capturing stream will not do, the error wraps check's. When none
// exists and none can be created (no permission, JetStream not enabled, the
// name taken), it is a *SetupError whose text gives the stream to create; the
// caller may wrap it in an error of its own. Neither goes away by retrying.
// Other errors (a time-out, a lost connection) may.
func EnsureCapture(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, check func(jetstream.StreamConfig) (warnings []string, err error)) (*jetstream.StreamInfo, bool, error) {
	if len(cfg.Subjects) == 0 {
		return nil, false, fmt.Errorf("jsutil: stream %q to capture no subject", cfg.Name)
	}
	subject := cfg.Subjects[0]
	name, err := js.StreamNameBySubject(ctx, subject)
	switch {
	case err == nil:
		info, err := captured(ctx, js, name, subject, check)
		return info, false, err
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, false, lookUpOrCreateError(js, err, "STREAM.NAMES", "look up the stream capturing", cfg)
	}

	s, err := js.CreateStream(ctx, cfg)
	if err == nil {
		return s.CachedInfo(), true, nil
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeSubjectOverlap {
		// Another instance created a stream capturing the subject since
		// the look-up: use it if it will do.
		if name, lerr := js.StreamNameBySubject(ctx, subject); lerr == nil {
			info, err := captured(ctx, js, name, subject, check)
			return info, false, err
		}
	}
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		if info, created, handled, err := createBesideNamesake(ctx, js, cfg, check); handled {
			return info, created, err
		}
		// The stream to create by hand needs a name that is free: a
		// capturing stream is found by its subject, whatever its name.
		free := cfg
		free.Name = freeStreamName(ctx, js, cfg.Name)
		return nil, false, &SetupError{
			Doing: fmt.Sprintf("create a stream capturing %q", subject),
			Err:   fmt.Errorf("a stream named %q exists but does not capture it (add the subject to that stream, or create one of another name capturing it): %w", cfg.Name, err),
			HowTo: HowToCreateStream(free),
		}
	}
	return nil, false, lookUpOrCreateError(js, err, "STREAM.CREATE."+cfg.Name, "create a stream capturing", cfg)
}

// createBesideNamesake handles a create refused because cfg.Name is taken.
// Names made from text lose its case and punctuation, so the stream of
// another subject can have cfg's name (dead letters of dlq.orders.courier
// and of dlq.ORDERS.courier): when the stream of that name is courier's own
// (its description starts with "courier") and captures another subject,
// cfg's stream is created under a name of its own (DistinctName): capturing
// streams are found by their subject, so each keeps its own, and neither is
// shared. A stream of that name that captures cfg's subject (created
// meanwhile) is used. handled is false when neither applies: the name is
// taken by a stream courier did not make, which is for the operator to
// sort out.
func createBesideNamesake(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, check func(jetstream.StreamConfig) ([]string, error)) (info *jetstream.StreamInfo, created, handled bool, err error) {
	subject := cfg.Subjects[0]
	other, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		return nil, false, false, nil
	}
	ocfg := other.CachedInfo().Config
	if slices.Contains(ocfg.Subjects, subject) {
		info, err := captured(ctx, js, cfg.Name, subject, check)
		return info, false, true, err
	}
	if !strings.HasPrefix(ocfg.Description, "courier") {
		return nil, false, false, nil
	}
	own := cfg
	own.Name = DistinctName(cfg.Name, subject)
	s, err := js.CreateStream(ctx, own)
	if err != nil {
		return nil, false, true, lookUpOrCreateError(js, err, "STREAM.CREATE."+own.Name, "create a stream capturing", own)
	}
	return s.CachedInfo(), true, true, nil
}

// DistinctName is name made distinct by a hash of unique (what the name was
// made from), within 64 characters: the name of a stream whose plain name
// another stream has.
func DistinctName(name, unique string) string {
	h := fnv.New32a()
	h.Write([]byte(unique))
	return fmt.Sprintf("%s_%08X", name[:min(len(name), maxStreamNameLen-9)], h.Sum32())
}

// freeStreamName returns name followed by "_2", "_3", ... up to "_99": the
// first that no stream has, or that the server does not say is taken.
func freeStreamName(ctx context.Context, js jetstream.JetStream, name string) string {
	var candidate string
	for i := 2; i < 100; i++ {
		candidate = fmt.Sprintf("%s_%d", name, i)
		if _, err := js.Stream(ctx, candidate); err != nil {
			return candidate
		}
	}
	return candidate
}

// captured fetches the stream named name, which captures subject, and checks
// it.
func captured(ctx context.Context, js jetstream.JetStream, name, subject string, check func(jetstream.StreamConfig) ([]string, error)) (*jetstream.StreamInfo, error) {
	s, err := js.Stream(ctx, name)
	// On a cluster, a stream another instance has just created is named by
	// the subject look-up (the meta leader knows it) before it answers for
	// itself: "not found" then means "not yet". Wait for it a little.
	for wait := time.Now().Add(createdWait); errors.Is(err, jetstream.ErrStreamNotFound) && time.Now().Before(wait); {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("stream %q capturing %q: %w", name, subject, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		s, err = js.Stream(ctx, name)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %q capturing %q: %w", name, subject, err)
	}
	info := s.CachedInfo()
	if _, err := check(info.Config); err != nil {
		return nil, fmt.Errorf("%w (it captures %q)", err, subject)
	}
	return info, nil
}

// lookUpOrCreateError explains a failed stream request of EnsureCapture: a
// *SetupError if retrying will not help, else err wrapped as it is.
func lookUpOrCreateError(js jetstream.JetStream, err error, api, doing string, cfg jetstream.StreamConfig) error {
	doing = fmt.Sprintf("%s %q", doing, cfg.Subjects[0])
	if serr := ExplainSetup(js, err, api+`"`, doing, HowToCreateStream(cfg)); serr != nil {
		return serr
	}
	return fmt.Errorf("%s: %w", doing, err)
}

// SetupError is a JetStream request setting up a stream or consumer that
// failed, and will fail again until someone changes the server's setup: the
// server denied permission, JetStream is not enabled, or the stream's name is
// taken. Its text says what to create by hand.
type SetupError struct {
	// Doing is what failed, as in "cannot " + Doing.
	Doing string
	// Err says why, wrapping the cause.
	Err error
	// HowTo says how to create what is needed by hand (see
	// HowToCreateStream).
	HowTo string
}

func (e *SetupError) Error() string {
	return "cannot " + e.Doing + ": " + e.Err.Error() + "; what is needed: " + e.HowTo
}

func (e *SetupError) Unwrap() error { return e.Err }

// ExplainSetup returns a *SetupError for err, the failure of the JetStream
// API request api, when retrying will not help: the server denied permission
// (see PermissionDenied; api is matched as its part) or JetStream is not
// enabled. doing and howTo become the SetupError's. Otherwise it returns nil:
// a time-out stays a time-out.
func ExplainSetup(js jetstream.JetStream, err error, api, doing, howTo string) error {
	var why error
	switch {
	case errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		why = fmt.Errorf("JetStream is not enabled for this server or account (enable it): %w", err)
	default:
		if perr := PermissionDenied(js, err, api); perr != nil {
			why = fmt.Errorf("no permission (grant it, or have an administrator create it): %w", perr)
		}
	}
	if why == nil {
		return nil
	}
	return &SetupError{Doing: doing, Err: why, HowTo: howTo}
}

// PermissionDenied returns the connection's permissions violation when err
// is the time-out of a request the server refused for lack of permission,
// and nil otherwise. The server answers such a request with an asynchronous
// -ERR and drops it, so the request only times out; the violation, naming
// the subject, is the connection's last error, and part is matched against
// its text, the only place the subject appears. Quote a whole subject
// (`"orders.dlq"`); an API request's subject may be given by its tail
// (`STREAM.NAMES"`), since an API prefix may precede it.
func PermissionDenied(js jetstream.JetStream, err error, part string) error {
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
		return nil
	}
	nc := js.Conn()
	if nc == nil {
		return nil
	}
	last := nc.LastError()
	if last == nil || !errors.Is(last, nats.ErrPermissionViolation) || !strings.Contains(last.Error(), part) {
		return nil
	}
	return last
}

// HowToCreateStream renders cfg as a nats CLI command and as the JetStream
// API's JSON, for an operator to create the stream by hand. Its name,
// subjects, retention (limits or work queue), replicas, max age, duplicate
// window and direct gets are cfg's; storage and discard are always file and
// old, and the command sets no other limit.
func HowToCreateStream(cfg jetstream.StreamConfig) string {
	retention := "limits"
	if cfg.Retention == jetstream.WorkQueuePolicy {
		retention = "workqueue"
	}
	cmd := fmt.Sprintf("nats stream add %s --subjects='%s' --storage=file --retention=%s --discard=old --replicas=%d --max-age=%s --dupe-window=%s --max-msgs=-1 --max-bytes=-1 --max-msgs-per-subject=-1 --max-msg-size=-1",
		cfg.Name, strings.Join(cfg.Subjects, ","), retention, cfg.Replicas, cfg.MaxAge, cfg.Duplicates)
	api := map[string]any{
		"name":                 cfg.Name,
		"subjects":             cfg.Subjects,
		"retention":            retention,
		"storage":              "file",
		"num_replicas":         cfg.Replicas,
		"discard":              "old",
		"max_age":              cfg.MaxAge.Nanoseconds(),
		"max_msgs":             cfg.MaxMsgs,
		"max_bytes":            cfg.MaxBytes,
		"max_msgs_per_subject": cfg.MaxMsgsPerSubject,
		"max_msg_size":         cfg.MaxMsgSize,
		"duplicate_window":     cfg.Duplicates.Nanoseconds(),
	}
	if cfg.AllowDirect {
		cmd += " --allow-direct"
		api["allow_direct"] = true
	}
	cmd += " --defaults"
	doc, err := json.Marshal(api)
	if err != nil {
		return cmd
	}
	return cmd + " (API config " + string(doc) + ")"
}

// maxStreamNameLen is the longest stream name SafeStreamName returns: names
// are file names on the server, and short ones read better in the CLI.
const maxStreamNameLen = 64

// SafeStreamName returns prefix and key, uppercased, every character other
// than a letter, digit, '-' or '_' replaced by '_', as a stream name. Names
// longer than 64 characters are cut and end in a hash of unique, which
// identifies key, so that they stay distinct. prefix must be a valid name.
func SafeStreamName(prefix, key, unique string) string {
	var b strings.Builder
	b.WriteString(prefix)
	for _, r := range key {
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
	h.Write([]byte(unique))
	return fmt.Sprintf("%s_%08X", name[:maxStreamNameLen-9], h.Sum32())
}

// NameToken is s with every character other than a letter, digit, '-' or
// '_' replaced by '_', case kept: a part of a stream, bucket or consumer
// name.
func NameToken(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}
