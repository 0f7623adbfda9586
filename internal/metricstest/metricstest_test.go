package metricstest

import (
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_requests_total", Help: "h"}, []string{"result", "op"})
	c.WithLabelValues("2xx", "post").Add(3)
	c.WithLabelValues("5xx", "post")
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "t_inflight", Help: "h"})
	g.Set(2.5)
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "t_seconds", Help: "h"}, []string{"op"})
	h.WithLabelValues("check").Observe(0.1)
	h.WithLabelValues("check").Observe(0.2)
	reg.MustRegister(c, g, h)
	return reg
}

// TestLookup: a registry and a scrape of it read the same, by exact label
// set; a series that is not served is not found, one at 0 is.
func TestLookup(t *testing.T) {
	reg := registry()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	for name, g := range map[string]prometheus.Gatherer{"registry": reg, "scrape": Scrape(srv.URL)} {
		for _, tt := range []struct {
			name   string
			labels []string
			want   float64
			ok     bool
		}{
			{"t_requests_total", []string{"result", "2xx", "op", "post"}, 3, true},
			{"t_requests_total", []string{"op", "post", "result", "5xx"}, 0, true},
			{"t_requests_total", []string{"result", "4xx", "op", "post"}, 0, false},
			{"t_requests_total", []string{"result", "2xx"}, 0, false}, // not all its labels
			{"t_requests_total", nil, 0, false},
			{"t_inflight", nil, 2.5, true},
			{"t_inflight", []string{"op", "x"}, 0, false},
			{"t_seconds", []string{"op", "check"}, 2, true},
			{"t_missing", nil, 0, false},
		} {
			if v, ok := Lookup(t, g, tt.name, tt.labels...); v != tt.want || ok != tt.ok {
				t.Errorf("%s: Lookup(%s %q) = %v, %v; want %v, %v", name, tt.name, tt.labels, v, ok, tt.want, tt.ok)
			}
		}
	}
	// testutil's comparisons work on a scrape too.
	if n, err := testutil.GatherAndCount(Scrape(srv.URL), "t_requests_total"); err != nil || n != 2 {
		t.Errorf("GatherAndCount of the scrape = %d, %v; want 2", n, err)
	}
}

// fatalTB records a Fatalf (a test failure cannot be produced otherwise
// without failing this test).
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = strings.TrimSpace(format)
	runtime.Goexit()
}

func fatal(t *testing.T, f func(tb testing.TB)) string {
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(tb)
	}()
	<-done
	return tb.msg
}

// TestValueFails: Value fails the test on a series not served, and so do
// both on a scrape that fails or on labels that are not pairs.
func TestValueFails(t *testing.T) {
	reg := registry()
	if msg := fatal(t, func(tb testing.TB) { Value(tb, reg, "t_inflight") }); msg != "" {
		t.Errorf("Value of a served series failed: %s", msg)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv.Close()
	for what, f := range map[string]func(tb testing.TB){
		"not served":    func(tb testing.TB) { Value(tb, reg, "t_requests_total", "result", "4xx", "op", "post") },
		"scrape failed": func(tb testing.TB) { Lookup(tb, Scrape(srv.URL), "t_inflight") },
		"odd labels":    func(tb testing.TB) { Lookup(tb, reg, "t_inflight", "op") },
	} {
		if msg := fatal(t, f); msg == "" {
			t.Errorf("%s: did not fail the test", what)
		}
	}
}
