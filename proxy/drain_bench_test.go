package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/orderkey"
	"github.com/courierhq/courier/proxy"
)

// BenchmarkDrain drains b.N preloaded 256-byte messages through the delivery
// loop to an instant app, in one process (server, app and loop share the
// CPUs), with dedup off and on, on in batches of 32, and on with order per
// key over the 1,000 subjects the messages are spread on, at 16 in flight. `go run ./bench` measures
// courier as its own process against a minimal forwarder; this one is for
// quick comparisons and profiles (-cpuprofile).
func BenchmarkDrain(b *testing.B) {
	for _, c := range []struct {
		withDedup bool
		batch     int
		order     string
	}{{false, 1, ""}, {true, 1, ""}, {true, 32, ""}, {true, 1, "subject:2"}} {
		withDedup := c.withDedup
		b.Run(fmt.Sprintf("dedup=%v/batch=%d/order=%s", withDedup, c.batch, c.order), func(b *testing.B) {
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
				if _, err := js.PublishAsync(fmt.Sprint("s.", i%1000), body); err != nil {
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
				BatchMax: c.batch, BatchWait: 2 * time.Millisecond, OrderKey: orderKeyOf(b, c.order),
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

// orderKeyOf is the Key of spec, nil for "".
func orderKeyOf(tb testing.TB, spec string) orderkey.Key {
	if spec == "" {
		return nil
	}
	k, err := orderkey.Parse(spec)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// BenchmarkOneKey drains b.N messages of one ordering key: courier with
// COURIER_ORDER_KEY against the usual workaround, a consumer with
// MaxAckPending 1 forwarding each message (pull one, POST, ack) to the
// same app.
func BenchmarkOneKey(b *testing.B) {
	for _, name := range []string{"courier ordered", "MaxAckPending 1 forwarder"} {
		b.Run(name, func(b *testing.B) {
			s := natstest.Start(b, natstest.Options{})
			_, js := natstest.Connect(b, s)
			ctx := context.Background()
			streams(b, js)
			cc := jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5, MaxAckPending: 1000}
			if name != "courier ordered" {
				cc.MaxAckPending = 1
			}
			cons, err := js.CreateOrUpdateConsumer(ctx, "S", cc)
			if err != nil {
				b.Fatal(err)
			}
			app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
			defer app.Close()
			body := make([]byte, 256)
			for i := 0; i < b.N; i++ {
				if _, err := js.PublishAsync("s.only", body); err != nil {
					b.Fatal(err)
				}
			}
			<-js.PublishAsyncComplete()
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan struct{})
			b.ResetTimer()
			if name == "courier ordered" {
				r, err := proxy.New(cons, dlq.NewPublisher(js, "dlq.s"), nil, proxy.Options{
					AppURL: app.URL, Stream: "S", Consumer: "c", MaxInflight: 16, Registerer: prometheus.NewRegistry(),
					OrderKey: orderKeyOf(b, "subject:2"),
				})
				if err != nil {
					b.Fatal(err)
				}
				go func() { _ = r.Run(rctx); close(done) }()
			} else {
				go func() {
					defer close(done)
					client := &http.Client{}
					for rctx.Err() == nil {
						batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
						if err != nil {
							continue
						}
						for m := range batch.Messages() {
							resp, err := client.Post(app.URL, "application/octet-stream", bytes.NewReader(m.Data()))
							if err == nil {
								_, _ = io.Copy(io.Discard, resp.Body)
								resp.Body.Close()
								_ = m.Ack()
							}
						}
					}
				}()
			}
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
