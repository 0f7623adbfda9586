package publish

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the server's collectors, registered on the registry the
// caller passes in.
type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	inflight prometheus.Gauge
	retries  prometheus.Counter
	// batchSize is the entries of each batch request published.
	batchSize prometheus.Histogram
	// cancelled counts the schedules cancelled (cancel.go).
	cancelled prometheus.Counter
	// byOutcome holds each outcome's series, looked up once here rather
	// than by label on every request; read-only after newMetrics.
	byOutcome map[string]outcomeSeries
}

// outcomeSeries are one outcome's counter and latency histogram.
type outcomeSeries struct {
	requests prometheus.Counter
	latency  prometheus.Observer
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "courier_publish_requests_total",
			Help: "Publishes through courier's HTTP API, by outcome: stored and duplicate (200, acknowledged by a stream; a delayed publish sent again is a duplicate too), scheduled (202, a delayed publish stored as a schedule), unauthorized (401), forbidden (403), invalid (400), no_stream (404), too_large (413), expectation_failed (412), no_schedules (409, a delayed publish to a stream that cannot hold schedules), unavailable (503, no acknowledgement in time), busy (503, too many at once), canceled (the caller went away). Each entry of a batch counts as a publish; a batch refused whole counts once.",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "courier_publish_duration_seconds",
			Help:    "Time from a publish request's arrival to its answer, by outcome.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"outcome"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "courier_publish_inflight_requests",
			Help: "Publishes waiting for a stream's acknowledgement now.",
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "courier_publish_retries_total",
			Help: "Publish attempts courier made again within a request's time (NATS unreachable, no quorum, a leader election).",
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "courier_publish_batch_entries",
			Help:    "Entries of each batch request published (POST /v1/publish-batch); each entry also counts in courier_publish_requests_total as a publish of its own.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}),
		cancelled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "courier_schedules_cancelled_total",
			Help: "Delayed publishes cancelled before their time (DELETE /v1/schedules/<id>); those stored are counted in courier_publish_requests_total{outcome=\"scheduled\"}.",
		}),
	}
	m.byOutcome = make(map[string]outcomeSeries, len(outcomes))
	for _, o := range outcomes {
		m.byOutcome[o] = outcomeSeries{m.requests.WithLabelValues(o), m.latency.WithLabelValues(o)}
	}
	for _, c := range []prometheus.Collector{m.requests, m.latency, m.inflight, m.retries, m.batchSize, m.cancelled} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("publish: registering metrics: %w", err)
		}
	}
	return m, nil
}

// observe counts one answered request.
func (m *metrics) observe(outcome string, seconds float64) {
	o, ok := m.byOutcome[outcome]
	if !ok { // every outcome is in outcomes; this keeps a new one counted
		o = outcomeSeries{m.requests.WithLabelValues(outcome), m.latency.WithLabelValues(outcome)}
	}
	o.requests.Inc()
	o.latency.Observe(seconds)
}
