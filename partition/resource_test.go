package partition

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
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
		if h := "ORDERS 7 x " + src.SubjectTransforms[0].Destination + " orders.a"; generationOf(h) != gen {
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
