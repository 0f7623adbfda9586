package proxy_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/courierhq/courier/batch"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/verdict"
	"github.com/courierhq/courier/proxy"
	"github.com/courierhq/courier/success"
)

// wireEntry is an entry of a batch request as the app reads it.
type wireEntry struct {
	EntryID        string              `json:"entryId"`
	IdempotencyKey string              `json:"idempotencyKey"`
	Attempt        int                 `json:"attempt"`
	Subject        string              `json:"subject"`
	Sequence       uint64              `json:"sequence"`
	Headers        map[string][]string `json:"headers"`
	Data           json.RawMessage     `json:"data"`
	DataBase64     string              `json:"dataBase64"`
}

// batchApp answers every batch request with answer(entries, call number),
// which returns a status and a body. It records the batches it was sent.
type batchApp struct {
	mu      sync.Mutex
	batches [][]wireEntry
	headers []http.Header
	answer  func(entries []wireEntry, n int) (int, http.Header, string)
}

func newBatchApp(t *testing.T, e *env, answer func([]wireEntry, int) (int, http.Header, string)) *batchApp {
	t.Helper()
	a := &batchApp{answer: answer}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return a
}

func (a *batchApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Entries []wireEntry `json:"entries"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	a.batches = append(a.batches, body.Entries)
	a.headers = append(a.headers, r.Header.Clone())
	n := len(a.batches)
	a.mu.Unlock()
	status, h, text := a.answer(body.Entries, n)
	for k, vs := range h {
		w.Header()[k] = vs
	}
	w.WriteHeader(status)
	_, _ = w.Write([]byte(text))
}

// sent returns how many times each key was sent, and the attempts it was
// sent with.
func (a *batchApp) sent() map[string][]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string][]int{}
	for _, b := range a.batches {
		for _, e := range b {
			out[e.IdempotencyKey] = append(out[e.IdempotencyKey], e.Attempt)
		}
	}
	return out
}

// wantFull fails t unless the app got n messages in batches of size each
// (why says where that size comes from).
func (a *batchApp) wantFull(t *testing.T, size, n int, why string) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, b := range a.batches {
		if len(b) != size {
			t.Errorf("batch %d carried %d entries, want %d (%s)", i, len(b), size, why)
		}
	}
	if len(a.batches) != n/size {
		t.Errorf("%d batches for %d messages, want %d", len(a.batches), n, n/size)
	}
}

func statuses(entries []wireEntry, status func(wireEntry) string) string {
	var b []byte
	b = append(b, `{"statuses":[`...)
	for i, e := range entries {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"entryId":%q,"status":%q}`, e.EntryID, status(e))
	}
	return string(append(b, "]}"...))
}

