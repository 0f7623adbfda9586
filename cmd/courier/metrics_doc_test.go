package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
)

// TestMetricsDocumented: every courier_* metric the sidecar serves is in the
// operations guide's metric tables, so an operator can look up what it says.
func TestMetricsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t)
	a := newApp(t, nil)
	h.publish("orders.created", "one", map[string]string{"Idempotency-Key": "k-1"})
	// The publish API on too, so that its metrics are served.
	c := start(t, h.env(a.URL, "COURIER_PUBLISH_ADDR=127.0.0.1:0", "COURIER_PUBLISH_SUBJECTS=orders.>"))
	admin := adminAddr(t, c)
	poll.Until(t, 10*time.Second, "the message acked", func() bool { return h.settled("courier") })

	mfs, err := metrics(admin).Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "courier_") {
			names = append(names, mf.GetName())
		}
	}
	if len(names) < 10 {
		t.Fatalf("only %d courier_* metrics served: %v", len(names), names)
	}
	for _, name := range names {
		if !strings.Contains(string(doc), "`"+name+"`") && !strings.Contains(string(doc), "`"+name+"{") {
			t.Errorf("metric %s is served but not in docs/operations.md", name)
		}
	}
	t.Logf("%d courier_* metrics checked", len(names))
}
