package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestRolloutWaitsSortsByWhenPublished(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	// Two messages of each entity: the first round at rest (0.1 s), the
	// second during the event (1.1 s); one more after it, never called.
	n := 2*rolloutEntities + 1
	sent := make([]time.Time, n)
	tl := newTally(1, n)
	for id := range 2 * rolloutEntities {
		sent[id] = at(0.1 + float64(id/rolloutEntities))
		tl.seen[id].Store(true)
		tl.lat[id].Store(int64(time.Millisecond))
	}
	sent[n-1] = at(2.5)
	// Entity 0's first message waited 3 s, its second 1 s: the second
	// reached the app first.
	tl.lat[0].Store(int64(3 * time.Second))
	tl.lat[rolloutEntities].Store(int64(time.Second))

	w, disorder := rolloutWaits(tl, sent, at(0), at(1), at(2), at(3))
	if w[0].n != rolloutEntities || w[0].max != 3*time.Second || w[0].p50 != time.Millisecond {
		t.Errorf("before = %+v, want %d messages, p50 1ms, max 3s", w[0], rolloutEntities)
	}
	if w[1].n != rolloutEntities || w[1].max != time.Second {
		t.Errorf("during = %+v, want %d messages, max 1s", w[1], rolloutEntities)
	}
	if w[2].n != 0 || w[2].lost != 1 {
		t.Errorf("after = %+v, want one lost", w[2])
	}
	if disorder != 1 {
		t.Errorf("disorder = %d, want 1", disorder)
	}
}

func TestRolloutAnomaliesCountDuplicatesOnlyAfterACleanStop(t *testing.T) {
	rep := &report{rollouts: []rolloutResult{
		{name: "rollout: kill, partitions", event: crash, dups: 3},
		{name: "rollout: rolling update, partitions", event: rollingUpdate, dups: 2},
		{name: "rollout: rolling update, single active", event: rollingUpdate, warns: 1, firstWarn: "c0 WARN x"},
		{name: "rollout: kill, single active", event: crash, err: errors.New("1 messages never reached the app")},
	}}
	var out bytes.Buffer
	if n := rep.rolloutAnomalies(&out); n != 3 {
		t.Errorf("%d runs named, want 3:\n%s", n, out.String())
	}
	for _, want := range []string{
		"rolling update, partitions: 2 duplicate requests from clean stops",
		"rolling update, single active: 1 logged at warn or error, the first: c0 WARN x",
		"kill, single active: 1 messages never reached the app",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the anomalies lack %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "kill, partitions") {
		t.Errorf("a kill's duplicates named as an anomaly:\n%s", out.String())
	}
}
