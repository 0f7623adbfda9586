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

	"github.com/courierhq/courier/apphttp"
)

// The publish scenario: how fast an app publishes through courier's HTTP
// API (COURIER_PUBLISH_ADDR), against a Go program publishing the same
// messages synchronously with nats.go (js.Publish, one acknowledgement
// awaited per call) and against the least an HTTP-to-JetStream publisher can
// do (./bench/pubforwarder: read the body, js.PublishMsg, answer the ack),
// and against an HTTP endpoint that answers at once and publishes nothing
// (the forwarder with BENCH_PUBLISH_NULL=1): the most any HTTP publisher
// can reach with these callers on this machine, whatever it does behind
// the request. All at publishConcurrency callers, in the same run,
// alternated round by round. The HTTP callers and the nats.go program both
// run in the benchmark's process, beside the embedded server; the
// forwarder and courier each as a process of their own. Every publisher
// sets the same Nats-Msg-Id (the server's duplicate window costs each
// alike). Forwarder against nats.go is HTTP's own cost; courier against the
// forwarder is courier's. Batches too: courier's batch API, 32 entries a
// request (POST /v1/publish-batch), against the synchronous nats.go
// program (the measure) and against nats.go publishing each
// caller's 32 at once asynchronously (what an app with a NATS client would
// do with a batch).
const (
	publishConcurrency = 16
	// publishTarget is what courier should reach over the direct
	// publisher: the HTTP hop costs something, not most.
	publishTarget = 0.8
	// publishWarmup publishes precede each timed phase: connections open,
	// both processes warm.
	publishWarmup = 500
)

// The publish scenario's variants, as -only matches them, in the order of
// the first round.
const (
	publishDirectName    = "publish: nats.go js.Publish"
	publishForwarderName = "publish: minimal HTTP forwarder"
	publishCourierName   = "publish: courier HTTP API"
	publishNullName      = "publish: HTTP alone, nothing published"
	publishBatchName     = "publish: courier HTTP API, batches of 32"
	// publishAsyncName publishes batches as an app with a NATS client
	// would: each caller's 32 at once with PublishMsgAsync, then awaits
	// their acks. What courier's batches cost beyond it is HTTP's and
	// courier's.
	publishAsyncName = "publish: nats.go PublishMsgAsync, batches of 32"
)

// publishBatchEntries is the entries of each request of the batch variant
// (POST /v1/publish-batch/<subject>).
const publishBatchEntries = 32

var publishVariants = []string{publishDirectName, publishForwarderName, publishCourierName, publishNullName, publishBatchName, publishAsyncName}

// publishResult is one timed phase of n publishes.
type publishResult struct {
	name    string
	round   int
	n       int
	elapsed time.Duration
	// cpu is the CPU time of the process under test (forwarder, courier)
	// over the timed phase; 0 for nats.go, which runs in the bench.
	cpu time.Duration
	// hostCPU is the bench process's meanwhile: the server, and the
	// callers (HTTP clients, or the nats.go publisher).
	hostCPU time.Duration
	err     error
}

func (r publishResult) rate() float64 { return float64(r.n) / r.elapsed.Seconds() }

// cpuPerPublish is the process under test's CPU per publish, µs.
func (r publishResult) cpuPerPublish() float64 { return perMsg(r.cpu, int64(r.n)) }

// allPerPublish is the machine's CPU per publish, µs: the process under
// test's, the server's and the callers'.
func (r publishResult) allPerPublish() float64 { return perMsg(r.cpu+r.hostCPU, int64(r.n)) }

