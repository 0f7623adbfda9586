package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSubsEnvNamesEachSubscriptionsStream(t *testing.T) {
	got := subsEnv([2]string{"BENCH7A", "BENCH7B"})
	want := []string{"COURIER_SUBSCRIPTIONS=a,b", "COURIER_SUB_A_STREAM=BENCH7A", "COURIER_SUB_B_STREAM=BENCH7B"}
	if !slices.Equal(got, want) {
		t.Fatalf("subsEnv = %q, want %q", got, want)
	}
}

func TestPrintSubscriptionsSetsOneCourierBesideTwo(t *testing.T) {
	const mib = 1 << 20
	run := func(k int, elapsed time.Duration, rss int64) subsResult {
		return subsResult{k: k, n: 1000, elapsed: elapsed, distinct: 2000, requests: 2000, peakRSS: rss * mib, hwm: rss * mib}
	}
	rep := &report{o: options{subsN: 1000}, subs: []subsResult{
		// One courier: 2000 msgs/s in each round, 30 MiB; two: 4000 and
		// 60 MiB, but for a slower round the median leaves out.
		run(1, time.Second, 30), run(2, 500*time.Millisecond, 60),
		run(2, 2*time.Second, 61), run(1, time.Second, 30),
		run(1, time.Second, 31), run(2, 500*time.Millisecond, 60),
	}}
	var out bytes.Buffer
	rep.printSubscriptions(&out)
	for _, want := range []string{
		"one, both subscriptions  2000 (2000–2000)",
		"two, one a stream        4000 (1000–4000)",
		"msgs/s 0.50× (target >= 0.95), peak RSS 0.50× (target <= 0.6)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
	var anomalies bytes.Buffer
	if n := rep.subscriptionsAnomalies(&anomalies); n != 0 {
		t.Errorf("%d anomalies in clean drains: %s", n, anomalies.String())
	}
	rep.subs[0].requests++ // a message delivered twice
	if n := rep.subscriptionsAnomalies(&anomalies); n != 1 || !strings.Contains(anomalies.String(), "1 duplicate requests") {
		t.Errorf("a duplicate request: %d anomalies: %s", n, anomalies.String())
	}
}
