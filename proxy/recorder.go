package proxy

import (
	"context"
	"time"
)

// recJob is a delivery the app answered 2xx, waiting for its key to be
// recorded before it is acked.
type recJob struct {
	d    *delivery
	took time.Duration
}

// maxRecordBatch bounds the keys recorded in one call to the store, and the
// deliveries waiting for the recorder.
const maxRecordBatch = 256

// recordLinger is how long the recorder lets a batch gather after its first
// delivery. A commit to the store costs about the same for one key as for
// dozens (Badger hands each commit to a goroutine of its own and wakes the
// caller at the end): at 1 in flight, recording each key alone cost about a
// fifth of the drain rate. Only the ack waits; the app has answered and the
// worker has moved on.
const recordLinger = time.Millisecond

// recorder records the keys of delivered messages (dedup on), then acks
// them and ends their flights, until recs is closed. With dedup off it acks
// them in batches all the same: acks sent together leave in fewer writes to
// the connection, as nats.go flushes what is pending at once. It takes every delivery waiting
// recordLinger after the first (up to maxRecordBatch) and records their keys
// in one call, so the store commits the keys of concurrent workers and of
// successive messages together (group commit) and the batches grow with the
// load: while one commits, the next gathers. Each message is acked only
// after its key is recorded.
func (s *settler) recorder() {
	defer s.recorders.Done()
	batch := make([]recJob, 0, maxRecordBatch)
	keys := make([]string, 0, maxRecordBatch)
	for j := range s.recs {
		batch = append(batch[:0], j)
		if !keyWaits(j.d) {
			time.Sleep(s.linger)
		}
	fill:
		for len(batch) < maxRecordBatch {
			select {
			case j, ok := <-s.recs:
				if !ok {
					break fill
				}
				batch = append(batch, j)
			default:
				break fill
			}
		}
		var err error
		if s.dd != nil {
			keys = keys[:0]
			for _, j := range batch {
				keys = append(keys, j.d.skey)
			}
			// Not the requests phase: a 2xx that arrived as the grace
			// period ended is recorded all the same.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ph.requests), 10*time.Second)
			err = s.dd.Record(ctx, keys...)
			cancel()
		}
		if err != nil {
			// The effect happened: calling the app again would surely
			// duplicate it, so the messages are acked anyway.
			s.m.dedupErrors.WithLabelValues("record").Add(float64(len(batch)))
		}
		for _, j := range batch {
			if err != nil {
				j.d.log.Error("dedup store could not record the key after a 2xx; acking anyway", "error", err)
			}
			s.acked(j.d, j.took)
			if b := j.d.records; b != nil {
				j.d.records = nil
				b.done()
			}
		}
		clear(batch) // drop references to settled messages
	}
}

// keyWaits reports whether later messages of d's ordering key wait for d's
// ack (order.go): the recorder then lets no batch gather, as each of them
// would wait for it in turn.
func keyWaits(d *delivery) bool {
	return d.ord != nil && d.okey != "" && d.ord.waitingBehind(d.okey) > 0
}
