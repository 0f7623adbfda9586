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

func TestDelayFullJitter(t *testing.T) {
	// rnd returning n-1 shows the ceiling; returning 0 shows the floor.
	top := func(n int64) int64 { return n - 1 }
	for attempt, want := range map[int]time.Duration{
		1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 8 * time.Second, 5: 10 * time.Second, 40: 10 * time.Second,
	} {
		if got := Delay(attempt, time.Second, 10*time.Second, 2, top); got != want {
			t.Errorf("Delay ceiling at attempt %d = %v, want %v", attempt, got, want)
		}
		if got := Delay(attempt, time.Second, 10*time.Second, 2, func(int64) int64 { return 0 }); got != 0 {
			t.Errorf("Delay floor at attempt %d = %v, want 0", attempt, got)
		}
	}
	if got := Delay(3, 100*time.Millisecond, time.Minute, 3, top); got != 900*time.Millisecond {
		t.Errorf("multiplier 3 at attempt 3 = %v, want 900ms", got)
	}
}
