package proxy_test

import (
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
	"github.com/courierhq/courier/proxy"
)

// At the default level there is no line per delivered message: a summary of
// counts every interval in which there was traffic (none while idle), and
// one at shutdown.
func TestSummaryInsteadOfALinePerMessage(t *testing.T) {
	e := setup(t)
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	e.publish(t, 20, []byte("x"))
	_, stop := e.runWith(t, nil, proxy.Options{Logger: log, SummaryInterval: 100 * time.Millisecond})
	delivered := func() int { // over every periodic summary so far
		n := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if !strings.Contains(line, "msg=summary ") {
				continue
			}
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, "delivered="); ok {
					k, _ := strconv.Atoi(v)
					n += k
				}
			}
		}
		return n
	}
	poll.Until(t, 10*time.Second, "summaries of the 20 deliveries", func() bool { return delivered() == 20 })
	idle := strings.Count(logs.String(), "msg=summary ")
	time.Sleep(400 * time.Millisecond) // four intervals without traffic
	if n := strings.Count(logs.String(), "msg=summary "); n != idle {
		t.Errorf("%d summaries logged while idle", n-idle)
	}
	stop()
	out := logs.String()
	if strings.Contains(out, "msg=delivered") {
		t.Errorf("a line per delivered message at info:\n%s", out)
	}
	if !strings.Contains(out, "summary at shutdown") {
		t.Errorf("no summary at shutdown:\n%s", out)
	}
}
