package proxy

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/dlq"
)

// metrics are the delivery loop's collectors, registered on the registry the
// caller passes in.
type metrics struct {
	messages    *prometheus.CounterVec
	deadLetters *prometheus.CounterVec
	requests    *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	inflight    prometheus.Gauge
	appUp       prometheus.Gauge
	dlqErrors   prometheus.Counter
	dedupErrors *prometheus.CounterVec
	inProgress  prometheus.Counter
	dropped     prometheus.Counter
	replayed    prometheus.Counter
	held        *prometheus.GaugeVec
	rateWait    prometheus.Counter
	retryDelay  prometheus.Histogram

	successRecords, successErrors prometheus.Counter

	// The children every message touches, looked up once: a vector's
	// WithLabelValues hashes its labels on each call. ended has one for
	// each kind of ending counted in courier_messages_total (endKind.counted).
	ended  [nEndKinds]prometheus.Counter
	result map[string]resultMetrics // by request result
}

// resultMetrics are one request result's children.
type resultMetrics struct {
	requests prometheus.Counter
	latency  prometheus.Observer
}

// request counts one request with the given result and duration.
func (m *metrics) request(result string, seconds float64) {
	rm, ok := m.result[result]
	if !ok {
		rm = resultMetrics{m.requests.WithLabelValues(result), m.latency.WithLabelValues(result)}
	}
	rm.requests.Inc()
	rm.latency.Observe(seconds)
}

// newMetrics registers the loop's collectors on reg. deadLetters, when not
// nil, is a courier_dead_letters_total{reason} vector the caller registered
// and shares with other components that store dead letters.
func newMetrics(reg prometheus.Registerer, deadLetters *prometheus.CounterVec) *metrics {
	m := &metrics{deadLetters: deadLetters}
	m.newMessageCollectors()
	m.newAppCollectors()
	if m.deadLetters == nil {
		m.deadLetters = NewDeadLetterCounter()
		reg.MustRegister(m.deadLetters)
	}
	reg.MustRegister(m.messages, m.requests, m.latency, m.inflight,
		m.appUp, m.dlqErrors, m.dedupErrors, m.inProgress, m.dropped, m.replayed, m.held, m.rateWait, m.retryDelay, m.successRecords, m.successErrors)
	return m
}

// newMessageCollectors makes the collectors of what became of messages: their
// outcomes, holds, retries, and the stores' failures. Every labelled series
// exists from the start, at 0.
func (m *metrics) newMessageCollectors() {
	var ends []string
	for k := range nEndKinds {
		if c := k.counted(); c != "" {
			ends = append(ends, k.String()+" ("+c+")")
		}
	}
	m.messages = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "courier_messages_total",
		Help: "Messages by how their delivery ended: " + strings.Join(ends, ", ") + ".",
	}, []string{"outcome"})
	m.dlqErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "courier_dead_letter_errors_total",
		Help: "Failed attempts to store a dead letter (the message is kept and tried again).",
	})
	m.dedupErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "courier_dedup_errors_total",
		Help: "Dedup store failures by operation: check (message held, the store asked again) or record (message acked anyway).",
	}, []string{"op"})
	m.replayed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "courier_replayed_total",
		Help: "Deliveries of messages a rewind (courier rewind) delivers again that went on to the app although their keys were recorded before.",
	})
	m.inProgress = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "courier_in_progress_total",
		Help: "In-progress signals sent to JetStream for messages held longer than half the ack wait.",
	})
	m.held = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "courier_delivery_held",
		Help: "1 while courier holds deliveries for this cause (app_unavailable, store_unavailable, breaker_open, paused): it fetches nothing and keeps what it has in progress.",
	}, []string{"cause"})
	m.rateWait = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "courier_rate_limit_wait_seconds_total",
		Help: "Time requests waited for COURIER_MAX_RATE's token bucket, all workers together.",
	})
	m.successRecords = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "courier_success_records_total",
		Help: "Success records stored (COURIER_SUCCESS_SUBJECT): one per 2xx'd delivery.",
	})
	m.successErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "courier_success_record_errors_total",
		Help: "Failed attempts to store a success record (the message is held and it is tried again).",
	})
	m.retryDelay = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "courier_retry_delay_seconds",
		Help:    "Delay of each retry: how long a NAK'd message waits before JetStream redelivers it (the app's Retry-After, capped, else the backoff schedule with jitter).",
		Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800},
	})
	for k := range nEndKinds {
		if k.counted() != "" {
			m.ended[k] = m.messages.WithLabelValues(k.String())
		}
	}
	for c := range nCauses {
		m.held.WithLabelValues(c.Label())
	}
	for _, op := range []string{"check", "record"} {
		m.dedupErrors.WithLabelValues(op)
	}
}

