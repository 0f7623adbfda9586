package publish

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
)

// benchCallers is how many publishes are in progress at once.
const benchCallers = 16

// BenchmarkPublishHTTP publishes through the API in-process from 16
// callers, each waiting for its answer; BenchmarkPublishDirect publishes
// with js.Publish from 16. bench's figures (go run ./bench -only publish,
// courier as its own process) are the ones to quote; these show what the
// package itself adds.
func BenchmarkPublishHTTP(b *testing.B) {
	srv := natstest.Start(b, natstest.Options{})
	_, js := natstest.Connect(b, srv)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		b.Fatal(err)
	}
	a := startAPI(b, srv.ClientURL(), Options{})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchCallers, MaxConnsPerHost: benchCallers}}
	body := bytes.Repeat([]byte("x"), 256)
	runCallers(b, func() error {
		resp, err := client.Post(a.url+PathPrefix+"orders.created", "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
}

// BenchmarkPublishDirect is js.Publish from 16 callers, for comparison.
func BenchmarkPublishDirect(b *testing.B) {
	srv := natstest.Start(b, natstest.Options{})
	_, js := natstest.Connect(b, srv)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		b.Fatal(err)
	}
	body := bytes.Repeat([]byte("x"), 256)
	runCallers(b, func() error {
		_, err := js.Publish(context.Background(), "orders.created", body)
		return err
	})
}

// BenchmarkHTTPFloor is the floor under BenchmarkPublishHTTP: the same
// client and requests against a handler that only reads the body and
// answers, no NATS at all.
func BenchmarkHTTPFloor(b *testing.B) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(`{"stream":"ORDERS","seq":1,"duplicate":false}`))
	}))
	b.Cleanup(s.Close)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchCallers, MaxConnsPerHost: benchCallers}}
	body := bytes.Repeat([]byte("x"), 256)
	runCallers(b, func() error {
		resp, err := client.Post(s.URL+PathPrefix+"orders.created", "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil
	})
}

// runCallers runs op b.N times from benchCallers goroutines.
func runCallers(b *testing.B, op func() error) {
	var left atomic.Int64
	left.Store(int64(b.N))
	b.ResetTimer()
	var wg sync.WaitGroup
	for range benchCallers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := op(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
