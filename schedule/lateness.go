package schedule

// How late delayed messages reach the app. A delayed message carries the
// time it was asked for (Courier-Deliver-At, which Message sets); courier's
// delivery compares it with the moment the first attempt is sent.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LateAfter is how long after its time a delayed message may reach the app
// and still count as on time.
const LateAfter = time.Second

// The request headers Lateness reads: the attempt (courier's own) and the
// marker of a batch request (package batch).
const (
	headerAttempt = "Courier-Attempt"
	headerBatch   = "Courier-Batch"
)

// Lateness counts the delayed messages a delivery path sends to the app, on
// their first attempt, as on time or late. Observe is safe for concurrent
// use.
type Lateness struct {
	onTime, late prometheus.Counter
	now          func() time.Time
}

// NewLateness registers courier_schedule_deliveries_total on reg; now is
// the clock (nil: time.Now).
func NewLateness(reg prometheus.Registerer, now func() time.Time) (*Lateness, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "courier_schedule_deliveries_total",
		Help: "Delayed messages (published with Courier-Delay or Courier-Deliver-At) sent to the app, on their first attempt, by timing: on_time within 1s of the time asked for, late more than 1s after it (JetStream's scheduler behind, or courier's backlog).",
	}, []string{"timing"})
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("schedule: registering metrics: %w", err)
	}
	if now == nil {
		now = time.Now
	}
	return &Lateness{onTime: c.WithLabelValues("on_time"), late: c.WithLabelValues("late"), now: now}, nil
}

// Observe counts what a request to the app carries, given its headers and
// body as they are sent (proxy.Options.Stamp): the delayed message of a
// first attempt, or each such entry of a batch. Other requests cost a
// header look-up, and a batch one search of its body.
func (l *Lateness) Observe(h http.Header, body []byte) {
	if len(h[headerBatch]) > 0 {
		if bytes.Contains(body, []byte(HeaderDeliverAt)) {
			l.observeBatch(body)
		}
		return
	}
	if at := h[HeaderDeliverAt]; len(at) > 0 && len(h[headerAttempt]) > 0 && h[headerAttempt][0] == "1" {
		l.count(at[0])
	}
}

// observeBatch counts the delayed entries of a batch body (package batch's
// shape) on their first attempt.
func (l *Lateness) observeBatch(body []byte) {
	var b struct {
		Entries []struct {
			Attempt int                 `json:"attempt"`
			Headers map[string][]string `json:"headers"`
		} `json:"entries"`
	}
	if json.Unmarshal(body, &b) != nil {
		return
	}
	for _, e := range b.Entries {
		if at := e.Headers[HeaderDeliverAt]; e.Attempt == 1 && len(at) > 0 {
			l.count(at[0])
		}
	}
}

func (l *Lateness) count(at string) {
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return // not courier's: set by the publisher itself
	}
	if l.now().Sub(t) > LateAfter {
		l.late.Inc()
	} else {
		l.onTime.Inc()
	}
}
