package ordermark

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/courierhq/courier/internal/printable"
)

// A mark's due time is read back from a bucket that whoever may publish on
// its subjects can write (docs/threat-model.md, "courier's buckets"), and a
// key's later messages wait for its head until a while after it: a forged
// mark due in a year would hold its key for a year. courier itself writes a
// due time of the moment it NAKs a retry plus the retry's delay, which is at
// most the longer of its backoff's cap and its cap on an app's Retry-After.
// So a mark is not believed beyond that delay from now, plus an ack wait of
// slack for a replica whose clock runs ahead of the reader's: a due time
// later than that is cut to it (Capped).

// Cap is the latest due time a mark read back is believed: Now + MaxDelay +
// AckWait.
type Cap struct {
	// MaxDelay is the longest delay courier NAKs a retry with, which it
	// writes into the mark: the longer of COURIER_BACKOFF_MAX and
	// COURIER_RETRY_AFTER_MAX.
	MaxDelay time.Duration
	// AckWait is the consumer's ack wait: slack for a writer's clock ahead
	// of the reader's.
	AckWait time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Logger is told of each mark cut; default discards.
	Logger *slog.Logger
}

// Latest is the latest due time c believes, as of now.
func (c Cap) Latest() time.Time {
	return c.Now().Add(c.MaxDelay + c.AckWait)
}

// Keeper is a store of the marks of one durable or partition: Store, or a
// Capped around one.
type Keeper interface {
	Mark(ctx context.Context, key string, m Mark) error
	Unmark(ctx context.Context, key string) error
	Marks(ctx context.Context) (map[string]Mark, error)
}

// Capped is a Keeper whose reads (Marks) cut a mark's due time beyond its
// Cap to the Cap, logging each such mark once, at warning, with its key
// and what it said. Writes pass through. Safe for concurrent use when the
// Keeper is.
type Capped struct {
	k   Keeper
	cap Cap

	mu sync.Mutex
	// cut is what each mark last cut said: a mark is logged once, not at
	// every read, and only the marks cut at the last read are kept.
	cut map[string]Mark
}

// NewCapped returns k read with c.
func NewCapped(k Keeper, c Cap) *Capped {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return &Capped{k: k, cap: c, cut: map[string]Mark{}}
}

// Mark records key's first unsettled message (Store.Mark).
func (c *Capped) Mark(ctx context.Context, key string, m Mark) error { return c.k.Mark(ctx, key, m) }

// Unmark removes key's mark (Store.Unmark).
func (c *Capped) Unmark(ctx context.Context, key string) error { return c.k.Unmark(ctx, key) }

// maxLoggedKey bounds the length of a key in the log line of a mark cut: the
// key is the mark writer's.
const maxLoggedKey = 200

// Marks returns every mark, by ordering key, none due after the Cap.
func (c *Capped) Marks(ctx context.Context) (map[string]Mark, error) {
	marks, err := c.k.Marks(ctx)
	if err != nil {
		return nil, err
	}
	latest := c.cap.Latest()
	c.mu.Lock()
	defer c.mu.Unlock()
	cut := map[string]Mark{}
	for k, m := range marks {
		if !m.Due.After(latest) {
			continue
		}
		cut[k] = m
		if was, ok := c.cut[k]; !ok || was.Seq != m.Seq || !was.Due.Equal(m.Due) {
			c.cap.Logger.Warn("an order mark is due later than courier ever retries: awaited as if due at the latest retry courier writes (a mark courier did not write? see docs/threat-model.md, courier's buckets)",
				"order_key", printable.Line(k, maxLoggedKey), "seq", m.Seq, "due", m.Due.UTC().Format(time.RFC3339Nano),
				"capped_to", latest.UTC().Format(time.RFC3339Nano))
		}
		m.Due = latest
		marks[k] = m
	}
	c.cut = cut
	return marks, nil
}
