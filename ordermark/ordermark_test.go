package ordermark

import (
	"context"
	"testing"
	"time"

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