func publishKeys(t *testing.T, e *env, keys ...string) {
	t.Helper()
	for _, k := range keys {
		m := nats.NewMsg("s.batch")
		m.Header.Set(proxy.HeaderIdempotencyKey, k)
		m.Header.Set("Content-Type", "application/json")
		m.Header.Set("X-Tenant", "t-"+k)
		m.Data = []byte(`{"key":"` + k + `"}`)
		if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
}

func batchOptions() proxy.Options {
	return proxy.Options{
		MaxDeliver: 3, MaxInflight: 2, BatchMax: 8, BatchWait: 50 * time.Millisecond,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, AckWait: 5 * time.Second,
	}
}

// Dapr's answer shape decides each entry: SUCCESS acked, RETRY retried
// through JetStream on the entry's own budget (exhausted, dead-lettered on
// its own), DROP dead-lettered as rejected, an entry left out retried. A
// duplicate of a processed key is acked and never sent.
func TestBatchDaprStatuses(t *testing.T) {
	e := setup(t)
	a := newBatchApp(t, e, func(entries []wireEntry, _ int) (int, http.Header, string) {
		return 200, nil, statuses(entries, func(e wireEntry) string {
			switch {
			case e.IdempotencyKey == "drop":
				return "DROP"
			case e.IdempotencyKey == "retry-always":
				return "RETRY"
			case e.IdempotencyKey == "retry-once" && e.Attempt == 1:
				return "RETRY"
			case e.IdempotencyKey == "missing-once" && e.Attempt == 1:
				return "LEAVE-OUT"
			}
			return "SUCCESS"
		})
	})
	// An unknown status is retried too: "LEAVE-OUT" stands for a missing
	// entry here, placed as RETRY with a log line.
	st := openStore(t)
	if err := st.Record(context.Background(), "dup"); err != nil {
		t.Fatal(err)
	}
	publishKeys(t, e, "ok-1", "drop", "retry-once", "ok-2", "retry-always", "dup", "missing-once", "ok-3")
	e.runWith(t, st, batchOptions())
	poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })

	sent := a.sent()
	for key, want := range map[string][]int{
		"ok-1": {1}, "ok-2": {1}, "ok-3": {1}, "drop": {1}, "retry-once": {1, 2}, "missing-once": {1, 2},
		"retry-always": {1, 2, 3},
	} {
		if fmt.Sprint(sent[key]) != fmt.Sprint(want) {
			t.Errorf("%s sent with attempts %v, want %v", key, sent[key], want)
		}
	}
	if _, ok := sent["dup"]; ok {
		t.Error("a duplicate was sent in a batch")
	}
	if got := e.deadLetters(t); got != 2 {
		t.Errorf("%d dead letters, want 2 (drop: rejected, retry-always: exhausted)", got)
	}
	reasons := deadLetterReasons(t, e)
	if reasons["drop"] != dlq.ReasonRejected || reasons["retry-always"] != dlq.ReasonExhausted {
		t.Errorf("dead letter reasons %v", reasons)
	}
	a.mu.Lock()
	first, h := a.batches[0], a.headers[0]
	a.mu.Unlock()
	if len(first) < 2 {
		t.Errorf("the first batch carried %d entries, want several", len(first))
	}
	if h.Get("Content-Type") != "application/json" || h.Get(batch.HeaderBatch) != strconv.Itoa(len(first)) {
		t.Errorf("batch headers: Content-Type %q, %s %q for %d entries", h.Get("Content-Type"), batch.HeaderBatch, h.Get(batch.HeaderBatch), len(first))
	}
	for _, en := range first {
		if string(en.Data) != `{"key":"`+en.IdempotencyKey+`"}` || en.Headers["X-Tenant"][0] != "t-"+en.IdempotencyKey {
			t.Errorf("entry %+v: data or headers not the message's", en)
		}
		if _, ok := en.Headers[proxy.HeaderIdempotencyKey]; ok {
			t.Errorf("entry headers carry courier's own %s", proxy.HeaderIdempotencyKey)
		}
	}
}

// deadLetterReasons maps the idempotency key of each dead letter to its
// reason.
func deadLetterReasons(t *testing.T, e *env) map[string]string {
	t.Helper()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, dlq.StreamName("dlq.s"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		out[m.Header.Get(proxy.HeaderIdempotencyKey)] = m.Header.Get(dlq.HeaderReason)
	}
	return out
}

// Lambda's shape: the entries listed are retried, the rest succeeded. A 2xx
// with neither shape: every entry succeeded.
func TestBatchLambdaAndPlainAnswers(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer func([]wireEntry) string
		want   map[string][]int
	}{
		{"lambda", func(entries []wireEntry) string {
			var b []byte
			b = append(b, `{"batchItemFailures":[`...)
			first := true
			for _, e := range entries {
				if e.IdempotencyKey == "b" && e.Attempt == 1 {
					if !first {
						b = append(b, ',')
					}
					b = fmt.Appendf(b, `{"itemIdentifier":%q}`, e.EntryID)
					first = false
				}
			}
			return string(append(b, "]}"...))
		}, map[string][]int{"a": {1}, "b": {1, 2}, "c": {1}}},
		{"plain 2xx", func([]wireEntry) string { return "thanks" }, map[string][]int{"a": {1}, "b": {1}, "c": {1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := setup(t)
			a := newBatchApp(t, e, func(entries []wireEntry, _ int) (int, http.Header, string) { return 200, nil, c.answer(entries) })
			publishKeys(t, e, "a", "b", "c")
			e.runWith(t, nil, batchOptions())
			poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })
			if got := a.sent(); fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("sent %v, want %v", got, c.want)
			}
			if got := e.deadLetters(t); got != 0 {
				t.Errorf("%d dead letters", got)
			}
		})
	}
}

