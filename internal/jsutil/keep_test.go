package jsutil_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
)

func TestUnsuitable(t *testing.T) {
	good := jetstream.StreamConfig{Name: "KEEP", Subjects: []string{"k"}, Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage}
	all := jsutil.Keeping{What: "letters", Acked: true, WithoutInterest: true}
	tests := []struct {
		name   string
		change func(*jetstream.StreamConfig)
		k      jsutil.Keeping
		want   []string // each in the error, in order; none: no error
	}{
		{name: "limits and file", k: all},
		{name: "work queue", change: func(c *jetstream.StreamConfig) { c.Retention = jetstream.WorkQueuePolicy }, k: all},
		{name: "interest", change: func(c *jetstream.StreamConfig) { c.Retention = jetstream.InterestPolicy }, k: all,
			want: []string{`stream "KEEP" uses interest retention`, "(use a stream with limits retention)"}},
		{name: "interest, read by the caller", change: func(c *jetstream.StreamConfig) { c.Retention = jetstream.InterestPolicy }, k: jsutil.Keeping{What: "letters"}},
		{name: "memory", change: func(c *jetstream.StreamConfig) { c.Storage = jetstream.MemoryStorage }, k: jsutil.Keeping{What: "letters"},
			want: []string{`stream "KEEP" uses memory storage, which loses letters when the server restarts`, "(use a stream with file storage;"}},
		{name: "no ack", change: func(c *jetstream.StreamConfig) { c.NoAck = true }, k: all,
			want: []string{`stream "KEEP" has no_ack set`, "(set no_ack to false)"}},
		{name: "no ack, nothing published", change: func(c *jetstream.StreamConfig) { c.NoAck = true }, k: jsutil.Keeping{What: "letters"}},
		{name: "sealed", change: func(c *jetstream.StreamConfig) { c.Sealed = true }, k: jsutil.Keeping{},
			want: []string{`stream "KEEP" is sealed`, "(capture the subject in another stream)"}},
		{name: "all at once", k: all, change: func(c *jetstream.StreamConfig) {
			c.Retention, c.Storage, c.NoAck, c.Sealed = jetstream.InterestPolicy, jetstream.MemoryStorage, true, true
		}, want: []string{`stream "KEEP" uses interest retention`, "; it uses memory storage", "; it has no_ack set", "; it is sealed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			if tt.change != nil {
				tt.change(&cfg)
			}
			err := jsutil.Unsuitable(cfg, tt.k)
			if len(tt.want) == 0 {
				if err != nil {
					t.Errorf("Unsuitable: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Unsuitable = nil, want %q", tt.want)
			}
			rest := err.Error()
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("Unsuitable = %q, want %q in order", err, tt.want)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}
