package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
)

// With the dedup directory removed under a running courier (a volume gone),
// SIGTERM still ends it within the grace period plus a few seconds, saying
// what it could not close.
func TestShutdownWithStoreDirectoryGone(t *testing.T) {
	h := newHarness(t)
	app := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(app.Close)
	c := start(t, h.env(app.URL, "COURIER_SHUTDOWN_GRACE=1s"))
	publishN(h, "before", 5)
	poll.Until(t, 10*time.Second, "delivered", func() bool { return h.settled("courier") })
	if err := os.RemoveAll(h.dir); err != nil {
		t.Fatal(err)
	}
	publishN(h, "after", 5) // keys recorded into a directory that is gone
	time.Sleep(200 * time.Millisecond)
	began := time.Now()
	if err := c.stop(); err != nil {
		t.Logf("run returned %v", err)
	}
	if took := time.Since(began); took > 1*time.Second+10*time.Second {
		t.Errorf("shutdown took %s with the store's directory gone", took.Round(time.Millisecond))
	}
	if logs := c.logs.String(); !strings.Contains(logs, "closing the dedup store") {
		t.Errorf("the logs do not say what could not be closed:\n%s", logs)
	}
}
