// Package rewind keeps the rewinds of a durable consumer: the record that
// `courier rewind` writes before it resets the consumer (JetStream's
// consumer reset, ADR-60), and the view of them that every courier of the
// durable watches, so that the messages delivered again are known as a
// replay and reach the app although their keys were recorded (docs/
// operations.md, "Reprocess after a bad deploy").
package rewind

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
)

// Description marks the buckets courier made for rewinds.
const Description = "courier: the rewinds of a durable consumer"

// Record is one rewind of a durable: the messages of Stream from From to To
// (the stream's last sequence when it was asked) are delivered again.
type Record struct {
	// ID names the rewind; the app sees it as Courier-Replay.
	ID string `json:"id"`
	// Stream is the stream whose sequences From and To are.
	Stream string `json:"stream"`
	// From and To bound the range, both included.
	From uint64 `json:"from"`
	To   uint64 `json:"to"`
	// At is when the rewind was asked.
	At time.Time `json:"at"`
	// Copied, for a durable split into partitions, is the last sequence
	// of its work stream when the rewind re-sourced it, CopiedAt when the
	// work stream stored that message, and Generation the generation of
	// the work stream's source the rewind made (package partition,
	// resource.go): every copy the rewind makes comes after Copied, by
	// Generation. Together they are the record's copy point: a copy at or
	// before Copied, stored by CopiedAt, by an earlier generation, of a
	// message from From on is superseded (Supersedes). Zero for a plain
	// durable, reset in place. A courier believes a copy point only once
	// confirmed against the work stream (Watch).
	Copied     uint64    `json:"copied,omitempty"`
	CopiedAt   time.Time `json:"copied_at,omitzero"`
	Generation int       `json:"generation,omitempty"`
}

// Covers reports whether seq of stream is in r's range.
func (r Record) Covers(stream string, seq uint64) bool {
	return r.Stream == stream && seq >= r.From && seq <= r.To
}

// Supersedes reports whether r supersedes the message of a partitions' work
// stream at sequence work, copied by generation gen of its source and
// stored at stored, which copies seq of stream: it was copied before r
// re-sourced the work stream, which copies every message of stream from
// From on again, seq among them. Its copy delivers it again, in its key's
// order; this one is acked unsent. A copy by r's generation or a later one
// is no earlier copy, whatever its sequence; the time tells a work stream
// made again since (its sequences start over) from the one r re-sourced.
func (r Record) Supersedes(stream string, seq, work uint64, gen int, stored time.Time) bool {
	return r.Copied > 0 && r.Stream == stream && seq >= r.From &&
		gen < r.Generation && work <= r.Copied && !stored.After(r.CopiedAt)
}

// hasCopyPoint reports whether r names a copy point.
func (r Record) hasCopyPoint() bool {
	return r.Copied > 0 || !r.CopiedAt.IsZero() || r.Generation > 0
}

// withoutCopyPoint is r with no copy point: its range is replayed, and it
// supersedes nothing.
func (r Record) withoutCopyPoint() Record {
	r.Copied, r.CopiedAt, r.Generation = 0, time.Time{}, 0
	return r
}

// BucketName is the bucket of the rewinds of consumer on stream.
func BucketName(stream, consumer string) string {
	return "COURIER_REWIND_" + jsutil.NameToken(stream) + "_" + jsutil.NameToken(consumer)
}

// NewID is a rewind's id made at t: its time, which sorts, and a suffix
// that tells apart two rewinds asked in the same second.
func NewID(t time.Time) string {
	return t.UTC().Format("20060102T150405Z") + fmt.Sprintf("-%04x", t.Nanosecond()>>14&0xffff)
}

// Open creates the bucket of consumer on stream if it is missing (replicas
// as given) and returns it. The bucket records its durable: another
// durable whose names make the same bucket name (stream A_B with consumer
// C, stream A with consumer B_C) is refused, naming the bucket's.
func Open(ctx context.Context, js jetstream.JetStream, stream, consumer string, replicas int) (jetstream.KeyValue, error) {
	bucket := BucketName(stream, consumer)
	kv, err := jsutil.OwnedKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: Description,
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}, jsutil.Owner{Stream: stream, Consumer: consumer})
	if err != nil {
		return nil, fmt.Errorf("rewinds bucket %s: %w", bucket, err)
	}
	return kv, nil
}

// Write stores r in kv, under its id.
func Write(ctx context.Context, kv jetstream.KeyValue, r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, r.ID, b); err != nil {
		return fmt.Errorf("storing rewind %s: %w", r.ID, err)
	}
	return nil
}

// Read returns the rewinds stored in kv, oldest first.
func Read(ctx context.Context, kv jetstream.KeyValue) ([]Record, error) {
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []Record
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue
		}
		var r Record
		if json.Unmarshal(e.Value(), &r) == nil {
			out = append(out, r)
		}
	}
	sortRecords(out)
	return out, nil
}

