package dedup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

func mustPeek(t *testing.T, s interface {
	Peek(context.Context, string) (Verdict, error)
}, key string, want Verdict) {
	t.Helper()
	got, err := s.Peek(context.Background(), key)
	if err != nil {
		t.Fatalf("Peek(%q): %v", key, err)
	}
	if got != want {
		t.Fatalf("Peek(%q) = %v, want %v", key, got, want)
	}
}

// TestStorePeek: Peek tells a recorded key, in the store's own scope and
// in another, and after Close says so.
func TestStorePeek(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{Scope: "c"})
	other, err := s.Scoped("other", ScopeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mustPeek(t, s, "order-1", New)
	mustRecord(t, s, "order-1")
	mustPeek(t, s, "order-1", Processed)
	mustPeek(t, other, "order-1", New)
	if err := other.Record(context.Background(), "order-2"); err != nil {
		t.Fatal(err)
	}
	mustPeek(t, other, "order-2", Processed)
	mustPeek(t, s, "order-2", New)
	if _, err := s.Peek(context.Background(), ""); !errors.Is(err, ErrEmptyKey) {
		t.Errorf("Peek of an empty key: %v, want ErrEmptyKey", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Peek(context.Background(), "order-1"); !errors.Is(err, ErrClosed) {
		t.Errorf("Peek after Close: %v, want ErrClosed", err)
	}
}

// TestSharedPeek walks a key through the verdicts Peek gives on two
// couriers sharing a bucket: it claims nothing (the next Check is New), it
// sees a live claim, either courier's, as Claimed, and a record as
// Processed (cached locally); a released or lapsed claim is New again.
func TestSharedPeek(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	a := openShared(t, js, SharedOptions{ClaimTTL: time.Second})
	b := openShared(t, js, SharedOptions{ClaimTTL: time.Second})
	other := openShared(t, js, SharedOptions{Scope: "S/other"})
	for _, key := range []string{"order 7: any bytes \x00 at all", string(make([]byte, 10000))} {
		mustPeek(t, a, key, New)
		mustPeek(t, a, key, New)
		mustCheck(t, b, key, New) // Peek took no claim
		mustPeek(t, a, key, Claimed)
		mustPeek(t, b, key, Claimed) // its own claim too
		mustPeek(t, other, key, New) // scopes do not share keys
		if err := b.Release(ctx, key); err != nil {
			t.Fatal(err)
		}
		mustPeek(t, a, key, New)
		mustCheck(t, b, key, New)
		if err := b.Record(ctx, key); err != nil {
			t.Fatal(err)
		}
		mustPeek(t, a, key, Processed)
		if seen, err := a.local.Seen(ctx, key); err != nil || !seen {
			t.Errorf("a key found processed in the bucket is not cached locally: %v %v", seen, err)
		}
	}

	// A claim whose courier died lapses: Peek says New once it has.
	mustCheck(t, a, "dies", New)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	mustPeek(t, b, "dies", Claimed)
	poll.Until(t, 10*time.Second, "the claim lapses", func() bool {
		v, err := b.Peek(ctx, "dies")
		if err != nil {
			t.Fatal(err)
		}
		return v == New
	})

	if _, err := b.Peek(ctx, ""); !errors.Is(err, ErrEmptyKey) {
		t.Errorf("Peek of an empty key: %v, want ErrEmptyKey", err)
	}
	natstest.Stop(srv)
	if v, err := b.Peek(ctx, "unknown"); err == nil {
		t.Errorf("Peek with the server down: %v, no error", v)
	}
}
