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
	// of its work stream when the rewind re-sourced it, and CopiedAt when
	// the work stream stored that message: every copy the rewind makes
	// comes after it. A copy at or before it, stored by then, of a
	// message from From on is superseded (Superseded). Zero for a plain
	// durable, reset in place.
	Copied   uint64    `json:"copied,omitempty"`
	CopiedAt time.Time `json:"copied_at,omitzero"`
}

// Covers reports whether seq of stream is in r's range.
func (r Record) Covers(stream string, seq uint64) bool {
	return r.Stream == stream && seq >= r.From && seq <= r.To
}

// Supersedes reports whether r supersedes the message of a partitions' work
// stream at sequence work, stored at stored, which copies seq of stream: it
// was copied before r re-sourced the work stream, which copies every
// message of stream from From on again, seq among them. Its copy delivers
// it again, in its key's order; this one is acked unsent. The time tells a
// work stream made again since (its sequences start over) from the one r
// re-sourced.
func (r Record) Supersedes(stream string, seq, work uint64, stored time.Time) bool {
	return r.Copied > 0 && r.Stream == stream && seq >= r.From &&
		work <= r.Copied && !stored.After(r.CopiedAt)
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
// partitions' work stream at sequence work, stored at stored, which copies
// seq of stream (Record.Supersedes).
func (v *View) Superseded(stream string, seq, work uint64, stored time.Time) bool {
	if v == nil {
		return false
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	for _, r := range v.recs {
		if r.Supersedes(stream, seq, work, stored) {
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

// Watch keeps a View of kv's rewinds until the returned stop is called
// (idempotent; it waits for the watch to end). It returns once the rewinds
// stored so far are in the View.
func Watch(ctx context.Context, kv jetstream.KeyValue, log *slog.Logger) (*View, func(), error) {
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
				v.put(r)
				if !first {
					log.Info("rewind: messages in its range are delivered again as a replay",
						"rewind", r.ID, "stream", r.Stream, "from", r.From, "to", r.To, "copied", r.Copied)
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