// newAppCollectors makes the collectors of the requests to the app.
func (m *metrics) newAppCollectors() {
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "courier_app_requests_total",
		Help: "Requests to the app (attempts) by result: 2xx, 3xx, 4xx, 5xx, timeout, transport, unreachable.",
	}, []string{"result"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "courier_app_request_duration_seconds",
		Help:    "Duration of requests to the app by result.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"result"})
	m.inflight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "courier_inflight_requests",
		Help: "Requests to the app running now.",
	})
	m.appUp = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "courier_app_available",
		Help: "1 while the app is available, 0 while it is known to be unavailable.",
	})
	m.dropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "courier_dropped_headers_total",
		Help: "Message headers not passed to the app because HTTP cannot carry them.",
	})
	m.result = make(map[string]resultMetrics)
	for _, r := range requestResults() {
		m.result[r] = resultMetrics{m.requests.WithLabelValues(r), m.latency.WithLabelValues(r)}
	}
	// Available until known otherwise: the gate sets 0 when it holds for
	// the app, at once in New while a health URL has not answered yet.
	m.appUp.Set(1)
}

// requestResults are resultLabel's values, each served from start-up.
func requestResults() []string {
	return []string{"2xx", "3xx", "4xx", "5xx", "timeout", "transport", "unreachable"}
}

// batchAnswered is the error of a batch's entry that the app's answer to
// the batch failed (batcher.go's entryError): labelled as that answer.
type batchAnswered interface {
	batchAnswer() *apphttp.AppError
}

// resultLabel names an outcome for metrics.
func resultLabel(err error) string {
	if err == nil {
		return "2xx"
	}
	ae, ok := err.(*apphttp.AppError)
	if ee, entry := err.(batchAnswered); entry {
		ae, ok = ee.batchAnswer(), true
	}
	if !ok {
		return "transport"
	}
	if ae.Kind != apphttp.KindStatus {
		return ae.Kind.String()
	}
	switch {
	case ae.Status < 300:
		return "2xx"
	case ae.Status < 400:
		return "3xx"
	case ae.Status < 500:
		return "4xx"
	default:
		return "5xx"
	}
}

// deadLetterReasons are the reasons courier dead-letters with, each served
// as courier_dead_letters_total{reason} from start-up. The label values are
// the envelope's Courier-Reason words (kebab-case), not snake_case like the
// other label values: one word for a reason wherever an operator meets it.
var deadLetterReasons = []string{
	dlq.ReasonRejected, dlq.ReasonExhausted, dlq.ReasonExpired, dlq.ReasonMaxDeliveries,
	dlq.ReasonAppUnavailable, dlq.ReasonNotAttempted,
}

// NewDeadLetterCounter returns courier_dead_letters_total{reason}, every
// reason courier uses already at 0, for the caller to register and share
// (Options.DeadLetterCounter) with every component that stores dead letters.
func NewDeadLetterCounter() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "courier_dead_letters_total",
		Help: "Dead letters stored by this courier, by reason (the dead letter's Courier-Reason).",
	}, []string{"reason"})
	for _, r := range deadLetterReasons {
		c.WithLabelValues(r)
	}
	return c
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