// A non-2xx answer is every entry's, Retry-After included; an answer that
// cannot be read retries every entry.
func TestBatchWholeAnswers(t *testing.T) {
	for _, c := range []struct {
		name  string
		first func() (int, http.Header, string)
		want  string // the dead-letter reason of every entry, "" for none
	}{
		{"503 with Retry-After", func() (int, http.Header, string) {
			return 503, http.Header{"Retry-After": {"1"}}, "busy"
		}, ""},
		{"malformed answer", func() (int, http.Header, string) { return 200, nil, `{"statuses":[{` }, ""},
		// A 4xx to a batch of several says nothing of which entry the app
		// refused: each goes again, alone here (half of three), and is
		// rejected only if refused alone (TestBatchRefusedAlone).
		{"400", func() (int, http.Header, string) { return 400, nil, "bad batch" }, ""},
		{"no answer in time", func() (int, http.Header, string) {
			time.Sleep(700 * time.Millisecond) // past the HTTP timeout: real time is what is tested
			return 200, nil, ""
		}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := setup(t)
			// The retried entries may be at the app at once: the times are
			// kept under a lock of their own.
			var (
				mu                sync.Mutex
				firstAt, secondAt time.Time
			)
			a := newBatchApp(t, e, func(entries []wireEntry, n int) (int, http.Header, string) {
				if n == 1 {
					mu.Lock()
					firstAt = time.Now()
					mu.Unlock()
					return c.first()
				}
				mu.Lock()
				defer mu.Unlock()
				if secondAt.IsZero() {
					secondAt = time.Now()
				}
				return 200, nil, ""
			})
			publishKeys(t, e, "a", "b", "c")
			o := batchOptions()
			o.HTTPTimeout = 300 * time.Millisecond
			e.runWith(t, nil, o)
			poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })
			sent := a.sent()
			for _, k := range []string{"a", "b", "c"} {
				want := "[1 2]"
				if c.want != "" {
					want = "[1]"
				}
				if fmt.Sprint(sent[k]) != want {
					t.Errorf("%s sent with attempts %v, want %s", k, sent[k], want)
				}
			}
			reasons := deadLetterReasons(t, e)
			for _, k := range []string{"a", "b", "c"} {
				if reasons[k] != c.want {
					t.Errorf("%s dead letter reason %q, want %q", k, reasons[k], c.want)
				}
			}
			a.mu.Lock()
			for i, b := range a.batches[1:] {
				if len(b) > 1 {
					t.Errorf("batch %d after the first failed whole carried %d entries, want at most 1 (half of 3)", i+2, len(b))
				}
			}
			a.mu.Unlock()
			mu.Lock()
			waited := secondAt.Sub(firstAt)
			mu.Unlock()
			if c.name == "503 with Retry-After" && waited < 900*time.Millisecond {
				t.Errorf("retried after %s, want the app's Retry-After of 1s", waited)
			}
		})
	}
}

