package dedup

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// Peek: what a store holds for a key, for a caller that only asks and must
// not take the key's claim, as Check would (the max-deliveries catch, which
// asks whether the message an advisory names was processed or is being
// delivered before dead-lettering it).

// Peek reports what the store holds for key without claiming it: Processed
// if it is recorded, New if not. A Store holds no claims. Its errors are
// Seen's.
func (s *Store) Peek(ctx context.Context, key string) (Verdict, error) { return s.own.Peek(ctx, key) }

// Peek is Store.Peek for a key of this scope.
func (v *StoreScope) Peek(ctx context.Context, key string) (Verdict, error) {
	seen, err := v.Seen(ctx, key)
	if err != nil || !seen {
		return New, err
	}
	return Processed, nil
}

// Peek reports what the store holds for key without claiming it: Processed
// if it is recorded, locally or in the bucket (then cached locally);
// Claimed if the bucket holds a live claim on it, this store's or another
// courier's (a delivery of it is under way); New if neither, a key
// released or whose claim lapsed too. Nothing is claimed for the caller. It
// returns an error, never New, when the bucket cannot be asked.
func (s *Shared) Peek(ctx context.Context, key string) (Verdict, error) { return s.own.Peek(ctx, key) }

// Peek is Shared.Peek for a key of this scope.
func (v *SharedScope) Peek(ctx context.Context, key string) (Verdict, error) {
	s := v.s
	bk, err := v.bucketKey(key)
	if err != nil {
		return New, err
	}
	verdict := New
	err = s.use(func() error {
		if seen, err := v.local.Seen(ctx, key); err != nil || seen {
			if seen {
				verdict = Processed
			}
			return err
		}
		ctx, cancel := s.bound(ctx)
		defer cancel()
		r, err := s.readLast(ctx, bk)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return nil
		case err != nil:
			return s.bucketError(opRead, err)
		case r.deleted():
		case r.claim():
			verdict = Claimed
		default:
			verdict = Processed
			v.cache(ctx, key, r.time)
		}
		return nil
	})
	if err != nil {
		return New, err
	}
	return verdict, nil
}
