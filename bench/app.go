package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The body of every benchmark message starts with a fixed header, so that the
// app can tell which message it got and when it was published without
// relying on headers that only courier sends. The rest is filler.
const (
	offRun    = 0  // uint64: the tally the message belongs to
	offID     = 8  // uint64: 0-based message index within the tally
	offSent   = 16 // int64: publish time, Unix nanoseconds
	bodyFixed = 24 // minimum body size
)

// newBody returns a size-byte message body for message id of run, stamped
// with sent.
func newBody(size int, run, id uint64, sent time.Time) []byte {
	b := make([]byte, max(size, bodyFixed))
	binary.BigEndian.PutUint64(b[offRun:], run)
	binary.BigEndian.PutUint64(b[offID:], id)
	binary.BigEndian.PutUint64(b[offSent:], uint64(sent.UnixNano()))
	for i := bodyFixed; i < len(b); i++ {
		b[i] = 'x'
	}
	return b
}

// tally records what the app received for one measured phase. Safe for
// concurrent use.
type tally struct {
	run      uint64
	n        int
	seen     []atomic.Bool
	lat      []atomic.Int64 // receive time minus publish time, ns
	distinct atomic.Int64
	requests atomic.Int64
	strays   atomic.Int64  // requests that belong to no message of this tally
	first    atomic.Int64  // Unix ns of the first distinct message
	last     atomic.Int64  // Unix ns of the n-th distinct message
	half     atomic.Int64  // Unix ns of the (n/2)-th distinct message
	started  chan struct{} // closed with the first distinct message
	done     chan struct{}
}

func newTally(run uint64, n int) *tally {
	return &tally{run: run, n: n, seen: make([]atomic.Bool, n), lat: make([]atomic.Int64, n),
		started: make(chan struct{}), done: make(chan struct{})}
}

// First is closed once the first message of the tally has been received:
// the process under test is up and delivering.
func (t *tally) First() <-chan struct{} { return t.started }

// Done is closed once every message of the tally has been received.
func (t *tally) Done() <-chan struct{} { return t.done }

// receive records one request carrying body, received at now.
func (t *tally) receive(body []byte, now time.Time) {
	t.requests.Add(1)
	if len(body) < bodyFixed || binary.BigEndian.Uint64(body[offRun:]) != t.run {
		t.strays.Add(1)
		return
	}
	id := binary.BigEndian.Uint64(body[offID:])
	if id >= uint64(t.n) || !t.seen[id].CompareAndSwap(false, true) {
		return // a duplicate: requests - distinct counts it
	}
	sent := int64(binary.BigEndian.Uint64(body[offSent:]))
	t.lat[id].Store(now.UnixNano() - sent)
	if t.first.CompareAndSwap(0, now.UnixNano()) {
		close(t.started)
	}
	// Exactly one request brings the count to n: that one closes done.
	switch t.distinct.Add(1) {
	case int64(t.n / 2):
		t.half.Store(now.UnixNano())
	case int64(t.n):
		t.last.Store(now.UnixNano())
		close(t.done)
	}
}

// receiveBatch records each entry of a batch request (courier's
// COURIER_BATCH_MAX): the benchmark's bodies are binary, so each entry
// carries its body as "dataBase64". It reports whether the body was a
// batch of as many entries as its Courier-Batch header says. The entries
// are found by scanning for that field rather than by encoding/json: the
// app must stay trivial next to what it measures, and decoding a 32-entry
// batch with encoding/json's reflection took 4.9 µs an entry on the
// benchmark machine (BenchmarkReceiveBatch), more than courier's own work
// per entry. courier's own tests check the body's JSON (package batch).
func (t *tally) receiveBatch(body []byte, declared string, now time.Time) bool {
	want, err := strconv.Atoi(declared)
	if err != nil || !bytes.HasPrefix(body, []byte(`{"entries":[`)) {
		return false
	}
	field := []byte(`"dataBase64":"`)
	var data []byte
	got := 0
	for rest := body; ; {
		i := bytes.Index(rest, field)
		if i < 0 {
			break
		}
		rest = rest[i+len(field):]
		end := bytes.IndexByte(rest, '"')
		if end < 0 {
			return false
		}
		data, err = base64.StdEncoding.AppendDecode(data[:0], rest[:end])
		if err != nil {
			return false
		}
		rest = rest[end:]
		t.receive(data, now)
		got++
	}
	return got == want
}