// publishRound measures every variant once, the round's first being the
// next in turn, and returns what it measured.
func (b *bench) publishRound(ctx context.Context, round int) ([]publishResult, error) {
	k := round % len(publishVariants)
	order := slices.Concat(publishVariants[k:], publishVariants[:k])
	var out []publishResult
	for _, name := range order {
		if b.o.only != nil && !b.o.only.MatchString(name) {
			continue
		}
		var r publishResult
		var err error
		if name == publishDirectName || name == publishAsyncName {
			r, err = b.publishDirect(ctx, name)
		} else {
			r, err = b.publishHTTP(ctx, name)
		}
		r.round = round
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// publishDirect publishes o.publishN messages from publishConcurrency
// goroutines on a connection of its own, each waiting for its ack.
func (b *bench) publishDirect(ctx context.Context, name string) (publishResult, error) {
	r := publishResult{name: name, n: b.o.publishN}
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
		_, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: newBody(b.o.size, run, uint64(id), time.Now()),
			Header: nats.Header{nats.MsgIdHdr: {publishKey(run, id)}}})
		return err
	}
	per := 1
	if name == publishAsyncName {
		per = publishBatchEntries
		r.n -= r.n % per
		send = func(ctx context.Context, batch int) error {
			futures := make([]jetstream.PubAckFuture, per)
			for i := range futures {
				id := batch*per + i
				f, err := js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: newBody(b.o.size, run, uint64(id), time.Now()),
					Header: nats.Header{nats.MsgIdHdr: {publishKey(run, id)}}})
				if err != nil {
					return err
				}
				futures[i] = f
			}
			for _, f := range futures {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					return err
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}
	}
	_, r.err = publishAll(pctx, 0, publishWarmup/per, send)
	if r.err == nil {
		host := selfCPU()
		r.elapsed, r.err = publishAll(pctx, publishWarmup/per, r.n/per, send)
		r.hostCPU = selfCPU() - host
	}
	return r, ctx.Err()
}

// publishHTTP starts the process under test, courier with the publish API
// on (consuming an empty stream of its own, as it must consume something)
// or the minimal forwarder, and POSTs o.publishN messages from
// publishConcurrency goroutines, each with an Idempotency-Key of its own
// and waiting for its answer.
func (b *bench) publishHTTP(ctx context.Context, name string) (r publishResult, err error) {
	r = publishResult{name: name, n: b.o.publishN}
	run, stream, subject := b.next()
	pctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()
	if err := b.broker.createStream(pctx, stream, subject); err != nil {
		return r, err
	}
	defer b.deletePublishStreams(ctx)
	env := append(slices.Clone(b.baseEnv),
		"NATS_URL="+b.broker.URL(),
		"COURIER_PUBLISH_ADDR=127.0.0.1:0",
	)
	bin := b.pubforwarder
	if name == publishNullName {
		env = append(env, "BENCH_PUBLISH_NULL=1")
	}
	if name == publishCourierName || name == publishBatchName {
		bin = b.courier
		consumed := stream + "IDLE"
		if err := b.broker.createStream(pctx, consumed, subject+"idle"); err != nil {
			return r, err
		}
		env = append(env,
			"COURIER_STREAM="+consumed,
			"COURIER_CONSUMER="+consumerName,
			"COURIER_APP_URL="+b.app.URL(),
			"COURIER_ADMIN_ADDR=127.0.0.1:0",
			"COURIER_DEDUP_DIR="+b.dedupDir(run),
			"COURIER_PUBLISH_SUBJECTS="+subject,
			// Not measured: the publish API would otherwise stay open
			// for the default 25s grace after each stop.
			"COURIER_SHUTDOWN_GRACE=0",
		)
	}
	logPath := filepath.Join(b.dir, fmt.Sprintf("run%d-publish.log", run))
	logFile, err := os.Create(logPath)
	if err != nil {
		return r, err
	}
	defer os.Remove(logPath)
	c, err := startChild(bin, env, logFile)
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
	// The callers share courier's own HTTP/1.1 client (apphttp), which
	// writes and reads each exchange on the calling goroutine: the
	// cheapest client at hand, so that the callers take as little as
	// possible of the machine from the publisher under test.
	client := apphttp.NewClient(apphttp.ClientOptions{MaxConns: publishConcurrency, IdleTimeout: time.Minute})
	defer client.CloseIdleConnections()
	url := "http://" + addr + "/v1/publish/" + subject
	do := func(req *http.Request, entries int) error {
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("answered %d: %s", resp.StatusCode, bytes.TrimSpace(body))
		}
		if n := bytes.Count(body, []byte(`"status":200`)); entries > 0 && n != entries {
			return fmt.Errorf("answered 200 with %d of %d entries stored: %s", n, entries, body)
		}
		return nil
	}
	send := func(ctx context.Context, id int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url,
			bytes.NewReader(newBody(b.o.size, run, uint64(id), time.Now())))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		// As an app that wants its retries stored once would: the
		// forwarder and courier then store alike (courier would
		// otherwise make an id of its own).
		req.Header.Set("Idempotency-Key", publishKey(run, id))
		return do(req, 0)
	}
	// per is the messages a call of send publishes.
	per := 1
	if name == publishBatchName {
		per = publishBatchEntries
		r.n -= r.n % per
		url = "http://" + addr + "/v1/publish-batch/" + subject
		send = func(ctx context.Context, batch int) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url,
				bytes.NewReader(publishBatchBody(b.o.size, run, batch*per, per)))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			return do(req, per)
		}
	}
	// Courier may be listening before it has reached NATS; the warm-up
	// waits for it (a publish then waits for the connection).
	_, r.err = publishAll(pctx, 0, publishWarmup/per, send)
	if r.err == nil {
		cpu, cerr := c.cpu()
		host := selfCPU()
		r.elapsed, r.err = publishAll(pctx, publishWarmup/per, r.n/per, send)
		r.hostCPU = selfCPU() - host
		if after, err := c.cpu(); cerr == nil && err == nil {
			r.cpu = after - cpu
		}
	}
	return r, ctx.Err()
}

