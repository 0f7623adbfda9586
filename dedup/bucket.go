package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultBucket is the bucket of a Shared store when SharedOptions.Bucket is
// empty.
const DefaultBucket = "COURIER_DEDUP"

// ErrBucket is wrapped by OpenShared's error when the bucket exists but
// cannot serve as a shared dedup store (no per-key TTL, fewer replicas than
// asked, a shorter TTL), and when it cannot be created.
var ErrBucket = errors.New("dedup: key-value bucket unusable")

// markerTTL is how long the bucket keeps the marker a key leaves when its
// TTL runs out (LimitMarkerTTL): what makes per-key TTLs possible at all.
// With one revision per key (History 1) it does not stretch a claim's TTL.
const markerTTL = time.Minute

// bucketConfig is the bucket a Shared store creates.
func (s *Shared) bucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:         s.bucket,
		Description:    "courier: processed idempotency keys and claims (COURIER_DEDUP_STORE=shared)",
		History:        1,
		TTL:            s.ttl,
		Storage:        jetstream.FileStorage,
		Replicas:       s.replicas,
		LimitMarkerTTL: min(markerTTL, s.claimTTL),
	}
}

// openBucket makes sure the bucket exists and can serve: it creates it when
// missing, turns per-key TTLs on in a bucket made without them (by the
// earlier kv store, whose records it reads as processed keys), and refuses
// one that would keep keys for less than the TTL or on fewer replicas than
// asked.
func (s *Shared) openBucket(ctx context.Context) error {
	st, err := s.js.Stream(ctx, s.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return s.createBucket(ctx)
	}
	if err != nil {
		return fmt.Errorf("dedup: key-value bucket %s: %w", s.bucket, err)
	}
	cfg := st.CachedInfo().Config
	var problems []string
	if cfg.Replicas < s.replicas {
		problems = append(problems, fmt.Sprintf("it has %d replicas where COURIER_STREAM_REPLICAS asks for %d "+
			"(raise them with `nats stream edit %s --replicas %d`, or lower the variable)",
			cfg.Replicas, s.replicas, s.stream, s.replicas))
	}
	if cfg.MaxAge > 0 && cfg.MaxAge < s.ttl {
		problems = append(problems, fmt.Sprintf("it forgets keys after %s, before COURIER_DEDUP_TTL %s "+
			"(raise its max age with `nats stream edit %s --max-age %s`)", cfg.MaxAge, s.ttl, s.stream, s.ttl))
	}
	if cfg.MaxMsgsPerSubject < 1 {
		problems = append(problems, "it is not a key-value bucket (no per-subject limit)")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: bucket %s (stream %s): %s", ErrBucket, s.bucket, s.stream, joinProblems(problems))
	}
	if cfg.AllowMsgTTL && cfg.SubjectDeleteMarkerTTL > 0 {
		return nil
	}
	// Made without per-key TTLs: claims could not lapse. Turning them on
	// touches nothing else (and a server can turn them on, never off).
	cfg.AllowMsgTTL = true
	cfg.SubjectDeleteMarkerTTL = min(markerTTL, s.claimTTL)
	if _, err := s.js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("%w: bucket %s has no per-key TTL, which claims need, and turning it on failed: %w "+
			"(needs nats-server 2.11 or later; or delete the bucket for courier to create it)", ErrBucket, s.bucket, err)
	}
	s.log.Info("per-key TTL turned on in the dedup bucket", "bucket", s.bucket)
	return nil
}

func joinProblems(p []string) string {
	out := p[0]
	for _, q := range p[1:] {
		out += "; " + q
	}
	return out
}

// createBucket creates the bucket; one created meanwhile by another courier
// is as good.
func (s *Shared) createBucket(ctx context.Context) error {
	_, err := s.js.CreateKeyValue(ctx, s.bucketConfig())
	switch {
	case err == nil:
		s.log.Info("dedup bucket created", "bucket", s.bucket, "replicas", s.replicas, "ttl", s.ttl.String())
		return nil
	case errors.Is(err, jetstream.ErrBucketExists), errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
		return nil
	case errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported):
		return fmt.Errorf("%w: bucket %s: the server does not support per-key TTLs, which claims need "+
			"(COURIER_DEDUP_STORE=shared needs nats-server 2.11 or later)", ErrBucket, s.bucket)
	default:
		// Wrapped whole: a timeout (a cluster slow to place the bucket's
		// replicas) is one the caller can retry.
		return fmt.Errorf("%w: create bucket %s: %w", ErrBucket, s.bucket, err)
	}
}

// recreate is called when the stream does not answer a write at all, or
// refuses its per-key TTL: if the bucket is gone (deleted under courier) it
// is created again, loudly, since the keys other replicas recorded are lost
// with it (each replica still knows its own, locally); if it was made again
// without per-key TTLs, they are turned on, as OpenShared does. It reports
// whether the write is worth trying again. Concurrent callers create it
// once.
func (s *Shared) recreate(ctx context.Context) bool {
	s.recreateMu.Lock()
	defer s.recreateMu.Unlock()
	st, err := s.js.Stream(ctx, s.stream)
	switch {
	case err == nil && st.CachedInfo().Config.AllowMsgTTL:
		return true // back already (created by another courier or call)
	case err == nil:
		if err := s.openBucket(ctx); err != nil {
			s.log.Error("dedup bucket made again without per-key TTLs, which cannot be turned on", "bucket", s.bucket, "error", err)
			return false
		}
		return true
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return false
	}
	if err := s.createBucket(ctx); err != nil {
		s.log.Error("dedup bucket deleted and cannot be created again", "bucket", s.bucket, "error", err)
		return false
	}
	s.m.recreated.Inc()
	s.log.Error("dedup bucket was deleted and is created again: keys recorded by other replicas "+
		"before are forgotten (each replica still knows its own)", "bucket", s.bucket)
	return true
}

// isWrongLastSeq reports whether err says the key's last revision was not
// the one expected: 10071, or 10164 from a replicated stream.
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// jsErrCodeMessageTTLDisabled is the server's answer to a write with a
// per-message TTL on a stream that does not allow them (nats-server
// JSMessageTTLDisabledErr); nats.go has no constant for it.
const jsErrCodeMessageTTLDisabled = 10166

// isTTLDisabled reports whether err says the bucket refuses per-key TTLs:
// it was deleted and made again without them (`nats kv add`).
func isTTLDisabled(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeMessageTTLDisabled
}
