package ordermark

import (
	"context"
	"fmt"
	"testing"

	"github.com/courierhq/courier/internal/natstest"
)

// Each partition's marks are its own: a mark of one is not seen by
// another, and unmarking removes it.
func TestPartitionMarks(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	st, err := OpenPartitions(ctx, js, "S", "c", 1)
	if err != nil {
		t.Fatal(err)
	}
	p0, p1 := st.Partition(0), st.Partition(1)
	if got, err := p0.Marks(ctx); err != nil || len(got) != 0 {
		t.Fatalf("empty partition: %v, %v", got, err)
	}
	for _, m := range []struct {
		s   *Store
		key string
		seq uint64
	}{{p0, "k.a", 7}, {p0, "k b", 9}, {p1, "k.a", 3}} {
		if err := m.s.Mark(ctx, m.key, m.seq); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := p0.Marks(ctx); err != nil || fmt.Sprint(got) != "map[k b:9 k.a:7]" {
		t.Errorf("partition 0 marks %v, %v", got, err)
	}
	if err := p1.Unmark(ctx, "k.a"); err != nil {
		t.Fatal(err)
	}
	if got, err := p1.Marks(ctx); err != nil || len(got) != 0 {
		t.Errorf("partition 1 marks %v after unmarking, %v", got, err)
	}
	if got, _ := p0.Marks(ctx); len(got) != 2 {
		t.Errorf("partition 0 marks %v after partition 1's unmark", got)
	}
}
