package publish

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
)

// benchCallers is how many publishes are in progress at once.
const benchCallers = 16

// BenchmarkPublishHTTP publishes through the API in-process from 16
// callers, each waiting for its answer; BenchmarkPublishForwarder does the
// same through the least an HTTP handler can do (bench/pubforwarder's);
// BenchmarkPublishDirect publishes with js.Publish from 16. bench's figures
// (go run ./bench -only publish, courier as its own process) are the ones
// to quote; these show what the package itself adds.
func BenchmarkPublishHTTP(b *testing.B) {
	srv := natstest.Start(b, natstest.Options{})
	_, js := natstest.Connect(b, srv)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		b.Fatal(err)
	}
	a := startAPI(b, srv.ClientURL(), Options{})
	postAll(b, a.url+PathPrefix+"orders.created")
}

// BenchmarkPublishForwarder is BenchmarkPublishHTTP through a handler that
// reads the body, publishes it with its Idempotency-Key as Nats-Msg-Id and
// answers the ack: no checks, no bounds, no metrics.
func BenchmarkPublishForwarder(b *testing.B) {
	srv := natstest.Start(b, natstest.Options{})
	_, js := natstest.Connect(b, srv)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		b.Fatal(err)
	}
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		m := &nats.Msg{Subject: strings.TrimPrefix(r.URL.Path, PathPrefix), Data: data,
			Header: nats.Header{nats.MsgIdHdr: []string{r.Header.Get(HeaderIdempotencyKey)}}}
		ack, err := js.PublishMsg(r.Context(), m)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(appendAck(nil, ack, ack.Duplicate))
	}))
	b.Cleanup(s.Close)
	postAll(b, s.URL+PathPrefix+"orders.created")
}

// postAll POSTs 256 bytes to url b.N times from benchCallers callers, each
// with an Idempotency-Key of its own (as bench does), each answered 200.
func postAll(b *testing.B, url string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchCallers, MaxConnsPerHost: benchCallers}}
	b.Cleanup(client.CloseIdleConnections)
	body := bytes.Repeat([]byte("x"), 256)
	var id atomic.Int64
	runCallers(b, func() error {
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set(HeaderIdempotencyKey, "bench-"+strconv.FormatInt(id.Add(1), 10))
		resp, err := client.Do(req)
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
