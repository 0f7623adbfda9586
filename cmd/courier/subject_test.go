package main

import (
	"strconv"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
)

// A subject HTTP cannot carry in a header value (another client may publish
// control characters NATS allows in a subject) must not look like an app
// outage: the message reaches the app, and the app is not marked down.
func TestSubjectHTTPCannotCarryIsNotAnOutage(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	h.rawPublish("orders.a\x01b", []string{"X-A: 1"}, "odd")
	h.publish("orders.ok", "fine", nil)
	c := start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "both messages settled", func() bool { return h.settled("courier") })
	if a.count() != 2 {
		t.Fatalf("app saw %d requests, want 2", a.count())
	}
	var subjects []string
	for _, r := range a.requests() {
		subjects = append(subjects, r.Header.Get("Courier-Subject"))
	}
	want := strconv.Quote("orders.a\x01b")
	if subjects[0] != want && subjects[1] != want {
		t.Errorf("Courier-Subject values %q, want one to be %s", subjects, want)
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
}
