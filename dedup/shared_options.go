package dedup

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults for the zero values of SharedOptions.
const (
	// DefaultClaimTTL is how long a claim lives when SharedOptions.ClaimTTL
	// is zero: JetStream's default AckWait.
	DefaultClaimTTL = 30 * time.Second
	// DefaultSharedTimeout bounds a call to the bucket whose context has no
	// deadline, when SharedOptions.Timeout is zero.
	DefaultSharedTimeout = 5 * time.Second
)

// SharedOptions tunes a Shared store. TTL is required; every other zero
// value means the documented default.
type SharedOptions struct {
	// Bucket is the key-value bucket; empty means DefaultBucket
	// (COURIER_DEDUP). Several scopes share one bucket.
	Bucket string
	// Replicas of the bucket when it is created, and the least an existing
	// bucket must have. Zero means 1.
	Replicas int
	// TTL is how long a processed key is remembered (COURIER_DEDUP_TTL);
	// required, whole seconds, at least 1s.
	TTL time.Duration
	// ClaimTTL is how long a claim lives if its holder neither records nor
	// releases it (it died, or is cut off from the servers): about the consumer's AckWait, so that the
	// redelivery of a message whose courier died goes ahead. A live
	// holder renews its claims every half ClaimTTL until it records or
	// releases them, however long its delivery takes or is held.
	// Whole seconds, at least 1s; zero means DefaultClaimTTL (30s).
	ClaimTTL time.Duration
	// Scope prefixes every key in the bucket (typically stream/consumer).
	Scope string
	// Timeout bounds a call whose context has no deadline; zero means
	// DefaultSharedTimeout (5s).
	Timeout time.Duration
	// Logger receives the store's logs, narrowed with component=dedup.
	// Nil discards them.
	Logger *slog.Logger
	// Registerer receives the store's metrics (courier_dedup_shared_*),
	// unregistered by Close. Nil means no metrics.
	Registerer prometheus.Registerer
}

func cmp0(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func (o SharedOptions) validate() error {
	var errs []error
	whole := func(name string, d time.Duration, zeroOK bool) {
		switch {
		case d == 0 && zeroOK:
		case d < time.Second || d%time.Second != 0:
			errs = append(errs, fmt.Errorf("dedup: %s %v: must be whole seconds, at least 1s (a bucket's per-key TTL)", name, d))
		}
	}
	whole("TTL", o.TTL, false)
	whole("claim TTL", o.ClaimTTL, true)
	if o.Replicas < 0 || o.Replicas > 5 {
		errs = append(errs, fmt.Errorf("dedup: bucket replicas %d: must be 1 to 5", o.Replicas))
	}
	if o.Timeout < 0 {
		errs = append(errs, fmt.Errorf("dedup: timeout %v: must not be negative", o.Timeout))
	}
	return errors.Join(errs...)
}
