package giveup

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestGiveUpStripServerHeaders(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)
	stamp := at.Format(time.RFC3339Nano)
	tests := []struct {
		name string
		in   nats.Header
		want nats.Header
	}{
		{name: "none", in: nil, want: nil},
		{
			name: "direct get of a message without headers",
			in:   nats.Header{"Nats-Stream": {"ORDERS"}, "Nats-Subject": {"orders.x"}, "Nats-Sequence": {"7"}, "Nats-Time-Stamp": {stamp}},
			want: nil,
		},
		{
			name: "direct get keeps the publisher's headers",
			in: nats.Header{"X-A": {"1", "2"}, "Nats-Msg-Id": {"id"}, "Nats-Stream": {"ORDERS"}, "Nats-Subject": {"orders.x"},
				"Nats-Sequence": {"7"}, "Nats-Time-Stamp": {stamp}},
			want: nats.Header{"X-A": {"1", "2"}, "Nats-Msg-Id": {"id"}},
		},
		{
			name: "a republished original keeps its own",
			in: nats.Header{"Nats-Stream": {"UPSTREAM", "ORDERS"}, "Nats-Subject": {"up.x", "orders.x"},
				"Nats-Sequence": {"99", "7"}, "Nats-Time-Stamp": {"2020-01-01T00:00:00Z", stamp}},
			want: nats.Header{"Nats-Stream": {"UPSTREAM"}, "Nats-Subject": {"up.x"}, "Nats-Sequence": {"99"}, "Nats-Time-Stamp": {"2020-01-01T00:00:00Z"}},
		},
		{
			name: "stored headers only (no direct get)",
			in:   nats.Header{"Nats-Stream": {"UPSTREAM"}, "X-A": {"1"}},
			want: nats.Header{"Nats-Stream": {"UPSTREAM"}, "X-A": {"1"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &jetstream.RawStreamMsg{Subject: "orders.x", Sequence: 7, Header: tt.in, Time: at}
			before := maps.Clone(tt.in)
			got := stripServerHeaders(m, "ORDERS")
			if !maps.EqualFunc(got, tt.want, slices.Equal) {
				t.Errorf("stripServerHeaders = %v, want %v", got, tt.want)
			}
			if !maps.EqualFunc(m.Header, before, slices.Equal) {
				t.Errorf("stripServerHeaders modified its input: %v", m.Header)
			}
		})
	}
}