// An entry the app refuses (4xx) when it goes alone is dead-lettered as
// rejected, and only it: those that shared its batches are delivered.
func TestBatchRefusedAlone(t *testing.T) {
	e := setup(t)
	a := newBatchApp(t, e, func(entries []wireEntry, n int) (int, http.Header, string) {
		for _, en := range entries {
			if en.IdempotencyKey == "bad" {
				return 400, nil, "cannot read one of these"
			}
		}
		return 200, nil, ""
	})
	publishKeys(t, e, "a", "bad", "b", "c")
	e.runWith(t, nil, batchOptions())
	poll.Until(t, 20*time.Second, "every message sent and settled", func() bool { return len(a.sent()) == 4 && e.settled(t) })
	reasons := deadLetterReasons(t, e)
	if len(reasons) != 1 || reasons["bad"] != dlq.ReasonRejected {
		t.Errorf("dead letters %v, want only bad's, rejected", reasons)
	}
	sent := a.sent()
	if got := sent["bad"]; len(got) < 2 {
		t.Errorf("bad sent with attempts %v, want it refused in a batch and then alone", got)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if last := a.batches[len(a.batches)-1]; len(last) != 1 {
		t.Errorf("the last batch carried %d entries, want bad alone", len(last))
	}
}

// One message in ten makes the app fail every batch it is in (500): it is
// dead-lettered exhausted after a request of its own, on its last allowed
// delivery, and every other message is delivered, none dead-lettered for
// it, however the batches form around it.
func TestBatchPoisonEntryExhaustsOnlyItself(t *testing.T) {
	e := setup(t)
	poison := func(k string) bool { n, _ := strconv.Atoi(strings.TrimPrefix(k, "k")); return n%10 == 3 }
	a := newBatchApp(t, e, func(entries []wireEntry, n int) (int, http.Header, string) {
		for _, en := range entries {
			if poison(en.IdempotencyKey) {
				return 500, nil, "crashed on a record"
			}
		}
		return 200, nil, ""
	})
	var keys []string
	for i := range 40 {
		keys = append(keys, "k"+strconv.Itoa(i))
	}
	publishKeys(t, e, keys...)
	o := batchOptions()
	o.MaxDeliver, o.MaxInflight, o.BreakerFailures = 4, 2, 0
	e.runWith(t, nil, o)
	poll.Until(t, 30*time.Second, "every message sent and settled", func() bool { return len(a.sent()) == len(keys) && e.settled(t) })
	reasons := deadLetterReasons(t, e)
	sent := a.sent()
	for _, k := range keys {
		switch {
		case poison(k) && reasons[k] != dlq.ReasonExhausted:
			t.Errorf("poison %s: dead letter reason %q, want %q", k, reasons[k], dlq.ReasonExhausted)
		case !poison(k) && reasons[k] != "":
			t.Errorf("%s dead-lettered (%s) for a poison message it shared batches with; sent with attempts %v", k, reasons[k], sent[k])
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, b := range a.batches {
		for _, en := range b {
			if poison(en.IdempotencyKey) && en.Attempt == o.MaxDeliver && len(b) != 1 {
				t.Errorf("poison %s went on its last delivery in a batch of %d, want alone", en.IdempotencyKey, len(b))
			}
		}
	}
}

// slowRecords is the embedded store whose recording takes a while, as on a
// loaded disk: the keys of a batch answered 2xx are recorded some time
// after the answer.
type slowRecords struct {
	checker
	took time.Duration
}

func (s *slowRecords) Record(ctx context.Context, keys ...string) error {
	time.Sleep(s.took)
	return s.Store.Record(ctx, keys...)
}

// With one batch request in flight, the next batch goes only once the keys
// of the one before are recorded and acked: a kill then repeats at most
// what was at the app, one batch, not also one answered and not yet
// recorded.
func TestBatchNextWaitsForRecords(t *testing.T) {
	e := setup(t)
	store := &slowRecords{checker: openStore(t), took: 150 * time.Millisecond}
	var early atomic.Int32
	var prev []string
	a := newBatchApp(t, e, func(entries []wireEntry, n int) (int, http.Header, string) {
		for _, k := range prev {
			if v, err := store.Store.Check(context.Background(), k); err != nil || v != verdict.Processed {
				early.Add(1)
			}
		}
		prev = prev[:0]
		for _, en := range entries {
			prev = append(prev, en.IdempotencyKey)
		}
		return 200, nil, ""
	})
	var keys []string
	for i := range 24 {
		keys = append(keys, "k"+strconv.Itoa(i))
	}
	publishKeys(t, e, keys...)
	o := batchOptions()
	o.MaxInflight, o.BatchMax, o.BatchWait = 1, 4, 10*time.Millisecond
	e.runWith(t, store, o)
	poll.Until(t, 30*time.Second, "every message sent and settled", func() bool { return len(a.sent()) == len(keys) && e.settled(t) })
	a.mu.Lock()
	n := len(a.batches)
	a.mu.Unlock()
	if early.Load() > 0 {
		t.Errorf("%d keys of a batch not yet recorded when the next batch reached the app (%d batches)", early.Load(), n)
	}
}

// A batch goes when full: eight messages in flight slots of 2 × 4 go in
// batches of at most BatchMax, all of them settled.
func TestBatchFullGoesAtOnce(t *testing.T) {
	e := setup(t)
	a := newBatchApp(t, e, func([]wireEntry, int) (int, http.Header, string) { return 204, nil, "" })
	var keys []string
	for i := range 40 {
		keys = append(keys, "k"+strconv.Itoa(i))
	}
	publishKeys(t, e, keys...)
	o := batchOptions()
	o.BatchMax, o.BatchWait = 4, time.Hour // only a full batch goes
	e.runWith(t, nil, o)
	poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })
	a.wantFull(t, 4, 40, "BatchMax, the wait an hour")
}

// A body that is not JSON goes as dataBase64.
func TestBatchBinaryEntry(t *testing.T) {
	e := setup(t)
	a := newBatchApp(t, e, func([]wireEntry, int) (int, http.Header, string) { return 200, nil, "" })
	m := nats.NewMsg("s.bin")
	m.Data = []byte{0, 0xff, 'x'}
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	e.runWith(t, nil, batchOptions())
	poll.Until(t, 20*time.Second, "settled", func() bool { return e.settled(t) })
	a.mu.Lock()
	defer a.mu.Unlock()
	got, err := base64.StdEncoding.DecodeString(a.batches[0][0].DataBase64)
	if err != nil || string(got) != string(m.Data) || a.batches[0][0].Data != nil {
		t.Errorf("entry data %q / dataBase64 %q", a.batches[0][0].Data, a.batches[0][0].DataBase64)
	}
}

// A storm with batches on costs nothing: the failed batches open the
// breaker, it probes with a batch of one, and once the app recovers every
// message is delivered; none is dead-lettered.
func TestBatchStormCostsNothing(t *testing.T) {
	e := setup(t)
	var storming atomic.Bool
	storming.Store(true)
	a := newBatchApp(t, e, func([]wireEntry, int) (int, http.Header, string) {
		if storming.Load() {
			return 503, nil, "database down"
		}
		return 200, nil, ""
	})
	var keys []string
	for i := range 24 {
		keys = append(keys, "k"+strconv.Itoa(i))
	}
	publishKeys(t, e, keys...)
	o := batchOptions()
	o.BreakerFailures, o.BreakerProbe = 4, 100*time.Millisecond
	r, _ := e.runWith(t, nil, o)
	waitBreakerOpen(t, r)
	poll.Until(t, 10*time.Second, "a probe during the storm", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.batches) >= 3 && len(a.batches[len(a.batches)-1]) == 1
	})
	storming.Store(false)
	poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })
	if got := e.deadLetters(t); got != 0 {
		t.Errorf("%d dead letters from a storm", got)
	}
	for _, k := range keys {
		if len(a.sent()[k]) == 0 {
			t.Errorf("%s never sent", k)
		}
	}
}

