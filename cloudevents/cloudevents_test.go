package cloudevents

import (
	"bytes"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
)

// delivery is the headers courier gives a delivery of subject on stream
// (as proxy.BuildHeaders builds them), plus the message's own.
func delivery(stream, subject string, own map[string]string) http.Header {
	h := http.Header{
		"Idempotency-Key":   {"ORDERS:1700000000000000000:42"},
		"Courier-Attempt":   {"1"},
		"Courier-Subject":   {subject},
		"Courier-Stream":    {stream},
		"Courier-Sequence":  {"42"},
		"Courier-Published": {"2026-11-25T10:11:12.123456789Z"},
		"Content-Type":      {"application/json"},
	}
	for k, v := range own {
		h.Set(k, v)
	}
	return h
}

// readBySDK sends h and body to an httptest app that reads the request
// with the CloudEvents Go SDK, as a Knative or Dapr app's SDK would, and
// returns the event (or the SDK's error).
func readBySDK(t *testing.T, h http.Header, body []byte) (*event.Event, error) {
	t.Helper()
	type read struct {
		ev  *event.Event
		err error
	}
	got := make(chan read, 1)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, err := cehttp.NewEventFromHTTPRequest(r)
		got <- read{ev, err}
	}))
	defer app.Close()
	req, _ := http.NewRequest(http.MethodPost, app.URL, bytes.NewReader(body))
	req.Header = h
	resp, rerr := http.DefaultClient.Do(req)
	if rerr != nil {
		t.Fatal(rerr)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	r := <-got
	if r.err == nil {
		r.err = r.ev.Validate()
	}
	return r.ev, r.err
}

// TestBinaryReadBySDK: a plain message's request, once mapped, is read by
// the CloudEvents SDK as an event with courier's attributes and the body
// as its data, unchanged.
func TestBinaryReadBySDK(t *testing.T) {
	h := delivery("ORDERS", "orders.created.eu", nil)
	body := []byte(`{"order":42}`)
	Binary(h)
	ev, err := readBySDK(t, h, body)
	if err != nil {
		t.Fatalf("the SDK does not read the request as an event: %v", err)
	}
	want := map[string]string{
		"specversion": "1.0", "id": "ORDERS:1700000000000000000:42", "source": "/courier/ORDERS",
		"type": "orders.created.eu", "subject": "orders.created.eu", "datacontenttype": "application/json",
	}
	got := map[string]string{
		"specversion": ev.SpecVersion(), "id": ev.ID(), "source": ev.Source(),
		"type": ev.Type(), "subject": ev.Subject(), "datacontenttype": ev.DataContentType(),
	}
	if !maps.Equal(got, want) {
		t.Errorf("attributes %v, want %v", got, want)
	}
	if wantT := time.Date(2026, 11, 25, 10, 11, 12, 123456789, time.UTC); !ev.Time().Equal(wantT) {
		t.Errorf("time %v, want the stream timestamp %v", ev.Time(), wantT)
	}
	if !bytes.Equal(ev.Data(), body) {
		t.Errorf("data %q, want the body unchanged %q", ev.Data(), body)
	}
}

// TestMessageAttributesKept: a message published as a binary CloudEvent
// keeps its attributes and gets none of courier's; one with only some ce-*
// headers keeps those and gets the rest.
func TestMessageAttributesKept(t *testing.T) {
	own := map[string]string{
		"Ce-Specversion": "1.0", "Ce-Id": "evt-1", "Ce-Source": "https://shop.example/orders",
		"Ce-Type": "com.example.order.created",
	}
	h := delivery("ORDERS", "orders.created", own)
	Binary(h)
	ev, err := readBySDK(t, h, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if ev.ID() != "evt-1" || ev.Source() != "https://shop.example/orders" || ev.Type() != "com.example.order.created" {
		t.Errorf("the message's attributes were replaced: %s", ev)
	}
	if ev.Subject() != "" || !ev.Time().IsZero() {
		t.Errorf("courier added attributes to a message that is an event already: subject %q, time %v", ev.Subject(), ev.Time())
	}

	h = delivery("ORDERS", "orders.created", map[string]string{"ce-type": "com.example.order.created"})
	Binary(h)
	ev, err = readBySDK(t, h, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Type() != "com.example.order.created" || ev.ID() != "ORDERS:1700000000000000000:42" || ev.Subject() != "orders.created" {
		t.Errorf("type %q, id %q, subject %q: want the message's type, courier's id and subject", ev.Type(), ev.ID(), ev.Subject())
	}
}

// TestStructuredUnchanged: a structured CloudEvent (its content type
// application/cloudevents+json) is delivered as it is, and the SDK reads
// the publisher's event from the body.
func TestStructuredUnchanged(t *testing.T) {
	body := []byte(`{"specversion":"1.0","id":"evt-9","source":"/shop","type":"order.paid","data":{"n":1}}`)
	for _, ct := range []string{"application/cloudevents+json", "application/cloudevents+json; charset=utf-8", "Application/CloudEvents-Batch+JSON"} {
		h := delivery("ORDERS", "orders.paid", map[string]string{"Content-Type": ct})
		before := h.Clone()
		Binary(h)
		if !maps.EqualFunc(h, before, func(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }) {
			t.Errorf("%s: headers changed: %v", ct, h)
		}
	}
	h := delivery("ORDERS", "orders.paid", map[string]string{"Content-Type": "application/cloudevents+json"})
	Binary(h)
	ev, err := readBySDK(t, h, body)
	if err != nil {
		t.Fatal(err)
	}
	if ev.ID() != "evt-9" || ev.Type() != "order.paid" || ev.Source() != "/shop" {
		t.Errorf("the SDK read %s, want the publisher's structured event", ev)
	}
}

// TestNotADelivery: requests that are not one message's delivery (a health
// probe, a request/reply call, a batch) get no attributes; mapping twice
// is mapping once; a stream name is escaped into a URI-reference.
func TestNotADelivery(t *testing.T) {
	for name, h := range map[string]http.Header{
		"probe": {},
		"reply": {"Courier-Subject": {"quote.get"}, "Content-Type": {"application/json"}},
		"batch": func() http.Header {
			h := delivery("ORDERS", "orders.x", nil)
			h.Set("Courier-Batch", "3")
			return h
		}(),
	} {
		n := len(h)
		Binary(h)
		if len(h) != n {
			t.Errorf("%s: attributes added: %v", name, h)
		}
	}
	h := delivery("ORDERS", "orders.x", nil)
	Binary(h)
	once := h.Clone()
	Binary(h)
	if len(h) != len(once) || h.Get(HeaderID) != once.Get(HeaderID) {
		t.Errorf("mapping twice changed the headers: %v, then %v", once, h)
	}
	if got := Source("a b%c"); got != "/courier/a%20b%25c" {
		t.Errorf("Source = %q", got)
	}
}
