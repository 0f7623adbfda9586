package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/proxy/limit"
)

// The one bound on requests at the app (package limit): every request, a
// message's, a retry's, the breaker's probe, a batch's, takes a slot before
// it is sent and gives it back with what came of it. Fixed at MaxInflight,
// or found from the app's answers with InflightAuto, at most MaxInflight
// (docs/adaptive-concurrency.md).

// newInflight is the limiter o asks for.
func newInflight(o Options) *limit.Limiter {
	if o.InflightAuto {
		return limit.NewAuto(limit.AutoOptions{Max: o.MaxInflight, Now: o.Now})
	}
	return limit.NewFixed(o.MaxInflight)
}

// reasonOf is why d's request takes a slot.
func reasonOf(d *delivery) limit.Reason {
	switch {
	case d.probe:
		return limit.Probe
	case d.attempt > 1:
		return limit.Retry
	}
	return limit.Deliver
}

// registerInflightMetrics registers what the limiter shows, read at
// scrape.
func registerInflightMetrics(reg prometheus.Registerer, l *limit.Limiter) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "courier_inflight_limit",
			Help: "Requests to the app allowed at once: COURIER_MAX_INFLIGHT, or the limit found from the app's answers with auto.",
		}, func() float64 { return float64(l.Limit()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "courier_inflight_limit_min_rtt_seconds",
			Help: "The answer time the automatic limit takes as the app's unloaded one (0 with a fixed limit, or none measured yet).",
		}, func() float64 { return l.MinRTT().Seconds() }),
	)
	for _, c := range limit.Causes() {
		if c == limit.CauseNone {
			continue
		}
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "courier_inflight_limit_changes_total",
			Help:        "Changes of the automatic in-flight limit, by what caused them (rise, queueing, overload, timeout, minrtt-probe).",
			ConstLabels: prometheus.Labels{"cause": c.String()},
		}, func() float64 { return float64(l.Stats().Changes[c]) }))
	}
}
