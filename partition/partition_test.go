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

// Durables whose plain work stream names are one (consumers x and X of
// ORDERS: names are upper-cased; stream A_B with consumer C and stream A
// with B_C) each get a work stream of their own: the first to start has the
// plain name, the second that name and a hash, and each finds its own again
// (Ensure after a restart, Find for the commands). Before, the second
// shared the first's work stream, and the server refused its partitions'
// consumers (x and X), or it was refused as partitioning otherwise, told to
// delete the first's (A_B/C and A/B_C). A work stream of an older courier,
// which records no owner, keeps its name.
func TestWorkStreamsOfCollidingDurables(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	sources := map[string]jetstream.Stream{}
	for name, subj := range map[string]string{"ORDERS": "orders", "A_B": "ab", "A": "a"} {
		src, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj + ".>"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, subj+".k1.e", []byte(name)); err != nil {
			t.Fatal(err)
		}
		sources[name] = src
	}
	ensure := func(t *testing.T, stream, consumer string) string {
		t.Helper()
		d, err := Ensure(ctx, js, sources[stream], EnsureOptions{Consumer: consumer, Token: 2, Partitions: 2,
			Template: jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy}})
		if err != nil {
			t.Fatalf("Ensure of consumer %s on %s: %v", consumer, stream, err)
		}
		return d.Work.CachedInfo().Config.Name
	}
	type durable struct{ stream, consumer string }
	for _, pair := range [][2]durable{{{"ORDERS", "x"}, {"ORDERS", "X"}}, {{"A_B", "C"}, {"A", "B_C"}}} {
		first, second := pair[0], pair[1]
		t.Run(first.stream+"/"+first.consumer+" and "+second.stream+"/"+second.consumer, func(t *testing.T) {
			if StreamName(first.stream, first.consumer) != StreamName(second.stream, second.consumer) {
				t.Fatal("the plain names no longer collide: pick two that do")
			}
			names := map[durable]string{}
			for _, d := range pair {
				names[d] = ensure(t, d.stream, d.consumer)
			}
			if names[first] != StreamName(first.stream, first.consumer) || names[second] == names[first] {
				t.Errorf("work streams %v: want the first the plain name, the second one of its own", names)
			}
			for _, d := range pair {
				if again := ensure(t, d.stream, d.consumer); again != names[d] {
					t.Errorf("consumer %s on %s: work stream %s after a restart, was %s", d.consumer, d.stream, again, names[d])
				}
				found, err := Find(ctx, js, d.stream, d.consumer)
				if err != nil || found == nil {
					t.Fatalf("Find of consumer %s on %s: %v, %v", d.consumer, d.stream, found, err)
				}
				cfg := found.Work.CachedInfo().Config
				if cfg.Name != names[d] || len(cfg.Sources) != 1 || cfg.Sources[0].Name != d.stream || len(found.Consumers) != 2 {
					t.Errorf("Find of consumer %s on %s: stream %s sourcing %v with %d consumers; want %s sourcing %s with 2",
						d.consumer, d.stream, cfg.Name, cfg.Sources, len(found.Consumers), names[d], d.stream)
				}
				for _, c := range found.Consumers {
					if name := c.CachedInfo().Name; !strings.HasPrefix(name, d.consumer+"-p") {
						t.Errorf("Find of consumer %s on %s: partition consumer %s", d.consumer, d.stream, name)
					}
				}
			}
		})
	}

	t.Run("made before owners were recorded", func(t *testing.T) {
		cfg, err := StreamConfig(StreamOptions{Source: sources["ORDERS"].CachedInfo().Config, Consumer: "old", Token: 2, Partitions: 2})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Metadata = map[string]string{metaPartitions: "2", metaKeyToken: "2"}
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		if got := ensure(t, "ORDERS", "OLD"); got == cfg.Name {
			t.Errorf("consumer OLD got the work stream of consumer old, %s", got)
		}
		if got := ensure(t, "ORDERS", "old"); got != cfg.Name {
			t.Errorf("consumer old: work stream %s, want its own from before, %s", got, cfg.Name)
		}
	})
}
