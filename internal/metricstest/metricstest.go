// Package metricstest reads Prometheus metrics in courier's tests, one way
// for a registry and for a running courier's /metrics (Scrape): a series
// is found by its family's name and its exact label set, and one that is
// not served is told apart from one at 0. Comparing whole families is
// prometheus/testutil's (GatherAndCompare, GatherAndCount), which works on
// a Scrape too.
package metricstest

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Scrape returns a Gatherer that GETs url (an admin server's /metrics) at
// each Gather and parses the answer with expfmt, in whatever format the
// server chose, so a running courier is read as a registry is. Gather
// fails if the server does not answer 200 within 10 seconds.
func Scrape(url string) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		c := http.Client{Timeout: 10 * time.Second}
		resp, err := c.Get(url)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		dec := expfmt.NewDecoder(resp.Body, expfmt.ResponseFormat(resp.Header))
		var out []*dto.MetricFamily
		for {
			mf := &dto.MetricFamily{}
			err := dec.Decode(mf)
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			if err != nil {
				return nil, fmt.Errorf("GET %s: %w", url, err)
			}
			out = append(out, mf)
		}
	})
}

// Lookup returns the value of the series of family name in g whose labels
// are exactly labels (name, value pairs; none for an unlabelled series): a
// counter's, gauge's or untyped metric's value, a histogram's or summary's
// sample count. ok is false if g serves no such series. It fails tb if g
// cannot be gathered.
func Lookup(tb testing.TB, g prometheus.Gatherer, name string, labels ...string) (v float64, ok bool) {
	tb.Helper()
	if len(labels)%2 != 0 {
		tb.Fatalf("metricstest: labels %q are not name, value pairs", labels)
	}
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatalf("gathering metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, labels) {
				return value(m), true
			}
		}
	}
	return 0, false
}

// Value is Lookup for a series that must be served: it fails tb if g does
// not serve it.
func Value(tb testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	tb.Helper()
	v, ok := Lookup(tb, g, name, labels...)
	if !ok {
		tb.Fatalf("no series %s%s served", name, formatLabels(labels))
	}
	return v
}

func hasLabels(m *dto.Metric, labels []string) bool {
	if len(m.GetLabel()) != len(labels)/2 {
		return false
	}
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for i := 0; i < len(labels); i += 2 {
		if v, ok := have[labels[i]]; !ok || v != labels[i+1] {
			return false
		}
	}
	return true
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	case m.Summary != nil:
		return float64(m.GetSummary().GetSampleCount())
	}
	return m.GetUntyped().GetValue()
}

func formatLabels(labels []string) string {
	if len(labels) == 0 {
		return ""
	}
	s := "{"
	for i := 0; i < len(labels); i += 2 {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf("%s=%q", labels[i], labels[i+1])
	}
	return s + "}"
}