func sortRecords(rs []Record) {
	slices.SortFunc(rs, func(a, b Record) int { return strings.Compare(a.ID, b.ID) })
}

// View is what a courier knows of its durable's rewinds, kept up to date by
// Watch. Safe for concurrent use; the zero View knows none.
type View struct {
	mu   sync.RWMutex
	recs []Record // oldest first
}

// Replay returns the id of the newest rewind whose range holds seq of
// stream, or "" if none does.
func (v *View) Replay(stream string, seq uint64) string {
	if v == nil {
		return ""
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	for i := len(v.recs) - 1; i >= 0; i-- {
		if v.recs[i].Covers(stream, seq) {
			return v.recs[i].ID
		}
	}
	return ""
}

// Superseded reports whether a rewind supersedes the message of the
// partitions' work stream at sequence work, copied by generation gen and
// stored at stored, which copies seq of stream (Record.Supersedes).
func (v *View) Superseded(stream string, seq, work uint64, gen int, stored time.Time) bool {
	if v == nil {
		return false
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	for _, r := range v.recs {
		if r.Supersedes(stream, seq, work, gen, stored) {
			return true
		}
	}
	return false
}

// Records returns the rewinds v knows, oldest first.
func (v *View) Records() []Record {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return append([]Record(nil), v.recs...)
}

func (v *View) put(r Record) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range v.recs {
		if v.recs[i].ID == r.ID {
			v.recs[i] = r
			return
		}
	}
	v.recs = append(v.recs, r)
	sortRecords(v.recs)
}

func (v *View) remove(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range v.recs {
		if v.recs[i].ID == id {
			v.recs = append(v.recs[:i], v.recs[i+1:]...)
			return
		}
	}
}

// Confirm checks a record's copy point (Record.Copied) against what it
// names, the partitions' work stream: nil if it stands as the record says,
// else why not. It may read the server, and must return once ctx ends.
type Confirm func(ctx context.Context, r Record) error

// Watch keeps a View of kv's rewinds until the returned stop is called
// (idempotent; it waits for the watch to end). It returns once the rewinds
// stored so far are in the View.
//
// Anyone who can write kv can write a record, and a copy point makes
// couriers ack messages unsent: the View holds a record's copy point only
// once confirm accepts it (nil: none is accepted). Meanwhile, and for good
// if confirm refuses it, the View holds the record without it, so that its
// range is replayed and it supersedes nothing: the messages it names are
// delivered, perhaps twice, never lost.
func Watch(ctx context.Context, kv jetstream.KeyValue, confirm Confirm, log *slog.Logger) (*View, func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	w, err := kv.WatchAll(ctx)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("watching rewinds: %w", err)
	}
	v := &View{}
	initial := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer w.Stop() //nolint:errcheck // the watch ends with the context
		first := true
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					if first {
						first = false
						close(initial)
					}
					continue
				}
				if e.Operation() != jetstream.KeyValuePut {
					v.remove(e.Key())
					continue
				}
				var r Record
				if err := json.Unmarshal(e.Value(), &r); err != nil {
					log.Warn("ignoring a rewind record that does not parse", "key", e.Key(), "error", err)
					continue
				}
				r = v.confirmed(ctx, r, confirm, log)
				if !first {
					log.Info("rewind: messages in its range are delivered again as a replay",
						"rewind", r.ID, "stream", r.Stream, "from", r.From, "to", r.To, "copied", r.Copied, "generation", r.Generation)
				}
			}
		}
	}()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	select {
	case <-initial:
		return v, stop, nil
	case <-done:
		stop()
		return nil, nil, errors.New("watching rewinds: the watch ended before it began")
	case <-ctx.Done():
		stop()
		return nil, nil, ctx.Err()
	}
}

// confirmed puts r in v, its copy point only once confirm accepts it, and
// returns what v holds of it.
func (v *View) confirmed(ctx context.Context, r Record, confirm Confirm, log *slog.Logger) Record {
	if !r.hasCopyPoint() {
		v.put(r)
		return r
	}
	v.put(r.withoutCopyPoint())
	err := errors.New("no check of copy points is set")
	if confirm != nil {
		err = confirm(ctx, r)
	}
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("a rewind record the work stream does not confirm: its copy point is ignored: messages it names are delivered, not acked unsent (its range is still delivered again as a replay)",
				"rewind", r.ID, "stream", r.Stream, "from", r.From, "to", r.To, "copied", r.Copied,
				"copied_at", r.CopiedAt, "generation", r.Generation, "reason", err)
		}
		return r.withoutCopyPoint()
	}
	v.put(r)
	return r
}
