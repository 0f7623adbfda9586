package partition

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natshdr"
	"github.com/courierhq/courier/internal/poll"
)

// Each generation of a work stream's source writes the partition count with
// one more leading zero: Generation reads it back, and a work stream at any
// generation partitions as the one StreamConfig makes.
func TestGenerations(t *testing.T) {
	want, err := StreamConfig(StreamOptions{Source: jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Retention: jetstream.LimitsPolicy},
		Consumer: "courier", Token: 2, Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	if g := Generation(want); g != 0 {
		t.Fatalf("a new work stream is at generation %d", g)
	}
	for gen := 1; gen <= 3; gen++ {
		have := want
		src := *want.Sources[0]
		src.SubjectTransforms = atGeneration(src.SubjectTransforms, gen)
		have.Sources = []*jetstream.StreamSource{&src}
		if g := Generation(have); g != gen {
			t.Errorf("generation %d read back as %d (%v)", gen, g, src.SubjectTransforms)
		}
		if !samePartitioning(have, want) {
			t.Errorf("generation %d does not partition as generation 0: %v", gen, src.SubjectTransforms)
		}
		h := nats.Header{natshdr.SourceHeader: {"ORDERS 7 x " + src.SubjectTransforms[0].Destination + " orders.a"}}
		if generationOf(h) != gen {
			t.Errorf("generationOf(%q) = %d, want %d", h, generationOf(h), gen)
		}
	}
	other := want
	src := *want.Sources[0]
	src.SubjectTransforms = append([]jetstream.SubjectTransformConfig(nil), src.SubjectTransforms...)
	src.SubjectTransforms[0].Destination = "{{partition(8,2)}}.x"
	other.Sources = []*jetstream.StreamSource{&src}
	if samePartitioning(other, want) {
		t.Error("another partition count taken for the same partitioning")
	}
}

// Confirm accepts what Resource did as the work stream shows it, and
// refuses a record that says otherwise: no generation (written before
// records named one), another generation (a forged one, or an earlier
// rewind's once another re-sourced the work stream), another point, a
// sequence or a time the work stream has not come to, another stream, and
// any once the work stream cannot be read.
func TestConfirm(t *testing.T) {
	js, src := ordersStream(t, 5)
	ctx := context.Background()
	d, err := Ensure(ctx, js, src, EnsureOptions{Consumer: "c", Token: 2, Partitions: 2,
		Template: jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy}})
	if err != nil {
		t.Fatal(err)
	}
	msgs := func() uint64 {
		info, err := d.Work.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	poll.Until(t, 5*time.Second, "the work stream's copies", func() bool { return msgs() == 5 })
	res, err := d.Resource(ctx, js, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Confirm(ctx, "ORDERS", 3, res); err != nil {
		t.Fatalf("Confirm of what Resource did: %v", err)
	}
	with := func(f func(*Resourced)) Resourced { r := res; f(&r); return r }
	for _, tc := range []struct {
		name   string
		stream string
		from   uint64
		r      Resourced
		want   string
	}{
		{"no generation", "ORDERS", 3, with(func(r *Resourced) { r.Generation = 0 }), "names no generation"},
		{"a later generation", "ORDERS", 3, with(func(r *Resourced) { r.Generation++ }), "names generation 2 of the work stream's source, which is at generation 1"},
		{"another point", "ORDERS", 1, res, "starts at sequence 1 of ORDERS, and the work stream's source at 3"},
		{"past the last sequence", "ORDERS", 3, with(func(r *Resourced) { r.Last += 1000 }), "past its last"},
		{"after the last message", "ORDERS", 3, with(func(r *Resourced) { r.LastAt = r.LastAt.Add(time.Hour) }), "after its last message"},
		{"another stream", "OTHER", 3, res, "it is of stream OTHER"},
	} {
		if err := d.Confirm(ctx, tc.stream, tc.from, tc.r); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Confirm = %v, want an error saying %q", tc.name, err, tc.want)
		}
	}

	again, err := d.Resource(ctx, js, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Confirm(ctx, "ORDERS", 3, res); err == nil || !strings.Contains(err.Error(), "which is at generation 2") {
		t.Errorf("the first rewind's, after a second: Confirm = %v, want a refusal naming generation 2", err)
	}
	if err := d.Confirm(ctx, "ORDERS", 4, again); err != nil {
		t.Errorf("the second rewind's: %v", err)
	}

	if err := js.DeleteStream(ctx, d.Work.CachedInfo().Config.Name); err != nil {
		t.Fatal(err)
	}
	if err := d.Confirm(ctx, "ORDERS", 4, again); err == nil || !strings.Contains(err.Error(), "reading the partitions' work stream") {
		t.Errorf("with no work stream: Confirm = %v, want a refusal saying the read failed", err)
	}
}
