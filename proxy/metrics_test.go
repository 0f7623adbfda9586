package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// courier_app_available reads 1 from start-up for an app not known to be
// unavailable (no health URL: nothing says it is down), before any request
// or outage, and 0 from start-up while a health URL has not answered 2xx.
func TestAppAvailableFromStart(t *testing.T) {
	e := setup(t)
	r, _ := e.runWith(t, openStore(t), proxy.Options{})
	if got := counter(t, e.reg, "courier_app_available", ""); got != 1 {
		t.Errorf("courier_app_available = %v at start-up without a health URL, want 1", got)
	}
	poll.Until(t, 10*time.Second, "courier ready", func() bool { return r.Ready() == nil })
	if got := counter(t, e.reg, "courier_app_available", ""); got != 1 {
		t.Errorf("courier_app_available = %v once ready, want 1", got)
	}

	sick := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(sick.Close)
	e2 := setup(t)
	_, _ = e2.runWith(t, openStore(t), proxy.Options{AppHealthURL: sick.URL})
	if got := counter(t, e2.reg, "courier_app_available", ""); got != 0 {
		t.Errorf("courier_app_available = %v while the health URL fails, want 0", got)
	}
}