// publishBatchBody is the body of a batch request publishing messages [from,
// from+n) of run, each with its idempotency key, its data in base64 (the
// bodies are binary).
func publishBatchBody(size int, run uint64, from, n int) []byte {
	type entry struct {
		IdempotencyKey string `json:"idempotencyKey"`
		ContentType    string `json:"contentType"`
		DataBase64     []byte `json:"dataBase64"`
	}
	entries := make([]entry, n)
	now := time.Now()
	for i := range entries {
		entries[i] = entry{publishKey(run, from+i), "application/octet-stream", newBody(size, run, uint64(from+i), now)}
	}
	b, _ := json.Marshal(struct {
		Entries []entry `json:"entries"`
	}{entries})
	return b
}

// publishKey is message id's idempotency key in run: every publisher sends
// the same.
func publishKey(run uint64, id int) string {
	return "bench-" + strconv.FormatUint(run, 10) + "-" + strconv.Itoa(id)
}

// publishAll runs send for ids [from, from+n) from publishConcurrency
// goroutines and returns how long it took, or the first error.
func publishAll(ctx context.Context, from, n int, send func(context.Context, int) error) (time.Duration, error) {
	var next atomic.Int64
	next.Store(int64(from))
	n += from
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
	return logAddr(ctx, logPath, c, "publish API listening", "addr")
}

