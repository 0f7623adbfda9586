package dedup

import (
	"io/fs"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the store's collectors. They always exist, so the code that
// counts needs no nil checks; they are registered only when a Registerer is
// given.
type metrics struct {
	*registration
	keysRecorded prometheus.Counter
	recordErrors prometheus.Counter
	batchSize    prometheus.Histogram
	filterAbsent prometheus.Counter
	gcRuns       prometheus.Counter
	gcRewrites   prometheus.Counter
	sizeBytes    prometheus.GaugeFunc
	diskFree     prometheus.GaugeFunc
	duration     *durations
}

// durations is courier_dedup_duration_seconds{op}, the latency of checks
// and records as their callers see it, served by Store and KV alike.
type durations struct {
	vec           *prometheus.HistogramVec
	check, record prometheus.Observer
}

func newDurations() *durations {
	vec := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "courier_dedup_duration_seconds",
		Help:    "Duration of calls to the dedup store by operation: check (was this key processed?) or record (commit keys as processed; one call may carry the keys of several deliveries).",
		Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"op"})
	return &durations{vec: vec, check: vec.WithLabelValues("check"), record: vec.WithLabelValues("record")}
}

// since observes the time since start on o; deferred as
// defer since(o, time.Now()).
func since(o prometheus.Observer, start time.Time) { o.Observe(time.Since(start).Seconds()) }

func newMetrics(dir string, disk *diskWatch, reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		keysRecorded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "courier_dedup_keys_recorded_total",
			Help: "Idempotency keys committed to the dedup store.",
		}),
		recordErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "courier_dedup_record_errors_total",
			Help: "Idempotency keys the dedup store failed to commit.",
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "courier_dedup_record_batch_size",
			Help:    "Keys written per call to the dedup store's Record (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9), // 1..256
		}),
		filterAbsent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "courier_dedup_filter_absent_total",
			Help: "Key checks answered 'not processed' by the in-memory key filter, without reading the store.",
		}),
		gcRuns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "courier_dedup_gc_runs_total",
			Help: "Scheduled value-log garbage collections of the dedup store.",
		}),
		gcRewrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "courier_dedup_gc_rewrites_total",
			Help: "Value-log files rewritten by the dedup store's garbage collection.",
		}),
		// Walked at scrape time rather than taken from Badger's DB.Size,
		// which needs Badger's process-global metrics, is refreshed once a
		// minute and leaves out the memtable write-ahead logs.
		sizeBytes: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "courier_dedup_store_size_bytes",
			Help: "Disk space taken by the files in the dedup store's directory.",
		}, func() float64 { return float64(dirSize(dir)) }),
		diskFree: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "courier_dedup_disk_free_bytes",
			Help: "Free space of the dedup store's file system at the last measure (once a second); -1 when it cannot be measured. Below the floor (64 MiB by default) the store records nothing.",
		}, func() float64 { return float64(disk.freeBytes.Load()) }),
		duration: newDurations(),
	}
	var err error
	m.registration, err = register(reg,
		m.keysRecorded, m.recordErrors, m.batchSize, m.filterAbsent, m.gcRuns, m.gcRewrites, m.sizeBytes, m.diskFree, m.duration.vec)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// registration is collectors registered together on one Registerer (none
// when it is nil): all or none, and taken off together, so that a store
// opened again on the same Registerer can register afresh.
type registration struct {
	reg prometheus.Registerer
	cs  []prometheus.Collector
}

// register registers cs on reg, or none of them if one cannot be.
func register(reg prometheus.Registerer, cs ...prometheus.Collector) (*registration, error) {
	r := &registration{reg: reg}
	if reg == nil {
		return r, nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			r.unregister()
			return nil, err
		}
		r.cs = append(r.cs, c)
	}
	return r, nil
}

// unregister removes what register registered. Idempotent.
func (r *registration) unregister() {
	for _, c := range r.cs {
		r.reg.Unregister(c)
	}
	r.cs = nil
}

// dirSize sums the disk space taken by the regular files under dir. Badger
// preallocates its write-ahead and value logs as sparse files, so their
// apparent size overstates it. Files Badger removes during the walk are
// skipped.
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			n += diskUsage(info)
		}
		return nil
	})
	return n
}
