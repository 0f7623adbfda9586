package dedup

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// bucketOp is an operation on the bucket, the op label of
// courier_dedup_shared_bucket_errors_total.
type bucketOp int

const (
	opClaim bucketOp = iota
	opRead
	opRecord
	opRelease
	opRenew
)

// bucketOps names every bucketOp (listed in docs/operations.md, "Dedup
// store").
var bucketOps = [...]string{opClaim: "claim", opRead: "read", opRecord: "record", opRelease: "release", opRenew: "renew"}

func (op bucketOp) String() string { return bucketOps[op] }

// bucketError counts and wraps an error of the bucket.
func (s *Shared) bucketError(op bucketOp, err error) error {
	s.m.bucketErrors[op].Inc()
	return fmt.Errorf("dedup: bucket %s: %s: %w", s.bucket, op, err)
}

// sharedMetrics are a Shared store's collectors; registered only when a
// Registerer is given.
type sharedMetrics struct {
	*registration
	checks       *prometheus.CounterVec
	bucketErrors [len(bucketOps)]prometheus.Counter
	recreated    prometheus.Counter
}

func newSharedMetrics(reg prometheus.Registerer) (*sharedMetrics, error) {
	m := &sharedMetrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "courier_dedup_shared_checks_total",
			Help: "Checks of the shared dedup store by answer: local (processed, from the local cache, no round trip), new (claimed), processed (recorded in the bucket), claimed (another courier holds it), error.",
		}, []string{"answer"}),
		recreated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "courier_dedup_shared_bucket_recreated_total",
			Help: "Times the shared dedup bucket was found deleted and created again (keys recorded by other couriers before are forgotten).",
		}),
	}
	// Every operation's series exists from the start, at 0.
	bucketErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "courier_dedup_shared_bucket_errors_total",
		Help: "Failed operations on the shared dedup bucket, by operation: claim, read, record, release, renew (a claim's renewal while its delivery runs).",
	}, []string{"op"})
	for op, name := range bucketOps {
		m.bucketErrors[op] = bucketErrors.WithLabelValues(name)
	}
	var err error
	if m.registration, err = register(reg, m.checks, bucketErrors, m.recreated); err != nil {
		return nil, err
	}
	return m, nil
}
