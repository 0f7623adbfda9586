package dedup

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
)

// benchInflight is the number of concurrent deliveries the benchmarks
// drive, as a courier at COURIER_MAX_INFLIGHT=16 would.
const benchInflight = 16

// deduper is what a delivery does with a store.
type deduper interface {
	Check(ctx context.Context, key string) (Verdict, error)
	Record(ctx context.Context, keys ...string) error
}

// BenchmarkDelivery measures the dedup work of one delivery of a new key,
// Check then Record, from 16 goroutines: the embedded store against the
// shared one on one server and on an R3 bucket of a 3-node cluster (each
// goroutine's store connected to a node of its own, as replicas would be).
// It reports keys/s and the mean µs a Check and a Record take.
//
//	go test -run '^$' -bench Delivery -benchtime 20000x ./dedup
func BenchmarkDelivery(b *testing.B) {
	b.Run("store=badger", func(b *testing.B) {
		s := openStore(b, b.TempDir(), Options{})
		benchDelivery(b, []deduper{s})
	})
	b.Run("store=shared/R1", func(b *testing.B) {
		srv := natstest.Start(b, natstest.Options{})
		_, js := natstest.Connect(b, srv)
		benchDelivery(b, []deduper{openShared(b, js, SharedOptions{})})
	})
	b.Run("store=shared/R3", func(b *testing.B) {
		c := natstest.StartCluster(b, 3, natstest.ClusterOptions{})
		var ds []deduper
		for i := range 3 {
			_, js := natstest.ConnectURL(b, c.NodeURL(i))
			ds = append(ds, openShared(b, js, SharedOptions{Replicas: 3}))
		}
		benchDelivery(b, ds)
	})
	// The floor of any race-safe shared design: one create-if-absent write
	// per key (expected last subject sequence 0, the dedup TTL) and
	// nothing else: no local cache, no second write to record.
	b.Run("store=create/R1", func(b *testing.B) {
		srv := natstest.Start(b, natstest.Options{})
		_, js := natstest.Connect(b, srv)
		s := openShared(b, js, SharedOptions{})
		benchDelivery(b, []deduper{createOnly{s}})
	})
	// The design replaced, for comparison: a read of the bucket to check,
	// a create to record, no claim (so no single call across replicas).
	b.Run("store=get+create/R1", func(b *testing.B) {
		srv := natstest.Start(b, natstest.Options{})
		_, js := natstest.Connect(b, srv)
		kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "B", TTL: hour})
		if err != nil {
			b.Fatal(err)
		}
		benchDelivery(b, []deduper{getCreate{kv}})
	})
}

func benchDelivery(b *testing.B, stores []deduper) {
	ctx := context.Background()
	var n, checkNs, recordNs atomic.Int64
	run := fmt.Sprint(time.Now().UnixNano())
	b.ResetTimer()
	began, cpu0 := time.Now(), cpuTime()
	// Not RunParallel, whose goroutine count follows GOMAXPROCS: exactly
	// benchInflight goroutines, as many as deliveries in flight.
	done := make(chan struct{})
	for g := range benchInflight {
		s := stores[g%len(stores)]
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				i := n.Add(1)
				if i > int64(b.N) {
					return
				}
				key := fmt.Sprint(run, "-", i)
				t0 := time.Now()
				v, err := s.Check(ctx, key)
				t1 := time.Now()
				if err != nil || v != New {
					b.Errorf("Check(%s) = %v, %v", key, v, err)
					return
				}
				if err := s.Record(ctx, key); err != nil {
					b.Errorf("Record(%s): %v", key, err)
					return
				}
				checkNs.Add(int64(t1.Sub(t0)))
				recordNs.Add(int64(time.Since(t1)))
			}
		}()
	}
	for range benchInflight {
		<-done
	}
	took, cpu := time.Since(began), cpuTime()-cpu0
	b.StopTimer()
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "CPU-µs/key")
	b.ReportMetric(float64(b.N)/took.Seconds(), "keys/s")
	b.ReportMetric(float64(checkNs.Load())/float64(b.N)/1e3, "µs/check")
	b.ReportMetric(float64(recordNs.Load())/float64(b.N)/1e3, "µs/record")
}

// getCreate is the replaced kv store's shape: Get to check, Create to
// record.
type getCreate struct{ kv jetstream.KeyValue }

func (g getCreate) Check(ctx context.Context, key string) (Verdict, error) {
	_, err := g.kv.Get(ctx, "k."+key)
	switch {
	case err == nil:
		return Processed, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return New, nil
	}
	return New, err
}

func (g getCreate) Record(ctx context.Context, keys ...string) error {
	for _, k := range keys {
		if _, err := g.kv.Create(ctx, "k."+k, nil); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return err
		}
	}
	return nil
}

// createOnly writes each key once, create-if-absent, in Check; Record
// does nothing.
type createOnly struct{ s *Shared }

func (c createOnly) Check(ctx context.Context, key string) (Verdict, error) {
	bk, err := c.s.own.bucketKey(key)
	if err != nil {
		return New, err
	}
	_, err = c.s.js.PublishMsg(ctx, &nats.Msg{Subject: bk},
		jetstream.WithExpectLastSequencePerSubject(0), jetstream.WithMsgTTL(c.s.ttl))
	switch {
	case err == nil:
		return New, nil
	case isWrongLastSeq(err):
		return Processed, nil
	}
	return New, err
}

func (createOnly) Record(context.Context, ...string) error { return nil }

// cpuTime is the CPU time this process has used: the client's and, as the
// servers are embedded, the servers'.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