// With tracing on, each entry's attempt span links to the span of its batch
// request, which links back to each entry and whose traceparent the
// request carries.
func TestBatchSpans(t *testing.T) {
	e := setup(t)
	a := newBatchApp(t, e, func([]wireEntry, int) (int, http.Header, string) { return 200, nil, "" })
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	publishKeys(t, e, "a", "b", "c")
	o := batchOptions()
	o.Tracer, o.BatchWait = tp.Tracer("test"), time.Second // the three in one batch
	e.runWith(t, nil, o)
	poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })
	poll.Until(t, 10*time.Second, "four spans ended", func() bool { return len(rec.Ended()) >= 4 })
	var batchSpan sdktrace.ReadOnlySpan
	var entries []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "send S batch" {
			batchSpan = s
		} else {
			entries = append(entries, s)
		}
	}
	if batchSpan == nil || len(entries) != 3 {
		t.Fatalf("spans: batch %v, %d entries; want a batch span and 3", batchSpan != nil, len(entries))
	}
	if len(batchSpan.Links()) != 3 {
		t.Errorf("the batch span links %d entries, want 3", len(batchSpan.Links()))
	}
	for _, s := range entries {
		if len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID() != batchSpan.SpanContext().SpanID() {
			t.Errorf("entry span %s links %v, want the batch span", s.Name(), s.Links())
		}
	}
	a.mu.Lock()
	tp0 := a.headers[0].Get("Traceparent")
	a.mu.Unlock()
	if want := batchSpan.SpanContext().SpanID().String(); !strings.Contains(tp0, want) {
		t.Errorf("the batch request's traceparent %q is not the batch span's (%s)", tp0, want)
	}
}

