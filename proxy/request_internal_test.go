package proxy

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// headerMsg is a message with the given headers.
type headerMsg struct {
	fakeMsg
	h nats.Header
}

func (m *headerMsg) Headers() nats.Header { return m.h }

// The message's Content-Type reaches the app whatever case its publisher
// wrote the name in (NATS header names are case-sensitive, HTTP's are not).
func TestBuildHeadersContentType(t *testing.T) {
	meta := &jetstream.MsgMetadata{Stream: "S", NumDelivered: 1, Timestamp: time.Now()}
	for _, tc := range []struct {
		name string
		h    nats.Header
		want string
	}{
		{"canonical", nats.Header{"Content-Type": {"application/json"}}, "application/json"},
		{"lower case", nats.Header{"content-type": {"text/csv"}}, "text/csv"},
		{"upper case", nats.Header{"CONTENT-TYPE": {"text/plain"}}, "text/plain"},
		{"none", nats.Header{}, "application/octet-stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := BuildHeaders(&headerMsg{h: tc.h}, meta, "k")
			if got := h.Values("Content-Type"); len(got) != 1 || got[0] != tc.want {
				t.Errorf("Content-Type %q, want %q", got, tc.want)
			}
		})
	}
}
