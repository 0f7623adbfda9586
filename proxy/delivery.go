// The delivery: what travels from a worker taking a message to its
// settling (settle.go), and how it is made (keyer).

package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// queued is a fetched message waiting for a worker, with its size as counted
// against the queue's byte budget (measured once, on arrival).
type queued struct {
	m    jetstream.Msg
	size int64
	at   time.Time // when it arrived; stamped only for tracing, zero otherwise
	// With order per key (order.go): the message's key, its stream
	// sequence and when it began to wait in its key's line; letGo: the
	// line let it go, it is its key's head; ord, the lines it is in (of
	// its partition, partition.go).
	okey  string
	seq   uint64
	held  time.Time
	letGo bool
	ord   keyLines
	epoch uint64 // ord's epoch when it was admitted (unpinned)
	// sending is set while its request's last checks are made and once it
	// is sent: until then, outdated, it is not kept in progress
	// (orderer.lapse). Nil: not in a line.
	sending *atomic.Bool
}

// delivery is one delivery of one message, from a worker taking it to its
// settling.
type delivery struct {
	m       jetstream.Msg
	meta    *jetstream.MsgMetadata
	attempt int          // JetStream's delivery count, 1-based
	key     string       // the resolved dedup key, as the app sees it
	skey    string       // the key as the dedup store holds it
	replay  string       // the rewind that delivers the message again; "" if none
	fkey    string       // the key as the flights hold it: storeKey(key), for a replay too (check)
	okey    string       // the ordering key (order.go); "" when not ordered
	ord     keyLines     // the lines okey is in (of its partition, partition.go); noLines: none
	oepoch  uint64       // ord's epoch when it was admitted
	oseq    uint64       // its sequence in okey's line (streamSeq)
	sending *atomic.Bool // queued.sending
	// detached: held for a probe apart from the workers (detach); its
	// worker returns once it is settled.
	detached bool
	fl       *flight // own while this delivery holds the key's flight, else nil
	own      flight
	claimed  bool // the dedup store holds a claim of ours on skey
	probe    bool // sent while the breaker is open, to see if the app recovered
	// refused is what mayGo (decide.go) said of d's last request when it
	// refused it: held (endHeld), or ended unsent; for the decider to act
	// on.
	refused ending
	// answered: the app's answer reached the breaker. A probe that ends
	// without one (a duplicate, an expired message, the app unreachable)
	// has used the breaker's token for nothing and must ask for another.
	answered bool
	arrived  time.Time // when the message reached courier
	// wait bounds waiting (for a flight of the same key, the store, the
	// app): shutdown's noStart, or the grace period for a message on its
	// last delivery, started at shutdown so that it is not given back.
	// Both are the running worker's lane, as is timer, which bounds each
	// request by the HTTP timeout and by the grace period.
	wait  context.Context
	timer *requestTimer
	// requests is the running worker's lane's requests: it ends with the
	// grace period.
	requests context.Context
	log      msgLog
	// With batches: answered on its worker's channel (lane.batchDone;
	// nil: a channel of its own) as an entry of one, or settled by the
	// batch once handed off (handedOff: its worker went on).
	batchDone chan result
	handedOff bool
	// records, for an entry its batch's answer said succeeded: told once
	// its key is recorded and it is acked (recorder), so that the batch's
	// slot waits for it (batchRecords).
	records *batchRecords
}

// keyLines are the lines of order per key a delivery is in (order.go's
// orderer), told once how it ended (settler.told) and asked whether its
// admission still holds. Safe for concurrent use.
type keyLines interface {
	// settled tells the lines that seq, key's head, was settled for good:
	// its key goes on. It returns how many of key's messages waited
	// behind it.
	settled(key string, seq uint64) (waiting int)
	// retrying tells the lines that seq, key's head, was NAK'd for a
	// retry after delay: its key awaits the redelivery. While the lines
	// are handed on, it returns what must be given back meanwhile, in
	// stream order.
	retrying(key string, seq uint64, delay time.Duration) (giveBack []jetstream.Msg)
	// gaveBack tells the lines that seq, key's head, was given back after
	// they were handed on (outdated): they await it as a retried head,
	// should the pin come back.
	gaveBack(key string, seq uint64)
	// waitingBehind is how many of key's messages wait behind its head.
	waitingBehind(key string) int
	// outdated reports that the lines were handed on since epoch.
	outdated(epoch uint64) bool
}

// noLines are the lines of a delivery without an ordering key (order per
// key off, or no key in the message): nothing waits for it.
type noLines struct{}

