package schedule

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestLateness(t *testing.T) {
	now := time.Date(2026, 5, 1, 8, 0, 10, 0, time.UTC)
	reg := prometheus.NewRegistry()
	l, err := NewLateness(reg, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	single := func(at, attempt string) http.Header {
		h := http.Header{"Courier-Attempt": {attempt}}
		if at != "" {
			h["Courier-Deliver-At"] = []string{at}
		}
		return h
	}
	l.Observe(single("2026-05-01T08:00:09.5Z", "1"), nil) // on time
	l.Observe(single("2026-05-01T08:00:12Z", "1"), nil)   // early: on time
	l.Observe(single("2026-05-01T08:00:05Z", "1"), nil)   // late
	l.Observe(single("2026-05-01T08:00:05Z", "2"), nil)   // a retry: not counted
	l.Observe(single("", "1"), nil)                       // not delayed
	l.Observe(single("yesterday", "1"), nil)              // not courier's
	batch := []byte(`{"entries":[{"entryId":"1","attempt":1,"headers":{"Courier-Deliver-At":["2026-05-01T08:00:00Z"]}},` +
		`{"entryId":"2","attempt":1,"headers":{}},{"entryId":"3","attempt":3,"headers":{"Courier-Deliver-At":["2026-05-01T08:00:00Z"]}},` +
		`{"entryId":"4","attempt":1,"headers":{"Courier-Deliver-At":["2026-05-01T08:00:10Z"]}}]}`)
	l.Observe(http.Header{"Courier-Batch": {"4"}}, batch)
	l.Observe(http.Header{"Courier-Batch": {"1"}}, []byte(`{"entries":[{"attempt":1}]}`))

	c := &lateCounter{reg}
	if on, late := c.get(t, "on_time"), c.get(t, "late"); on != 3 || late != 2 {
		t.Errorf("on time %v, late %v; want 3 and 2", on, late)
	}
}

type lateCounter struct{ reg *prometheus.Registry }

func (c *lateCounter) get(t *testing.T, timing string) float64 {
	t.Helper()
	mfs, err := c.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "timing" && lp.GetValue() == timing {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}
