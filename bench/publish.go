package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The publish scenario: how fast an app publishes through courier's HTTP
// API (COURIER_PUBLISH_ADDR), against a Go program publishing the same
// messages synchronously with nats.go (js.Publish, one acknowledgement
// awaited per call), both at publishConcurrency callers, in the same run.
// The HTTP callers and the nats.go program both run in the benchmark's
// process, beside the embedded server: what differs is courier in between.
const (
	publishConcurrency = 16
	// publishTarget is what courier should reach over the direct
	// publisher: the HTTP hop costs something, not most.
	publishTarget = 0.8
	// publishWarmup publishes precede each timed phase: connections open,
	// both processes warm.
	publishWarmup = 500
)

// The publish scenario's variants, as -only matches them.
const (
	publishDirectName  = "publish: nats.go js.Publish"
	publishCourierName = "publish: courier HTTP API"
)

// publishResult is one timed phase of n publishes.
type publishResult struct {
	name    string
	n       int
	elapsed time.Duration
	err     error
}

func (r publishResult) rate() float64 { return float64(r.n) / r.elapsed.Seconds() }

// publishRound measures both variants once, in the order round gives, and
// returns what it measured.
func (b *bench) publishRound(ctx context.Context, round int) ([]publishResult, error) {
	order := []string{publishDirectName, publishCourierName}
	if round%2 == 1 {
		order = []string{publishCourierName, publishDirectName}
	}
	var out []publishResult
	for _, name := range order {
		if b.o.only != nil && !b.o.only.MatchString(name) {
			continue
		}
		var r publishResult
		var err error
		if name == publishDirectName {
			r, err = b.publishDirect(ctx)
		} else {
			r, err = b.publishCourier(ctx)
		}
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// publishDirect publishes o.publishN messages from publishConcurrency
// goroutines on a connection of its own, each waiting for its ack.
func (b *bench) publishDirect(ctx context.Context) (publishResult, error) {
	r := publishResult{name: publishDirectName, n: b.o.publishN}
	run, stream, subject := b.next()
	pctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()
	if err := b.broker.createStream(pctx, stream, subject); err != nil {
		return r, err
	}
	defer b.deletePublishStreams(ctx)
	nc, err := nats.Connect(b.broker.URL())
	if err != nil {
		return r, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return r, err
	}
	send := func(ctx context.Context, id int) error {
		_, err := js.Publish(ctx, subject, newBody(b.o.size, run, uint64(id), time.Now()))
		return err
	}
	r.elapsed, r.err = publishAll(pctx, publishWarmup, send)
	if r.err == nil {
		r.elapsed, r.err = publishAll(pctx, r.n, send)
	}
	return r, ctx.Err()
}

// publishCourier starts courier with the publish API on (consuming an empty
// stream of its own, as it must consume something) and POSTs o.publishN
// messages from publishConcurrency goroutines, each waiting for its answer.
func (b *bench) publishCourier(ctx context.Context) (r publishResult, err error) {
	r = publishResult{name: publishCourierName, n: b.o.publishN}
	run, stream, subject := b.next()
	pctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()
	if err := b.broker.createStream(pctx, stream, subject); err != nil {
		return r, err
	}
	consumed := stream + "IDLE"
	if err := b.broker.createStream(pctx, consumed, subject+"idle"); err != nil {
		return r, err
	}
	defer b.deletePublishStreams(ctx)
	logPath := filepath.Join(b.dir, fmt.Sprintf("run%d-publish.log", run))
	logFile, err := os.Create(logPath)
	if err != nil {
		return r, err
	}
	defer os.Remove(logPath)
	env := append(slices.Clone(b.baseEnv),
		"NATS_URL="+b.broker.URL(),
		"COURIER_STREAM="+consumed,
		"COURIER_CONSUMER="+consumerName,
		"COURIER_APP_URL="+b.app.URL(),
		"COURIER_ADMIN_ADDR=127.0.0.1:0",
		"COURIER_DEDUP_DIR="+b.dedupDir(run),
		"COURIER_PUBLISH_ADDR=127.0.0.1:0",
		"COURIER_PUBLISH_SUBJECTS="+subject,
		// Not measured: the publish API would otherwise stay open for
		// the default 25s grace after each stop.
		"COURIER_SHUTDOWN_GRACE=0",
	)
	c, err := startChild(b.courier, env, logFile)
	logFile.Close() // the child has its own copy
	if err != nil {
		return r, err
	}
	defer func() {
		r.err = errors.Join(r.err, c.stop(stopGrace))
		_ = os.RemoveAll(b.dedupDir(run))
	}()
	addr, aerr := publishAPIAddr(pctx, logPath, c)
	if aerr != nil {
		r.err = aerr
		return r, ctx.Err()
	}
	client := &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: publishConcurrency,
		MaxConnsPerHost:     publishConcurrency,
		IdleConnTimeout:     time.Minute,
	}}
	defer client.CloseIdleConnections()
	url := "http://" + addr + "/v1/publish/" + subject
	send := func(ctx context.Context, id int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url,
			bytes.NewReader(newBody(b.o.size, run, uint64(id), time.Now())))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("answered %d: %s", resp.StatusCode, bytes.TrimSpace(body))
		}
		return nil
	}
	// Courier may be listening before it has reached NATS; the warm-up
	// waits for it (a publish then waits for the connection).
	r.elapsed, r.err = publishAll(pctx, publishWarmup, send)
	if r.err == nil {
		r.elapsed, r.err = publishAll(pctx, r.n, send)
	}
	return r, ctx.Err()
}

