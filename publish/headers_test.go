package publish

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestMessageHeaders: what of a request's headers a message keeps, and how
// its Nats-* headers are spelt.
func TestMessageHeaders(t *testing.T) {
	src := http.Header{}
	for k, v := range map[string]string{
		"Connection": "keep-alive, X-Per-Hop", "X-Per-Hop": "1", "Keep-Alive": "timeout=5", "Te": "trailers",
		"Accept": "*/*", "Accept-Encoding": "gzip", "User-Agent": "curl/8", "Sec-Fetch-Mode": "cors",
		"Authorization": "Bearer t", "Expect": "100-continue", "Content-Length": "3",
		"Content-Type": "text/plain", "X-Order": "7",
		"Nats-Ttl": "1m", "Nats-Expected-Last-Subject-Sequence": "4",
		"Tracestate": "a=1", "Baggage": "k=v",
	} {
		src.Set(k, v)
	}
	h, generated, err := messageHeaders(src)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"Content-Type": "text/plain", "X-Order": "7", "Nats-TTL": "1m", "Nats-Expected-Last-Subject-Sequence": "4",
		"tracestate": "a=1", "baggage": "k=v",
	}
	if !generated || !strings.HasPrefix(h.Get(nats.MsgIdHdr), generatedIDPrefix) {
		t.Errorf("generated %v, Nats-Msg-Id %q", generated, h.Get(nats.MsgIdHdr))
	}
	delete(h, nats.MsgIdHdr)
	for k, v := range want {
		if got := h[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if len(h) != len(want) {
		t.Errorf("headers %v, want only %v", h, want)
	}

	// The app's own Nats-Msg-Id, alone, is the id.
	h, generated, err = messageHeaders(http.Header{"Nats-Msg-Id": {"m-1"}})
	if err != nil || generated || h.Get(nats.MsgIdHdr) != "m-1" {
		t.Errorf("Nats-Msg-Id alone: %v %v %v", h, generated, err)
	}
	// The same id twice is one id.
	if h, _, err = messageHeaders(http.Header{"Idempotency-Key": {"m-1"}, "Nats-Msg-Id": {"m-1"}}); err != nil || h.Get(nats.MsgIdHdr) != "m-1" {
		t.Errorf("the same id twice: %v %v", h, err)
	}
	for _, bad := range []http.Header{
		{"Nats-Batch-Id": {"b"}},
		{"Nats-Expected-Something-New": {"1"}},
		{"Idempotency-Key": {"a", "b"}},
		{"Idempotency-Key": {""}},
		// What NATS cannot carry as it is (nats.go's isHeaderKeyValid,
		// writeHeaderValue).
		{"X Tenant": {"7"}},
		{"": {"7"}},
		{"X-Tenant:": {"7"}},
		{"X-\u00e9": {"7"}},
		{"X-Note": {"a\r\nb"}},
		{"X-Note": {"fine", "a\nb"}},
		{"X-Note": {"a\rb"}},
		{"Idempotency-Key": {"k\r\n"}},
	} {
		var ref *refusal
		if _, _, err := messageHeaders(bad); !errors.As(err, &ref) || ref.status != http.StatusBadRequest {
			t.Errorf("%v: %v, want a 400", bad, err)
		}
	}
}

// TestMessageHeadersCarried: what NATS carries as it is passes, UTF-8 in
// values and an HTTP token's every character in names included.
func TestMessageHeadersCarried(t *testing.T) {
	src := http.Header{"X-!#$%&'*+-.^_`|~09az": {"v"}, "X-Utf8": {"caf\u00e9 \t tab"}}
	h, _, err := messageHeaders(src)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range src {
		if got := h[k]; len(got) != 1 || got[0] != v[0] {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
}
