package reply

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the service's collectors, registered on the registry the
// caller passes in.
type metrics struct {
	requests    *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	inflight    prometheus.Gauge
	waiting     prometheus.Gauge
	dropped     prometheus.Counter
	replyErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "courier_reply_requests_total",
			Help: "NATS requests answered through the app, by outcome: 2xx, 3xx, 4xx, 5xx (the app's status), timeout (504), unavailable (503, no connection), transport (502, connection failed), too_large (502, answer over max_payload), stopping (503, courier stopping), busy (503, every slot taken and COURIER_REPLY_MAX_WAITING already waiting, or a request waited longer than COURIER_HTTP_TIMEOUT for a slot), no_reply (no reply subject: ignored).",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "courier_reply_request_duration_seconds",
			Help:    "Duration of the app's part of a NATS request (connect to last byte of the answer), by outcome.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"outcome"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "courier_reply_inflight_requests",
			Help: "NATS requests waiting for the app's answer now.",
		}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "courier_reply_waiting_requests",
			Help: "NATS requests waiting in courier for a free slot (COURIER_MAX_INFLIGHT at the app already).",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "courier_reply_dropped_headers_total",
			Help: "NATS request headers not passed to the app because HTTP cannot carry them.",
		}),
		replyErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "courier_reply_publish_errors_total",
			Help: "Replies that could not be published (the connection was lost); their callers time out.",
		}),
	}
	for _, o := range []string{outcome2xx, outcome3xx, outcome4xx, outcome5xx, outcomeTimeout,
		outcomeUnavailable, outcomeTransport, outcomeTooLarge, outcomeStopping, outcomeBusy, outcomeNoReply} {
		m.requests.WithLabelValues(o)
	}
	// The outcomes of a request the app was called for (request), timed:
	// their latency series are served from start-up too, as dashboards
	// query them before the first request.
	for _, o := range []string{outcome2xx, outcome3xx, outcome4xx, outcome5xx, outcomeTimeout,
		outcomeUnavailable, outcomeTransport, outcomeTooLarge, outcomeStopping} {
		m.latency.WithLabelValues(o)
	}
	for _, c := range []prometheus.Collector{m.requests, m.latency, m.inflight, m.waiting, m.dropped, m.replyErrors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("reply: registering metrics: %w", err)
		}
	}
	return m, nil
}

// request counts one request the app was called for.
func (m *metrics) request(outcome string, seconds float64) {
	m.requests.WithLabelValues(outcome).Inc()
	m.latency.WithLabelValues(outcome).Observe(seconds)
}

// outcome counts a request the app was not called for.
func (m *metrics) outcome(outcome string) {
	m.requests.WithLabelValues(outcome).Inc()
}

// endpoint keeps one endpoint's counts for micro's STATS: requests are
// answered after micro's handler returns, so micro counts them but sees
// neither their time nor their errors.
type endpoint struct {
	subject string

	mu       sync.Mutex
	answered int
	errors   int
	lastErr  string
	total    time.Duration
}

// record counts one answered request.
func (e *endpoint) record(took time.Duration, a answer) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.answered++
	e.total += took
	if a.code != 0 {
		e.errors++
		e.lastErr = fmt.Sprintf("%d:%s", a.code, a.desc)
	}
}

// EndpointStats is the data each endpoint adds to micro's STATS answer
// (its "data" field).
type EndpointStats struct {
	// Answered counts requests answered after calling the app.
	Answered int `json:"answered"`
	// Errors counts those answered with an error reply (a non-2xx status
	// or courier's own 5xx).
	Errors int `json:"errors"`
	// LastError is the last error reply, "code:description".
	LastError string `json:"last_error,omitempty"`
	// ProcessingTime is the app's time, in total and on average, in
	// nanoseconds like micro's own fields.
	ProcessingTime        time.Duration `json:"processing_time"`
	AverageProcessingTime time.Duration `json:"average_processing_time"`
}

func (e *endpoint) stats() EndpointStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := EndpointStats{Answered: e.answered, Errors: e.errors, LastError: e.lastErr, ProcessingTime: e.total}
	if e.answered > 0 {
		st.AverageProcessingTime = e.total / time.Duration(e.answered)
	}
	return st
}