// publishAll runs send for ids [0, n) from publishConcurrency goroutines
// and returns how long it took, or the first error.
func publishAll(ctx context.Context, n int, send func(context.Context, int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, publishConcurrency)
	start := time.Now()
	for w := range publishConcurrency {
		wg.Go(func() {
			for {
				id := int(next.Add(1) - 1)
				if id >= n || ctx.Err() != nil {
					return
				}
				if err := send(ctx, id); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

// publishAPIAddr waits for courier's "publish API listening" line in its
// log and returns the address it names.
func publishAPIAddr(ctx context.Context, logPath string, c *child) (string, error) {
	for {
		if f, err := os.Open(logPath); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				var rec struct {
					Msg  string `json:"msg"`
					Addr string `json:"addr"`
				}
				if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "publish API listening" && rec.Addr != "" {
					f.Close()
					return rec.Addr, nil
				}
			}
			f.Close()
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("courier's publish API did not start: %w", ctx.Err())
		case <-c.Exited():
			return "", fmt.Errorf("courier exited before its publish API started: %v", c.err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// deletePublishStreams removes what a publish phase left on the server.
func (b *bench) deletePublishStreams(ctx context.Context) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = b.broker.deleteStreams(dctx)
}

// printPublish writes the publish scenario's figures.
func (rep *report) printPublish(w io.Writer) {
	if len(rep.publishes) == 0 {
		return
	}
	fmt.Fprintf(w, "\nPublishing: %d messages of %d bytes, %d concurrent callers, each waiting for its acknowledgement\n",
		rep.o.publishN, rep.o.size, publishConcurrency)
	var t table
	t.add("publisher", "msgs/s", "every run")
	med := map[string]float64{}
	for _, name := range []string{publishDirectName, publishCourierName} {
		var rates []float64
		var runs []string
		for _, r := range rep.publishes {
			if r.name == name {
				rates = append(rates, r.rate())
				runs = append(runs, strconv.FormatFloat(r.rate(), 'f', 0, 64)+noteIf(r.err))
			}
		}
		if len(rates) == 0 {
			continue
		}
		med[name] = median(rates)
		t.add(name, fmt.Sprintf("%.0f", med[name]), strings.Join(runs, ", "))
	}
	t.write(w)
	if d, ok := med[publishDirectName]; ok {
		if c, ok := med[publishCourierName]; ok {
			fmt.Fprintf(w, "courier / nats.go: %s; target >= %.1f\n", ratio(c, d), publishTarget)
		}
	}
}
