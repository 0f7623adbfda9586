package proxy_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
	"github.com/courierhq/courier/proxy"
)

// A message with thousands of header values HTTP cannot carry is
// delivered without them, and the log says so once per reason, not once
// per value: a publisher cannot flood courier's log.
func TestDroppedHeadersLoggedOncePerReason(t *testing.T) {
	e := setup(t)
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	m := nats.NewMsg("s.flood")
	for i := range 2000 {
		m.Header.Add(fmt.Sprintf("X-Bad-%d", i%50), "a\x7fb")
	}
	m.Header.Add("Courier-Attempt", "9") // reserved: another reason
	m.Data = []byte("x")
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	e.runWith(t, nil, proxy.Options{Logger: log})
	poll.Until(t, 10*time.Second, "the message delivered", func() bool { return e.calls.Load() == 1 && e.settled(t) })
	lines := strings.Count(logs.String(), "headers not passed to the app")
	if lines != 2 {
		t.Errorf("%d log lines for the dropped headers, want 2 (one per reason):\n%s", lines, logs.String())
	}
	if !strings.Contains(logs.String(), "values=2000") || !strings.Contains(logs.String(), "more_headers=42") {
		t.Errorf("the line does not count the values and the names left out:\n%s", logs.String())
	}
	if got := counter(t, e.reg, "courier_dropped_headers_total", ""); got != 2001 {
		t.Errorf("courier_dropped_headers_total = %v, want 2001 (every value)", got)
	}
}