// SIGTERM with a batch in flight: the batch finishes within the grace
// period and each of its entries is acked.
func TestBatchInFlightAtShutdown(t *testing.T) {
	e := setup(t)
	inFlight := make(chan struct{}, 1)
	a := newBatchApp(t, e, func([]wireEntry, int) (int, http.Header, string) {
		select {
		case inFlight <- struct{}{}:
		default:
		}
		time.Sleep(300 * time.Millisecond) // still running when courier is told to stop
		return 200, nil, ""
	})
	publishKeys(t, e, "a", "b", "c")
	o := batchOptions()
	o.ShutdownGrace, o.BatchWait = 5*time.Second, time.Second
	_, stop := e.runWith(t, nil, o)
	<-inFlight
	stop()
	// The acks left before Run returned; the server may count them a moment
	// later. Well within the ack wait: a message not acked would be
	// redelivered, never settled.
	poll.Until(t, 2*time.Second, "the batch in flight at shutdown acked", func() bool { return e.settled(t) })
	if got := a.sent(); len(got) != 3 {
		t.Errorf("sent %v, want a, b and c once", got)
	}
}

// With order per key, a key has at most one entry in flight: no batch
// carries two entries of one key, and each key's entries reach the app in
// stream order.
func TestBatchWithOrderPerKey(t *testing.T) {
	e := setup(t)
	a := newBatchApp(t, e, func([]wireEntry, int) (int, http.Header, string) { return 200, nil, "" })
	for i := range 6 {
		for _, k := range []string{"x", "y", "z"} {
			m := nats.NewMsg("s.batch")
			m.Header.Set("Order", k)
			m.Header.Set(proxy.HeaderIdempotencyKey, fmt.Sprintf("%s-%d", k, i))
			m.Data = []byte(k)
			if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		}
	}
	o := batchOptions()
	o.OrderKey = orderOptions(t).OrderKey
	e.runWith(t, nil, o)
	poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })
	a.mu.Lock()
	defer a.mu.Unlock()
	next := map[string]int{}
	for i, b := range a.batches {
		seen := map[string]bool{}
		for _, en := range b {
			k := en.Headers["Order"][0]
			if seen[k] {
				t.Errorf("batch %d carries two entries of key %s", i, k)
			}
			seen[k] = true
			if want := fmt.Sprintf("%s-%d", k, next[k]); en.IdempotencyKey != want {
				t.Errorf("key %s: got %s, want %s next", k, en.IdempotencyKey, want)
			}
			next[k]++
		}
	}
}

