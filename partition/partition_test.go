package partition

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

// The work stream sources the consumed stream with the partition in front
// of each subject; the consumed stream keeps its messages; a second
// EnsureStream finds it; one that partitions otherwise is refused, saying
// how to change it.
func TestEnsureStream(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	src, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"orders.o1.created", "orders.o2.created", "orders.o1.paid", "orders.short"} {
		if _, err := js.Publish(ctx, subj, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := StreamConfig(StreamOptions{Source: src.CachedInfo().Config, Consumer: "c", Token: 2, Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	ws, created, err := EnsureStream(ctx, js, cfg)
	if err != nil || !created {
		t.Fatalf("EnsureStream: created %v, %v", created, err)
	}
	poll.Until(t, 10*time.Second, "the messages sourced", func() bool {
		info, err := ws.Info(ctx)
		return err == nil && info.State.Msgs == 4
	})
	part := map[string]string{}
	for seq := uint64(1); seq <= 4; seq++ {
		m, err := ws.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		p, orig, _ := strings.Cut(m.Subject, ".")
		key := strings.Split(orig, ".")[1]
		if q, ok := part[key]; ok && q != p {
			t.Errorf("key %s in partitions %s and %s", key, q, p)
		}
		part[key] = p
		if !strings.HasPrefix(m.Header.Get("Nats-Stream-Source"), "ORDERS "+strconv.FormatUint(seq, 10)+" ") {
			t.Errorf("message %d: Nats-Stream-Source %q, want the origin and its sequence", seq, m.Header.Get("Nats-Stream-Source"))
		}
	}
	if info, _ := src.Info(ctx); info.State.Msgs != 4 {
		t.Errorf("the consumed stream holds %d messages, want its 4", info.State.Msgs)
	}
	if _, created, err := EnsureStream(ctx, js, cfg); err != nil || created {
		t.Errorf("second EnsureStream: created %v, %v", created, err)
	}
	other, _ := StreamConfig(StreamOptions{Source: src.CachedInfo().Config, Consumer: "c", Token: 2, Partitions: 8})
	if _, _, err := EnsureStream(ctx, js, other); err == nil || !strings.Contains(err.Error(), "nats stream rm "+cfg.Name) {
		t.Errorf("EnsureStream with 8 partitions over 4: %v, want an error saying how to change them", err)
	}
}

func TestStreamConfigRefuses(t *testing.T) {
	for _, tc := range []struct {
		src     jetstream.StreamConfig
		filters []string
		want    string
	}{
		{jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Retention: jetstream.WorkQueuePolicy}, nil, `stream "S" has WorkQueue retention`},
		{jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Retention: jetstream.InterestPolicy}, nil, `stream "S" has Interest retention`},
		{jetstream.StreamConfig{Name: "S", Subjects: []string{"s.eu.*"}}, nil, `"s.eu.*" has "eu" as its token 2`},
		{jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}, []string{"s.x.y"}, `"s.x.y" has "x" as its token 2`},
	} {
		_, err := StreamConfig(StreamOptions{Source: tc.src, Filters: tc.filters, Consumer: "c", Token: 2, Partitions: 4})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %q: %v, want an error saying %q", tc.src.Subjects, tc.filters, err, tc.want)
		}
	}
	cfg, err := StreamConfig(StreamOptions{Source: jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}, Consumer: "c", Token: 2, Partitions: 4,
		StartAt: time.Unix(100, 0)})
	if err != nil || cfg.Sources[0].OptStartTime == nil || !cfg.Sources[0].OptStartTime.Equal(time.Unix(100, 0)) {
		t.Errorf("StartAt: %v, start %v", err, cfg.Sources)
	}
}
