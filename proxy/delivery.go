// The delivery: what travels from a worker taking a message to its
// settling (settle.go), and how it is made (keyer).

package proxy

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// delivery is one delivery of one message, from a worker taking it to its
// settling.
type delivery struct {
	m       jetstream.Msg
	meta    *jetstream.MsgMetadata
	attempt int      // JetStream's delivery count, 1-based
	key     string   // the resolved dedup key, as the app sees it
	skey    string   // the key as the dedup store holds it
	okey    string   // the ordering key (order.go); "" when not ordered
	ord     keyLines // the lines okey is in (of its partition, partition.go)
	oepoch  uint64   // ord's epoch when it was admitted
	oseq    uint64   // its sequence in okey's line (streamSeq)
	// detached: held for a probe apart from the workers (detach); its
	// worker returns once it is settled.
	detached bool
	fl       *flight // own while this delivery holds the key's flight, else nil
	own      flight
	claimed  bool // the dedup store holds a claim of ours on skey
	probe    bool // sent while the breaker is open, to see if the app recovered
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
	// With batches: d as an entry of one, answered on its worker's
	// channel (lane.batchDone; nil: a channel of its own), or settled by
	// the batch once handed off (handedOff: its worker went on).
	entry     batchEntry
	batchDone chan batchResult
	handedOff bool
	// records, for an entry its batch's answer said succeeded: told once
	// its key is recorded and it is acked (recorder), so that the batch's
	// slot waits for it (batchRecords).
	records *batchRecords
}

// keyLines are the lines of order per key a delivery is in (order.go's
// orderer), told how it ended and asked whether its admission still holds.
// Safe for concurrent use.
type keyLines interface {
	// settled lets key go on after the message at seq was settled for
	// good, and returns how many of its messages waited behind it.
	settled(key string, seq uint64) int
	// retrying notes the message at seq is NAK'd for a retry in delay; it
	// returns what must be given back meanwhile (its partition handed on).
	retrying(key string, seq uint64, delay time.Duration) []queued
	// waitingBehind is how many of key's messages wait behind its head.
	waitingBehind(key string) int
	// outdated reports that the lines were handed on since epoch.
	outdated(epoch uint64) bool
	// gaveBack is told that seq, key's head admitted before the lines
	// were handed on (outdated), was given back.
	gaveBack(key string, seq uint64)
}

// keyer makes deliveries of messages: it resolves a message's key as the
// app sees it (ResolveKey) and as the dedup store holds it (storeKey).
type keyer struct {
	header  string // Options.IdempotencyHeader
	stream  string
	created time.Time
	log     *slog.Logger
}

// delivery is a delivery of m, whose metadata m.Metadata returned as meta
// (nil: none; the delivery is then only given back), run by the worker of
// ln, waiting at most until wait ends.
func (k keyer) delivery(m jetstream.Msg, meta *jetstream.MsgMetadata, ln lane, wait context.Context) *delivery {
	if meta == nil {
		return &delivery{m: m, wait: wait, log: msgLog{l: k.log, subject: m.Subject()}}
	}
	key := ResolveKey(m.Headers(), k.header, meta.Stream, k.created, meta.Sequence.Stream)
	return &delivery{
		m: m, meta: meta, attempt: int(meta.NumDelivered), key: key, skey: storeKey(key), wait: wait, timer: ln.timer,
		requests: ln.requests, batchDone: ln.batchDone,
		log: msgLog{l: k.log, subject: m.Subject(), seq: meta.Sequence.Stream, key: key, attempt: int(meta.NumDelivered)},
	}
}

// message is a delivery of m that no worker runs, to be given back.
func (k keyer) message(m jetstream.Msg) *delivery {
	meta, err := m.Metadata()
	if err != nil {
		meta = nil
	}
	return k.delivery(m, meta, lane{}, nil)
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