// batchEntry is one entry of a batch request as an app written the usual
// way declares it for encoding/json (batch.Entry's JSON).
type batchEntry struct {
	EntryID        string              `json:"entryId"`
	IdempotencyKey string              `json:"idempotencyKey"`
	Attempt        int                 `json:"attempt"`
	Subject        string              `json:"subject"`
	Stream         string              `json:"stream"`
	Sequence       uint64              `json:"sequence"`
	Published      time.Time           `json:"published"`
	ContentType    string              `json:"contentType"`
	Headers        map[string][]string `json:"headers"`
	Data           json.RawMessage     `json:"data"`
	DataBase64     []byte              `json:"dataBase64"` // encoding/json decodes base64 into []byte
}

// receiveBatchJSON is receiveBatch as an app written the usual way reads a
// batch: decoded whole into a struct of entries with encoding/json, whose
// cost (BenchmarkReceiveBatchJSON) the variant that uses it puts beside
// the scanning app's.
func (t *tally) receiveBatchJSON(body []byte, declared string, now time.Time) bool {
	want, err := strconv.Atoi(declared)
	if err != nil {
		return false
	}
	var req struct {
		Entries []batchEntry `json:"entries"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return false
	}
	for _, e := range req.Entries {
		t.receive(e.DataBase64, now)
	}
	return len(req.Entries) == want
}

// latencies returns the recorded latencies of messages [from, n).
func (t *tally) latencies(from int) []time.Duration {
	out := make([]time.Duration, 0, t.n-from)
	for i := from; i < t.n; i++ {
		if t.seen[i].Load() {
			out = append(out, time.Duration(t.lat[i].Load()))
		}
	}
	return out
}

// app is the instant local HTTP app every variant POSTs to: it reads the
// body, records it in the current tally and answers 200 at once. The
// replicas and adaptive scenarios make it answer later, or serve a few
// requests at a time (withWorkers).
type app struct {
	srv     *http.Server
	ln      net.Listener
	sock    string // the Unix socket it also listens on
	current atomic.Pointer[tally]
	delay   atomic.Int64 // how long each answer takes, ns; 0: at once
	// workers, when set, holds a token per request being served: the
	// others wait for one inside the app, first come first served (a
	// channel's blocked senders queue in order), as in a server with a
	// pool of workers.
	workers atomic.Pointer[chan struct{}]
	inside  atomic.Pointer[occupancy] // nil: not recorded
	// decodeJSON makes the app decode batches with encoding/json
	// (receiveBatchJSON) rather than scan them.
	decodeJSON atomic.Bool
	// last is the path of the latest request: who called last, when
	// each caller has a path of its own (rollout.go).
	last   atomic.Pointer[string]
	served chan error
}

// startApp listens on a random loopback port and on a Unix socket in dir,
// and serves both until close.
func startApp(dir string) (*app, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	a := &app{ln: ln, sock: filepath.Join(dir, "app.sock"), served: make(chan error, 2)}
	sl, err := net.Listen("unix", a.sock)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	a.srv = &http.Server{Handler: http.HandlerFunc(a.handle), ReadHeaderTimeout: 10 * time.Second}
	go func() { a.served <- a.srv.Serve(ln) }()
	go func() { a.served <- a.srv.Serve(sl) }()
	return a, nil
}

// URL is where the app accepts messages.
func (a *app) URL() string { return "http://" + a.ln.Addr().String() + "/messages" }

// SocketURL is where the app accepts messages on its Unix socket, as
// COURIER_APP_URL names it.
func (a *app) SocketURL() string { return "unix://" + a.sock + ":/messages" }

// lastCaller is the number of the courier that called last, on the path
// /messages/c<i>; -1: none yet.
func (a *app) lastCaller() int {
	p := a.last.Load()
	if p == nil {
		return -1
	}
	i, err := strconv.Atoi(strings.TrimPrefix(*p, "/messages/c"))
	if err != nil {
		return -1
	}
	return i
}

// measure makes t the tally that receives from now on.
func (a *app) measure(t *tally) { a.current.Store(t) }

// answerAfter makes every answer from now on take d (a latency-bound app:
// a database or a remote call behind it).
func (a *app) answerAfter(d time.Duration) { a.delay.Store(int64(d)) }

// withWorkers makes the app serve at most n requests at once from now on,
// each taking the answerAfter delay, the rest waiting inside it; 0: every
// request at once. Requests already waiting keep the pool they found.
func (a *app) withWorkers(n int) {
	if n <= 0 {
		a.workers.Store(nil)
		return
	}
	pool := make(chan struct{}, n)
	a.workers.Store(&pool)
}

// decodeBatches makes the app decode every batch request with
// encoding/json from now on (on) or scan it (off, the default).
func (a *app) decodeBatches(on bool) { a.decodeJSON.Store(on) }

// recordInside makes o record the requests inside the app from now on; nil
// stops recording.
func (a *app) recordInside(o *occupancy) { a.inside.Store(o) }

func (a *app) handle(w http.ResponseWriter, r *http.Request) {
	if o := a.inside.Load(); o != nil {
		o.enter(time.Now())
		defer func() { o.exit(time.Now()) }()
	}
	now := time.Now()
	path := r.URL.Path
	a.last.Store(&path)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if t := a.current.Load(); t != nil {
		if n := r.Header.Get("Courier-Batch"); n != "" {
			read := t.receiveBatch
			if a.decodeJSON.Load() {
				read = t.receiveBatchJSON
			}
			if !read(body, n, now) {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
		} else {
			t.receive(body, now)
		}
	}
	if pool := a.workers.Load(); pool != nil {
		select {
		case *pool <- struct{}{}:
		case <-r.Context().Done(): // the caller gave up waiting
			return
		}
		defer func() { <-*pool }()
	}
	if d := a.delay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	w.WriteHeader(http.StatusOK)
}

// occupancy records how many requests are inside the app over time, being
// served or waiting for a worker: the queue a limit in front of the app
// lets build up. It counts from the first request in until stop, and
// weighs each count by how long it lasted. Safe for concurrent use.
type occupancy struct {
	mu      sync.Mutex
	inside  int
	since   time.Time       // the last change; zero before the first request
	at      []time.Duration // at[k]: how long k requests were inside
	stopped bool
}

// enter records a request coming in at now.
func (o *occupancy) enter(now time.Time) { o.change(now, +1) }

// exit records a request answered at now.
func (o *occupancy) exit(now time.Time) { o.change(now, -1) }

func (o *occupancy) change(now time.Time, by int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.stopped {
		return
	}
	if !o.since.IsZero() {
		o.account(now)
	}
	if o.since.IsZero() && by > 0 {
		o.since = now
	}
	o.inside = max(o.inside+by, 0) // an exit of a request that came in before recording began
}

// account adds the time since the last change to the current count. A now
// before since (two requests timed in one order and recorded in the
// other) adds nothing.
func (o *occupancy) account(now time.Time) {
	for len(o.at) <= o.inside {
		o.at = append(o.at, 0)
	}
	if d := now.Sub(o.since); d > 0 {
		o.at[o.inside] += d
		o.since = now
	}
}

// stop ends recording at now; later requests are not counted.
func (o *occupancy) stop(now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.stopped && !o.since.IsZero() {
		o.account(now)
	}
	o.stopped = true
}

// mean is the time-weighted mean of the requests inside; NaN if nothing
// was recorded.
func (o *occupancy) mean() float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var total, weighted float64
	for k, d := range o.at {
		total += d.Seconds()
		weighted += float64(k) * d.Seconds()
	}
	if total == 0 {
		return math.NaN()
	}
	return weighted / total
}

// quantile is the q-quantile of the requests inside over time: the fewest k
// such that at most k were inside for at least the q fraction of the time
// recorded; NaN if nothing was recorded.
func (o *occupancy) quantile(q float64) float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var total time.Duration
	for _, d := range o.at {
		total += d
	}
	if total == 0 {
		return math.NaN()
	}
	var sum time.Duration
	for k, d := range o.at {
		sum += d
		if sum.Seconds() >= q*total.Seconds() {
			return float64(k)
		}
	}
	return float64(len(o.at) - 1)
}

// close stops the app and waits for its server goroutine.
func (a *app) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		_ = a.srv.Close()
	}
	<-a.served // http.ErrServerClosed: nothing to report at exit
	<-a.served
}
