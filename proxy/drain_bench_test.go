package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/proxy"
)

// BenchmarkDrain drains b.N preloaded 256-byte messages through the delivery
// loop to an instant app, in one process (server, app and loop share the
// CPUs), with dedup off and on, and on in batches of 32, at 16 in flight. `go run ./bench` measures
// courier as its own process against a minimal forwarder; this one is for
// quick comparisons and profiles (-cpuprofile).
func BenchmarkDrain(b *testing.B) {
	for _, c := range []struct {
		withDedup bool
		batch     int
	}{{false, 1}, {true, 1}, {true, 32}} {
		withDedup := c.withDedup
		b.Run(fmt.Sprintf("dedup=%v/batch=%d", withDedup, c.batch), func(b *testing.B) {
			s := natstest.Start(b, natstest.Options{})
			_, js := natstest.Connect(b, s)
			ctx := context.Background()
			streams(b, js)
			cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{
				Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5, MaxAckPending: 1000,
			})
			if err != nil {
				b.Fatal(err)
			}
			app := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			defer app.Close()
			body := make([]byte, 256)
			for i := 0; i < b.N; i++ {
				if _, err := js.PublishAsync(fmt.Sprint("s.", i%10), body); err != nil {
					b.Fatal(err)
				}
			}
			<-js.PublishAsyncComplete()
			var dd proxy.Deduper
			if withDedup {
				st, err := dedup.Open(b.TempDir(), dedup.Options{TTL: time.Hour, Scope: "S/c"})
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				dd = checker{st}
			}
			r, err := proxy.New(cons, dlq.NewPublisher(js, "dlq.s"), dd, proxy.Options{
				AppURL: app.URL, Stream: "S", Consumer: "c", MaxInflight: 16, Registerer: prometheus.NewRegistry(),
				BatchMax: c.batch, BatchWait: 2 * time.Millisecond,
			})
			if err != nil {
				b.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			b.ResetTimer()
			go func() { _ = r.Run(rctx); close(done) }()
			for {
				info, err := cons.Info(ctx)
				if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			cancel()
			<-done
		})
	}
}