// A batch is one request to COURIER_MAX_RATE's limiter: requests stay
// within the rate, and the messages go faster than the rate, several to a
// request.
func TestBatchRateLimitIsPerRequest(t *testing.T) {
	e := setup(t)
	var (
		mu    sync.Mutex
		times []time.Time
	)
	a := newBatchApp(t, e, func(entries []wireEntry, _ int) (int, http.Header, string) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		return 200, nil, ""
	})
	keys := numbered("r", 40)
	publishKeys(t, e, keys...)
	const perSecond = 4.0
	o := batchOptions()
	o.MaxRate = perSecond
	_, _ = e.runWith(t, nil, o)
	poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })
	for _, k := range keys {
		if len(a.sent()[k]) != 1 {
			t.Errorf("%s sent %d times, want once", k, len(a.sent()[k]))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(times) > len(keys)/2 {
		t.Errorf("%d requests for %d messages: batches not formed while waiting for the rate", len(times), len(keys))
	}
	for i := range times {
		in := 0
		for j := i; j < len(times) && times[j].Sub(times[i]) < time.Second; j++ {
			in++
		}
		if in > int(perSecond)+1 {
			t.Fatalf("%d batch requests within one second from request %d, cap %v/s", in, i, perSecond)
		}
	}
}

// Success records with batches: one per entry answered SUCCESS, with the
// batch's status and the entry's own attempt; a retried entry's record is
// its second attempt's, a dropped entry has none.
func TestBatchSuccessRecordsPerEntry(t *testing.T) {
	e := setup(t)
	if _, _, err := success.EnsureStream(context.Background(), e.js, "ok.s", 1, dlq.CheckStream); err != nil {
		t.Fatal(err)
	}
	var retried atomic.Bool
	newBatchApp(t, e, func(entries []wireEntry, _ int) (int, http.Header, string) {
		return 200, nil, statuses(entries, func(b wireEntry) string {
			switch {
			case b.IdempotencyKey == "drop":
				return "DROP"
			case b.IdempotencyKey == "retry" && !retried.Swap(true):
				return "RETRY"
			}
			return "SUCCESS"
		})
	})
	keys := []string{"a", "b", "retry", "drop", "c"}
	publishKeys(t, e, keys...)
	o := batchOptions()
	o.Success = success.NewPublisher(e.js, "ok.s")
	_, _ = e.runWith(t, openStore(t), o)
	poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })
	poll.Until(t, 10*time.Second, "four success records", func() bool { return len(records(t, e.js, "ok.s")) >= 4 })
	recs := records(t, e.js, "ok.s")
	byKey := map[string]*jetstream.RawStreamMsg{}
	for _, m := range recs {
		byKey[m.Header.Get(success.HeaderKey)] = m
	}
	if len(recs) != 4 || len(byKey) != 4 || byKey["drop"] != nil {
		t.Fatalf("%d records for keys %v, want one each for a, b, retry, c", len(recs), slices.Sorted(maps.Keys(byKey)))
	}
	for k, m := range byKey {
		want := "1"
		if k == "retry" {
			want = "2"
		}
		if got := m.Header.Get(success.HeaderAttempt); got != want {
			t.Errorf("record of %s carries attempt %q, want %s", k, got, want)
		}
		if got := m.Header.Get(success.HeaderStatus); got != "200" {
			t.Errorf("record of %s carries status %q, want 200", k, got)
		}
	}
	if got := e.deadLetters(t); got != 1 {
		t.Errorf("%d dead letters, want 1 (drop)", got)
	}
}

// An app that cannot be reached holds a batch's messages as it holds one
// message: no attempt spent on the outage, nothing dead-lettered however
// long it lasts (MaxDeliver 2), and every entry goes once the app listens.
func TestBatchAppOutageSpendsNothing(t *testing.T) {
	e := setup(t)
	listen := appLater(t, e)
	keys := numbered("o", 12)
	publishKeys(t, e, keys...)
	o := batchOptions()
	o.MaxDeliver, o.HealthInterval = 2, 50*time.Millisecond
	_, _ = e.runWith(t, nil, o)
	poll.Until(t, 10*time.Second, "the app counted unavailable", func() bool {
		return counter(t, e.reg, "courier_app_available", "") == 0
	})
	time.Sleep(500 * time.Millisecond) // an outage longer than the backoff, many times over
	a := &batchApp{answer: func(entries []wireEntry, _ int) (int, http.Header, string) { return 200, nil, "" }}
	listen(a)
	poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })
	for _, k := range keys {
		if got := a.sent()[k]; len(got) != 1 || got[0] > 2 {
			t.Errorf("%s sent at attempts %v, want once within its budget", k, got)
		}
	}
	if got := e.deadLetters(t); got != 0 {
		t.Errorf("%d dead letters from an app outage, want none", got)
	}
}
