package ordermark

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/internal/natstest"
)

// Marks read back as written: the head's sequence and, for a retried
// head, when its retry is due (to the millisecond); an unmarked key is
// gone, and a value that is not a mark is skipped.
func TestMarks(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	s, err := Open(ctx, js, "ORDERS", "courier", 1)
	if err != nil {
		t.Fatal(err)
	}
	due := time.UnixMilli(time.Now().Add(time.Minute).UnixMilli())
	for key, m := range map[string]Mark{"a": {Seq: 7}, "b.c/d": {Seq: 9, Due: due}, "gone": {Seq: 3}} {
		if err := s.Mark(ctx, key, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Unmark(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if err := s.Unmark(ctx, "never marked"); err != nil {
		t.Errorf("unmarking a key with no mark: %v", err)
	}
	kv, err := js.KeyValue(ctx, BucketName("ORDERS", "courier"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"x\nbad", "0\nzero", "5 soon\nbad-due", "no key"} {
		if _, err := kv.PutString(ctx, id(v), v); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Marks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["a"] != (Mark{Seq: 7}) || got["b.c/d"].Seq != 9 || !got["b.c/d"].Due.Equal(due) {
		t.Errorf("marks %v, want a at 7 and b.c/d at 9 due %s", got, due)
	}
}

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
		if err := m.s.Mark(ctx, m.key, Mark{Seq: m.seq}); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := p0.Marks(ctx); err != nil || len(got) != 2 || got["k.a"].Seq != 7 || got["k b"].Seq != 9 {
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

// Two durables whose names make one bucket name (stream A_B, consumer C;
// stream A, consumer B_C) never share it: the second is refused, naming the
// owner, and the first's marks are left as they are. A bucket made before
// owners were recorded is taken by the first durable to open it.
func TestBucketOfAnotherDurableRefused(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	if BucketName("A_B", "C") != BucketName("A", "B_C") {
		t.Fatal("the names no longer collide: pick two that do")
	}
	first, err := Open(ctx, js, "A_B", "C", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Mark(ctx, "k", Mark{Seq: 7}); err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx, js, "A", "B_C", 1)
	var oerr *jsutil.OwnerError
	if !errors.As(err, &oerr) || !strings.Contains(err.Error(), `belongs to consumer "C" on stream "A_B"`) ||
		!strings.Contains(err.Error(), `not to consumer "B_C" on stream "A"`) {
		t.Fatalf("Open by another durable = %v, want it refused naming the owner", err)
	}
	if _, err := Open(ctx, js, "A_B", "C", 1); err != nil {
		t.Errorf("Open by its owner again = %v", err)
	}
	if marks, err := first.Marks(ctx); err != nil || marks["k"].Seq != 7 {
		t.Errorf("the owner's marks = %v, %v; want k at 7", marks, err)
	}
	_, err = OpenPartitions(ctx, js, "A_B", "C", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenPartitions(ctx, js, "A", "B_C", 1); !errors.As(err, &oerr) {
		t.Errorf("OpenPartitions by another durable = %v, want it refused", err)
	}

	// Made by an older courier, without an owner.
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketName("X", "Y_Z"), Description: Description, History: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, js, "X", "Y_Z", 1); err != nil {
		t.Fatalf("Open of a bucket without an owner = %v, want it taken", err)
	}
	if _, err := Open(ctx, js, "X_Y", "Z", 1); !errors.As(err, &oerr) {
		t.Errorf("Open by another durable once taken = %v, want it refused", err)
	}
}