// logAddr polls c's log of JSON lines at logPath for the first line whose
// message is msg and returns its field key: an address courier bound.
func logAddr(ctx context.Context, logPath string, c *child, msg, key string) (string, error) {
	for {
		if f, err := os.Open(logPath); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				var rec map[string]any
				if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
					if addr, _ := rec[key].(string); addr != "" {
						f.Close()
						return addr, nil
					}
				}
			}
			f.Close()
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no %q line with %s in courier's log: %w", msg, key, ctx.Err())
		case <-c.Exited():
			return "", fmt.Errorf("courier exited before logging %q: %v", msg, c.err)
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
	fmt.Fprintln(w, "  CPU/publish: the process's CPU time over the timed phase / publishes (nats.go runs in the bench);")
	fmt.Fprintln(w, "  bench: the bench process's meanwhile (the server and the callers); all: the two together")
	var t table
	t.add("publisher", "msgs/s", "CPU µs/publish", "bench µs/publish", "all µs/publish", "every run")
	byName := map[string][]publishResult{}
	for _, r := range rep.publishes {
		byName[r.name] = append(byName[r.name], r)
	}
	for _, name := range publishVariants {
		rs := byName[name]
		if len(rs) == 0 {
			continue
		}
		var runs []string
		for _, r := range rs {
			runs = append(runs, strconv.FormatFloat(r.rate(), 'f', 0, 64)+noteIf(r.err))
		}
		cpu := "-"
		if name != publishDirectName && name != publishAsyncName {
			cpu = spread(publishValues(rs, publishResult.cpuPerPublish), "%.1f")
		}
		t.add(name, spread(publishValues(rs, publishResult.rate), "%.0f"), cpu,
			spread(publishValues(rs, func(r publishResult) float64 { return perMsg(r.hostCPU, int64(r.n)) }), "%.1f"),
			spread(publishValues(rs, publishResult.allPerPublish), "%.1f"),
			strings.Join(runs, ", "))
	}
	t.write(w)
	direct, fwd, courier, null := byName[publishDirectName], byName[publishForwarderName], byName[publishCourierName], byName[publishNullName]
	fmt.Fprintln(w, "Per-round ratios, median (min–max):")
	if batch := byName[publishBatchName]; len(batch) > 0 && len(direct) > 0 {
		fmt.Fprintf(w, "  courier batches of %d / nats.go: msgs/s %s× (target >= %.1f), all CPU per publish %s×\n",
			publishBatchEntries, spread(publishRatios(batch, direct, publishResult.rate), "%.2f"), publishTarget,
			spread(publishRatios(batch, direct, publishResult.allPerPublish), "%.2f"))
	}
	if batch, async := byName[publishBatchName], byName[publishAsyncName]; len(batch) > 0 && len(async) > 0 {
		fmt.Fprintf(w, "  courier batches / nats.go async batches of %d: msgs/s %s×, all CPU per publish %s×\n",
			publishBatchEntries, spread(publishRatios(batch, async, publishResult.rate), "%.2f"),
			spread(publishRatios(batch, async, publishResult.allPerPublish), "%.2f"))
	}
	if len(courier) > 0 && len(direct) > 0 {
		fmt.Fprintf(w, "  courier / nats.go:   msgs/s %s× (target >= %.1f), all CPU per publish %s×\n",
			spread(publishRatios(courier, direct, publishResult.rate), "%.2f"), publishTarget,
			spread(publishRatios(courier, direct, publishResult.allPerPublish), "%.2f"))
	}
	if len(courier) > 0 && len(fwd) > 0 {
		fmt.Fprintf(w, "  courier / forwarder: msgs/s %s×, CPU per publish %s×, all CPU per publish %s×\n",
			spread(publishRatios(courier, fwd, publishResult.rate), "%.2f"),
			spread(publishRatios(courier, fwd, publishResult.cpuPerPublish), "%.2f"),
			spread(publishRatios(courier, fwd, publishResult.allPerPublish), "%.2f"))
	}
	if len(null) > 0 && len(direct) > 0 {
		fmt.Fprintf(w, "  HTTP alone / nats.go: msgs/s %s× (the most an HTTP publisher reaches here), all CPU per publish %s×\n",
			spread(publishRatios(null, direct, publishResult.rate), "%.2f"),
			spread(publishRatios(null, direct, publishResult.allPerPublish), "%.2f"))
	}
	if len(courier) > 0 && len(null) > 0 {
		fmt.Fprintf(w, "  courier / HTTP alone: msgs/s %s×\n", spread(publishRatios(courier, null, publishResult.rate), "%.2f"))
	}
	if len(fwd) > 0 && len(direct) > 0 {
		fmt.Fprintf(w, "  forwarder / nats.go: msgs/s %s×, all CPU per publish %s× (HTTP's own cost)\n",
			spread(publishRatios(fwd, direct, publishResult.rate), "%.2f"),
			spread(publishRatios(fwd, direct, publishResult.allPerPublish), "%.2f"))
	}
}

// publishValues is f of each result.
func publishValues(rs []publishResult, f func(publishResult) float64) []float64 {
	vs := make([]float64, len(rs))
	for i, r := range rs {
		vs[i] = f(r)
	}
	return vs
}

// publishRatios is f of each of a over f of base's result of the same round.
func publishRatios(a, base []publishResult, f func(publishResult) float64) []float64 {
	var vs []float64
	for _, x := range a {
		for _, y := range base {
			if y.round == x.round && x.err == nil && y.err == nil {
				if d := f(y); d != 0 {
					vs = append(vs, f(x)/d)
				}
			}
		}
	}
	return vs
}
