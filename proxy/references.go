package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/dlq"
)

// References: the originals of reference dead letters.
//
// A dead letter too large to carry its original's body is stored as a
// reference (dlq.ErrBodyOmitted). On a work-queue or interest stream a Term
// would remove the body it refers to, so the original is not terminated but
// given back with BackoffMax until JetStream's budget is spent, after which
// JetStream keeps it. Its redeliveries must not reach the app (a 2xx would
// ack it away from under its dead letter, a rejection past the DLQ's
// duplicate window would store a second one), nor be dead-lettered again,
// here or by the max-deliveries catch. So the runner marks such an
// original: always in a bounded set in memory, and with dedup on in the
// dedup store too, under a key no idempotency key can be, where it
// survives a restart and, in the shared store, is seen by every replica.
// The mark is asked only on redeliveries: a first delivery pays nothing.
// The settler (settle.go) marks an original when it stores its reference
// dead letter, and gives back its redeliveries (giveBackReferenced), which
// the decision recognises (referenced).

// maxReferences bounds the marks kept in memory; the oldest is forgotten
// first. Each original needs its mark only until JetStream's budget is
// spent (MaxDeliver times BackoffMax), and reference dead letters are rare.
const maxReferences = 4096

// referenceKeyPrefix starts the dedup store key of a mark. It ends in a line
// feed, which no idempotency key holds: a NATS header value cannot carry
// one, and a derived key is made of a stream name and numbers.
const referenceKeyPrefix = "courier-reference-dead-letter\n"

// seer is a Deduper that also tells whether a key is recorded without
// claiming it (dedup.Store and dedup.Shared, whose Check claims). The marks
// of reference dead letters are kept in a store only if it is one. Seen
// must be safe for concurrent use.
type seer interface {
	Seen(ctx context.Context, key string) (bool, error)
}

// referenceSet is the bounded set of marked stream sequences in memory.
// Safe for concurrent use.
type referenceSet struct {
	mu   sync.Mutex
	seqs map[uint64]struct{}
	ring []uint64 // the marks in the order made, to forget the oldest
	next int      // where the next mark goes in ring once it is full
}

func newReferenceSet() *referenceSet {
	return &referenceSet{seqs: make(map[uint64]struct{})}
}

func (s *referenceSet) add(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seqs[seq]; ok {
		return
	}
	s.seqs[seq] = struct{}{}
	if len(s.ring) < maxReferences {
		s.ring = append(s.ring, seq)
		return
	}
	delete(s.seqs, s.ring[s.next])
	s.ring[s.next] = seq
	s.next = (s.next + 1) % maxReferences
}

func (s *referenceSet) has(seq uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.seqs[seq]
	return ok
}

// references are the marks of the originals of stored reference dead
// letters: in memory (set), and in the dedup store when it can tell a key
// without claiming it (store). Safe for concurrent use.
type references struct {
	set        *referenceSet
	store      seer    // dd, when it can tell a key without claiming it; else nil
	dd         Deduper // records a mark in the store, if store is not nil
	stream     string
	created    time.Time
	maxPayload int64
	termKeeps  bool // a Term keeps the message in its stream: no mark is needed
}

func newReferences(o Options, dd Deduper) *references {
	rs := &references{set: newReferenceSet(), dd: dd, stream: o.Stream, created: o.StreamCreated,
		maxPayload: o.MaxPayload, termKeeps: o.TermKeepsMessage}
	if sr, ok := dd.(seer); ok {
		rs.store = sr
	}
	return rs
}

// key is the dedup store key of the mark of the message at seq. The
// stream's creation time is in it, as in a derived key: a stream made again
// starts its sequences over.
func (rs *references) key(seq uint64) string {
	return referenceKeyPrefix + dlq.DerivedKey(rs.stream, rs.created, seq)
}

// mark marks d's original as one whose reference dead letter is stored. A
// mark the store cannot record is kept in memory only, and logged.
func (rs *references) mark(ctx context.Context, d *delivery) {
	seq := d.meta.Sequence.Stream
	rs.set.add(seq)
	if rs.store == nil {
		return
	}
	if err := rs.dd.Record(ctx, rs.key(seq)); err != nil {
		d.log.Warn("cannot record in the dedup store that the message's reference dead letter is stored; only this process remembers it",
			"error", err)
	}
}

// stored is Runner.ReferenceStored.
func (rs *references) stored(ctx context.Context, seq uint64) (bool, error) {
	if rs.set.has(seq) {
		return true, nil
	}
	if rs.store == nil {
		return false, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	ok, err := rs.store.Seen(ctx, rs.key(seq))
	if ok {
		rs.set.add(seq)
	}
	return ok, err
}

// marked reports whether d may be the original of a stored reference dead
// letter (a redelivery, on a stream where a Term removes it, large enough)
// and is marked as one. Only those ask the store.
func (rs *references) marked(ctx context.Context, d *delivery) (bool, error) {
	if d.attempt <= 1 || rs.termKeeps || !mayBeReference(d.m, rs.maxPayload) {
		return false, nil
	}
	return rs.stored(ctx, d.meta.Sequence.Stream)
}

// referenced reports a redelivery of the original of a stored reference
// dead letter: it ends as endReferenced, given back with BackoffMax, as
// when its dead letter was stored, without calling the app, until JetStream's
// budget is spent. A store that cannot answer lets the delivery go on (the
// dedup check that follows holds it while the store is down). The question
// outlives a stop, as the dedup check does (checker.once): one cut short
// is no sign of an outage.
func (rs *references) referenced(d *delivery) bool {
	ok, err := rs.marked(context.WithoutCancel(d.wait), d)
	if err != nil {
		d.log.Warn("cannot tell whether the message's reference dead letter is stored; delivering it", "error", err)
		return false
	}
	return ok
}

// referenceMargin bounds what a dead letter adds to its original: the
// envelope's headers, with the error cut short as dlq.Publisher cuts it
// before it leaves the body out.
const referenceMargin = 64 << 10

// mayBeReference reports whether m is large enough that its dead letter may
// have been stored without its body: within referenceMargin of the largest
// message the server accepts. The mark is asked only for those, so that a
// retried message of ordinary size costs no read of the store (a round trip
// with the shared store).
func mayBeReference(m interface {
	Data() []byte
	Headers() nats.Header
}, maxPayload int64) bool {
	size := int64(len(m.Data()))
	for k, vs := range m.Headers() {
		for _, v := range vs {
			size += int64(len(k) + len(v) + 4) // "k: v\r\n"
		}
	}
	return size+referenceMargin >= maxPayload
}
