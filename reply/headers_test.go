package reply

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/internal/metricstest"
)

// A request whose sender filled it with values HTTP cannot carry makes one
// log line per reason they were dropped, not one per value: thousands of
// them cannot flood courier's log. Each value is still counted.
func TestDroppedHeadersLoggedOncePerReason(t *testing.T) {
	h := newHarness(t, 0)
	a := app(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	svc := h.start(a.URL, nil)

	hdr := nats.Header{"Courier-Stream": {"forged"}, "Courier-Attempt": {"9"}}
	for i := range 300 {
		hdr["X-Bad-"+strconv.Itoa(i)] = []string{"a\x01b", "c\x02d"}
	}
	m := h.request(hdr, []byte("x"))
	checkReply(t, m, "200", "")

	logs := svc.logs.String()
	if n := strings.Count(logs, "headers not passed to the app"); n != 2 {
		t.Errorf("%d log lines of dropped headers, want 2 (one per reason):\n%.2000s", n, logs)
	}
	if n := strings.Count(logs, "\n"); n > 10 {
		t.Errorf("%d log lines for one request", n)
	}
	for _, want := range []string{`"reason":"value not valid in HTTP"`, `"values":600`, `"more_headers":292`, `"reason":"reserved for courier or HTTP"`, `"headers":"Courier-Attempt,Courier-Stream"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%.2000s", want, logs)
		}
	}
	if n := metricstest.Value(t, svc.reg, "courier_reply_dropped_headers_total"); n != 602 {
		t.Errorf("dropped headers = %v, want 602", n)
	}
}

// A reply carries the app's answer headers but Set-Cookie: no NATS client
// keeps cookies, and a session a web framework opens on every request
// would travel on NATS as a credential.
func TestReplyDropsSetCookie(t *testing.T) {
	h := newHarness(t, 0)
	a := app(t, func(w http.ResponseWriter, _ *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "s3cret"})
		w.Header().Set("X-Answer", "yes")
		w.WriteHeader(http.StatusOK)
	})
	h.start(a.URL, nil)
	m := h.request(nil, []byte("x"))
	if v := m.Header.Values("Set-Cookie"); len(v) != 0 {
		t.Errorf("reply carries Set-Cookie %q", v)
	}
	if m.Header.Get("X-Answer") != "yes" {
		t.Errorf("reply headers = %v, want the app's X-Answer", m.Header)
	}
}
