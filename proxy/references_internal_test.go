package proxy

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

type sizedMsg struct {
	data []byte
	h    nats.Header
}

func (m sizedMsg) Data() []byte         { return m.data }
func (m sizedMsg) Headers() nats.Header { return m.h }

// Only a message within referenceMargin of the server's limit can have had
// a reference dead letter; its headers count.
func TestMayBeReference(t *testing.T) {
	const limit = 1 << 20
	for _, tc := range []struct {
		name string
		m    sizedMsg
		want bool
	}{
		{"small", sizedMsg{data: make([]byte, 256)}, false},
		{"just below the margin", sizedMsg{data: make([]byte, limit-referenceMargin-1)}, false},
		{"at the margin", sizedMsg{data: make([]byte, limit-referenceMargin)}, true},
		{"large headers, small body", sizedMsg{data: make([]byte, 10),
			h: nats.Header{"X-Big": {strings.Repeat("h", limit-referenceMargin)}}}, true},
	} {
		if got := mayBeReference(tc.m, limit); got != tc.want {
			t.Errorf("%s: mayBeReference = %v, want %v", tc.name, got, tc.want)
		}
	}
	if !mayBeReference(sizedMsg{data: make([]byte, 10)}, 8192) {
		t.Error("a server limit below the margin: every message may be one")
	}
}