func (noLines) settled(string, uint64) int                             { return 0 }
func (noLines) retrying(string, uint64, time.Duration) []jetstream.Msg { return nil }
func (noLines) gaveBack(string, uint64)                                {}
func (noLines) waitingBehind(string) int                               { return 0 }
func (noLines) outdated(uint64) bool                                   { return false }

// maxStoredKey bounds what the dedup store holds per key; a longer key (an
// odd publisher's header) is stored as its SHA-256.
const maxStoredKey = 256

// storeKey is the form of key the dedup store and in-flight set use.
func storeKey(key string) string {
	if len(key) <= maxStoredKey {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// replayKey is the form of key the dedup store holds for a delivery of
// rewind id's range: the key's record from before the rewind is left as it
// is, and the store's create-if-absent makes the replay once per rewind.
func replayKey(key, id string) string { return storeKey(key) + "\x00rewind:" + id }

// keyer makes deliveries of messages: it resolves a message's key as the
// app sees it (ResolveKey) and as the dedup store holds it (storeKey, or
// replayKey for a message a rewind delivers again).
type keyer struct {
	header  string // Options.IdempotencyHeader
	stream  string
	created time.Time
	rewinds Rewinds // nil: none
	log     *slog.Logger
}

// delivery is a delivery of q's message, whose metadata m.Metadata returned
// as meta (nil: none; the delivery is then only given back), run by the
// worker of ln, waiting at most until wait ends.
func (k keyer) delivery(q queued, meta *jetstream.MsgMetadata, ln lane, wait context.Context) *delivery {
	m := q.m
	if meta == nil {
		return &delivery{m: m, ord: noLines{}, wait: wait, log: msgLog{l: k.log, subject: m.Subject()}}
	}
	ord := q.ord
	if ord == nil {
		ord = noLines{}
	}
	key := ResolveKey(m.Headers(), k.header, meta.Stream, k.created, meta.Sequence.Stream)
	skey, replay := storeKey(key), ""
	if k.rewinds != nil {
		if replay = k.rewinds.Replay(meta.Stream, meta.Sequence.Stream); replay != "" {
			skey = replayKey(key, replay)
		}
	}
	return &delivery{
		m: m, meta: meta, attempt: int(meta.NumDelivered), key: key, skey: skey, replay: replay, fkey: storeKey(key), wait: wait, timer: ln.timer,
		requests: ln.requests, batchDone: ln.batchDone,
		arrived: q.at, okey: q.okey, ord: ord, oepoch: q.epoch, oseq: q.seq, sending: q.sending,
		log: msgLog{l: k.log, subject: m.Subject(), seq: meta.Sequence.Stream, key: key, attempt: int(meta.NumDelivered)},
	}
}

// alsoRecord appends to keys the other forms of d's key that its success
// settles: for a replay, its own key (the message may never have been
// processed before the rewind); for a delivery that began before a rewind
// whose range holds it, the rewind's (it was in flight at the rewind, and
// the rewind's copy of it is then a duplicate).
func (k keyer) alsoRecord(keys []string, d *delivery) []string {
	switch {
	case d.replay != "":
		return append(keys, d.fkey)
	case k.rewinds != nil && d.meta != nil:
		if id := k.rewinds.Replay(d.meta.Stream, d.meta.Sequence.Stream); id != "" {
			return append(keys, replayKey(d.key, id))
		}
	}
	return keys
}

// message is a delivery of m that no worker runs, to be given back.
func (k keyer) message(m jetstream.Msg) *delivery {
	meta, err := m.Metadata()
	if err != nil {
		meta = nil
	}
	return k.delivery(queued{m: m}, meta, lane{}, nil)
}

// last reports whether this is the message's last allowed delivery.
func (d *delivery) last(maxDeliver int) bool { return d.attempt >= maxDeliver }

// ended is how a delivery left its worker.
type ended int

const (
	endedHere      ended = iota // settled (or given back) on the worker
	endedDetached               // detached: a new worker has the worker's place
	endedHandedOff              // in a batch, settled by it (handoff.go): the worker goes on
)

// batchRecords counts the entries of one batch answered 2xx whose keys are
// not yet recorded and acked; all is closed when none is left.
type batchRecords struct {
	left atomic.Int64
	all  chan struct{}
}

// done tells b one more entry was recorded and acked.
func (b *batchRecords) done() {
	if b.left.Add(-1) == 0 {
		close(b.all)
	}
}
