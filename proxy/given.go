// What a Runner is given (New, Options): the stores it writes through and
// the partitions it pulls from. They are declared here, below every part
// that uses them, and implemented elsewhere (packages dedup, dlq, success,
// ordermark, partition).

package proxy

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/verdict"
	"github.com/courierhq/courier/ordermark"
	"github.com/courierhq/courier/success"
)

// Deduper remembers processed idempotency keys. Implementations must be safe
// for concurrent use.
type Deduper interface {
	// Check says whether key was processed. A store shared by replicas
	// also claims a new key for this caller (verdict.New), or reports a
	// live claim of another replica (verdict.Claimed). An error means the
	// store could not answer: the message is held, never sent unchecked.
	Check(ctx context.Context, key string) (verdict.Verdict, error)
	// Record records keys as processed, together (the runner gathers the
	// keys of concurrent deliveries into one call), and returns nil only
	// once every one is stored durably.
	Record(ctx context.Context, keys ...string) error
	// Release gives up the claim Check took on key, after an attempt that
	// did not succeed, so that another delivery can go ahead at once.
	Release(ctx context.Context, key string) error
}

// Rewinds knows the rewinds of the durable. Safe for concurrent use.
type Rewinds interface {
	// Replay returns the id of the newest rewind whose range of stream
	// holds seq, or "" if none does.
	Replay(stream string, seq uint64) string
	// Superseded reports whether a rewind of a durable split into
	// partitions copies seq of stream again after the message of the
	// work stream at sequence work, copied by generation gen of the work
	// stream's source and stored at stored, which copies it (sourced.go):
	// that copy, made before the rewind, is then acked unsent, and the
	// rewind's copy delivers the message in its key's order.
	Superseded(stream string, seq, work uint64, gen int, stored time.Time) bool
}

// quickChecker is a Deduper whose Check waits on nothing a deadline could
// end (the embedded store), and so is given no timeout of its own.
type quickChecker interface {
	QuickCheck() bool
}

// DeadLetterer stores dead letters. DeadLetter must return nil only once the
// dead letter is stored durably (publish acknowledged by a stream), and must
// be safe for concurrent use.
type DeadLetterer interface {
	DeadLetter(ctx context.Context, l dlq.Letter) error
}

// SuccessPublisher stores success records. Publish must return nil only once
// the record is stored (acknowledged by a stream; a duplicate
// acknowledgement counts), and must be safe for concurrent use.
type SuccessPublisher interface {
	Publish(ctx context.Context, r success.Record) error
}

// OrderMarks keeps, durably and for every replica of the durable, the
// stream sequence of the first unsettled message of each key that has later
// messages waiting or is being retried (package ordermark). Safe for
// concurrent use.
type OrderMarks interface {
	Mark(ctx context.Context, key string, m ordermark.Mark) error
	Unmark(ctx context.Context, key string) error
	Marks(ctx context.Context) (map[string]ordermark.Mark, error)
}

// Partitions is a durable split into partitions (package partition): one
// consumer per partition on a work stream, each pinned to one courier at a
// time (its priority group, Options.PriorityGroup).
type Partitions struct {
	// Consumers are the partitions' consumers, by partition number.
	// Required.
	Consumers []jetstream.Consumer
	// Assignment says which partitions to pull from. Required.
	Assignment Assignment
	// Marks returns partition i's order marks; nil: none kept.
	Marks func(i int) OrderMarks
	// Handover hands each partition's pin on.
	Handover
}

// Handover is how the pin of a priority group is handed on to the next
// courier: partition i's (Partitions), or the durable's (Options.Handover,
// i 0). Any of its functions may be nil.
type Handover struct {
	// Unpin gives the pin up at once (jetstream.Stream.UnpinConsumer);
	// nil: it lapses after the consumer's PinnedTTL.
	Unpin func(ctx context.Context, i int) error
	// HandedOn records, before the pin is given up, that this courier
	// handed it on holding nothing and with its marks written. Clean
	// reports whether a pin this courier was given at pinnedAt (the
	// server's time) follows such a record within window, and forgets the
	// record: first deliveries then need not wait for what another courier
	// held. Either may be nil (every takeover waits).
	HandedOn func(ctx context.Context, i int) error
	Clean    func(ctx context.Context, i int, pinnedAt time.Time, window time.Duration) bool
	// Redeliver has partition i's consumer (or the durable's) deliver
	// again at once what it has out, from its ack floor on, in stream
	// order (a consumer reset, JETSTREAM.md "Rewind"): what a courier that
	// died held comes back now rather than after its ack wait. A
	// partition's work stream keeps only what is not acked; a durable's
	// stream keeps what was settled after the floor too, which only the
	// shared dedup store knows processed. Nil: it comes back after its
	// ack wait.
	Redeliver func(ctx context.Context, i int) error
	// Stream is the stream the group's consumer reads (partition i's work
	// stream, or the durable's). When the pin comes from a courier that
	// did not hand it on (it died), what that courier may still hold is
	// read from it, so that only the keys of those messages wait for
	// them; nil: every key waits an ack wait.
	Stream StreamReader
}

// StreamReader reads a stream's messages by sequence
// (jetstream.Stream). Safe for concurrent use.
type StreamReader interface {
	GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error)
}

// Membership is this courier's standing among the couriers of its durable,
// kept by their heartbeats (package partition): whether it may still send
// what it holds, and whether a pin is held by a courier that is gone. Safe
// for concurrent use.
type Membership interface {
	// Term returns this courier's term and whether it is live now. Once
	// not live, or in another term than before, it may have been taken
	// for dead and its pins given to others: what it holds of a pinned
	// group is given back, never sent.
	Term() (term uint64, live bool)
	// Orphaned reports whether pin, the client the server has pinned to
	// partition i (0: the durable), belongs to no live courier, and this
	// courier is the one to give it up (Handover.Unpin).
	Orphaned(i int, pin string) bool
}

// Assignment is the partitions a courier is to pull from. Safe for
// concurrent use.
type Assignment interface {
	// Assigned returns them and a channel closed when they change.
	Assigned() ([]int, <-chan struct{})
}
