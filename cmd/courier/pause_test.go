package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
)

// courier pause stops every courier of the durable at once; a courier that
// restarts keeps the pause (updating the consumer never clears it); status
// shows it; resume delivers what waited.
func TestPauseSeenByReplicasAndKeptThroughRestart(t *testing.T) {
	h := newHarness(t)
	var calls atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) }))
	t.Cleanup(app.Close)
	envA := h.env(app.URL, "COURIER_ACK_WAIT=1s")
	envB := h.env(app.URL, "COURIER_ACK_WAIT=1s", "COURIER_DEDUP_DIR="+t.TempDir())
	a, b := start(t, envA), start(t, envB)
	adminA, adminB := adminAddr(t, a), adminAddr(t, b)
	poll.Until(t, 10*time.Second, "both ready", func() bool {
		ca, _ := get(t, "http://"+adminA+"/readyz")
		cb, _ := get(t, "http://"+adminB+"/readyz")
		return ca == 200 && cb == 200
	})

	cli := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := run(context.Background(), args, envA, &out, io.Discard); err != nil {
			t.Fatalf("courier %s: %v", strings.Join(args, " "), err)
		}
		return out.String()
	}
	if out := cli("pause", "--for", "1h"); !strings.Contains(out, "paused ORDERS/courier until") {
		t.Fatalf("pause said %q", out)
	}
	for _, admin := range []string{adminA, adminB} {
		poll.Until(t, 10*time.Second, "readiness to say paused on "+admin, func() bool {
			code, body := get(t, "http://"+admin+"/readyz")
			return code == http.StatusServiceUnavailable && strings.Contains(body, "consumer paused")
		})
	}
	publishN(h, "paused", 10)
	// A restart updates the consumer: the pause must survive it.
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	b = start(t, envB)
	adminB = adminAddr(t, b)
	poll.Until(t, 10*time.Second, "the restarted courier to say paused", func() bool {
		code, body := get(t, "http://"+adminB+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "consumer paused")
	})
	time.Sleep(500 * time.Millisecond)
	if got := calls.Load(); got != 0 {
		t.Fatalf("%d messages delivered while paused", got)
	}
	if out := cli("status"); !strings.Contains(out, "paused") || !strings.Contains(out, "until") || !strings.Contains(out, "pending") {
		t.Errorf("status: %q", out)
	}
	if out := cli("resume"); !strings.Contains(out, "resumed") {
		t.Fatalf("resume said %q", out)
	}
	poll.Until(t, 10*time.Second, "delivery after resume", func() bool { return calls.Load() == 10 })
}

func TestPauseEnd(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		forD  time.Duration
		until string
		want  time.Time
		bad   bool
	}{
		{forD: time.Hour, want: now.Add(time.Hour)},
		{until: "2026-12-01T08:00:00Z", want: time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)},
		{want: now.Add(365 * 24 * time.Hour)},
		{forD: time.Hour, until: "2026-12-01T08:00:00Z", bad: true},
		{until: "tomorrow", bad: true},
		{until: "2026-11-29T08:00:00Z", bad: true},
		{forD: -time.Minute, bad: true},
	} {
		got, err := pauseEnd(tc.forD, tc.until, now)
		if (err != nil) != tc.bad || (!tc.bad && !got.Equal(tc.want)) {
			t.Errorf("pauseEnd(%v, %q) = %v, %v; want %v (bad %v)", tc.forD, tc.until, got, err, tc.want, tc.bad)
		}
	}
}

// A courier that starts updates its durable but keeps the settings an
// operator set that courier does not own (here a pull limit): a restart must
// not silently remove them.
func TestStartKeepsOperatorsConsumerSettings(t *testing.T) {
	h := newHarness(t)
	app := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(app.Close)
	env := h.env(app.URL)
	c := start(t, env)
	poll.Until(t, 10*time.Second, "ready", func() bool { code, _ := get(t, "http://"+adminAddr(t, c)+"/readyz"); return code == 200 })
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cons, err := h.js.Consumer(ctx, "ORDERS", "courier")
	if err != nil {
		t.Fatal(err)
	}
	cfg := cons.CachedInfo().Config
	cfg.MaxRequestBatch, cfg.Metadata = 3, map[string]string{"team": "payments"}
	if _, err := h.js.UpdateConsumer(ctx, "ORDERS", cfg); err != nil {
		t.Fatal(err)
	}
	c = start(t, env)
	poll.Until(t, 10*time.Second, "ready again", func() bool { code, _ := get(t, "http://"+adminAddr(t, c)+"/readyz"); return code == 200 })
	info, err := h.js.Consumer(ctx, "ORDERS", "courier")
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().Config; got.MaxRequestBatch != 3 || got.Metadata["team"] != "payments" {
		t.Errorf("after a restart the consumer has MaxRequestBatch %d, metadata %v: the operator's settings were removed", got.MaxRequestBatch, got.Metadata)
	}
	publishN(h, "limited", 10)
	poll.Until(t, 10*time.Second, "delivery within the limit", func() bool {
		i, err := info.Info(ctx)
		return err == nil && i.NumPending == 0 && i.NumAckPending == 0
	})
}
