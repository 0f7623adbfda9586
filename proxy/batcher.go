package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/batch"
)

// Batches (Options.BatchMax > 1), as README's "Batches" describes them.
//
// Each message keeps its own delivery: worker, dedup check, claim, span,
// breaker, settling. Where a single message would be sent, its worker hands
// the entry to the batcher (submit) and waits for the entry's own result,
// which decide reads as it reads the answer to a single request. So every
// promise holds per entry, and MaxInflight×BatchMax workers run. The
// batcher gathers entries into one request (batch.Encode) until it holds
// BatchMax entries or BatchBytes of message data, or BatchWait after its
// first entry; sends at most MaxInflight batches at once, each one request
// to the rate limit; and gives each entry its part of the answer
// (batch.ReadAnswer). A non-2xx answer, or none, is every entry's.

// batchAnswerLimit bounds what is read of the app's answer to a batch: a
// status object per entry fits many times over.
const batchAnswerLimit = 4 << 20

// batchEntry is one delivery waiting for its part of a batch.
type batchEntry struct {
	d    *delivery
	h    http.Header  // the headers it would have been sent with alone
	span *attemptSpan // nil: tracing off
	done chan batchResult
}

// batchResult is an entry's part of its batch's answer: what post returns
// for a single request.
type batchResult struct {
	answer *apphttp.Answer
	took   time.Duration
	err    error
}

// entryError is an entry the app's 2xx answer to its batch says to retry
// or to drop. App is the batch's answer (status, Retry-After), for the
// retry's delay and the dead letter.
type entryError struct {
	status batch.Status
	app    *apphttp.AppError
}

func (e *entryError) Error() string {
	if e.status == batch.Drop {
		return fmt.Sprintf("the app's answer to the batch (%d) dropped the entry", e.app.Status)
	}
	return fmt.Sprintf("the app's answer to the batch (%d) asked to retry the entry", e.app.Status)
}

func (e *entryError) Unwrap() error { return e.app }

// batcher gathers deliveries into batch requests. Run starts it and, once
// every worker has returned, closes in and waits for it (stop).
type batcher struct {
	r     *Runner
	in    chan *batchEntry
	max   int
	bytes int
	wait  time.Duration
	slots chan struct{} // one per batch request in flight: MaxInflight
	wg    sync.WaitGroup

	// Batches as batches; their entries count as messages in every other
	// metric.
	requests *prometheus.CounterVec
	entries  prometheus.Histogram
}

func newBatcher(r *Runner) *batcher {
	b := &batcher{
		r: r, in: make(chan *batchEntry), max: r.o.BatchMax, bytes: r.o.BatchBytes, wait: r.o.BatchWait,
		slots: make(chan struct{}, r.o.MaxInflight),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "courier_batch_requests_total",
			Help: "Batch requests to the app by result (2xx, 3xx, 4xx, 5xx, timeout, transport, unreachable); each entry is also counted in courier_app_requests_total.",
		}, []string{"result"}),
		entries: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "courier_batch_entries",
			Help:    "Entries per batch request.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
	}
	for _, res := range requestResults() {
		b.requests.WithLabelValues(res)
	}
	r.o.Registerer.MustRegister(b.requests, b.entries)
	return b
}

// submit hands d, with the headers h it would be sent with alone, to the
// next batch and returns its part of the answer.
func (b *batcher) submit(d *delivery, h http.Header, span *attemptSpan) batchResult {
	e := &batchEntry{d: d, h: h, span: span, done: make(chan batchResult, 1)}
	select {
	case b.in <- e:
	case <-b.r.ph.requests.Done():
		return batchResult{err: errNotSent}
	}
	return <-e.done // every entry taken is answered
}

// start runs the gathering loop until stop.
func (b *batcher) start() {
	b.wg.Add(1)
	go b.gather()
}

// stop ends the loop once no entry can come (the workers have returned) and
// waits for the batches in flight.
func (b *batcher) stop() {
	close(b.in)
	b.wg.Wait()
}

// gather forms batches: full (entries or bytes), or BatchWait after their
// first entry, or at once once courier is stopping.
func (b *batcher) gather() {
	defer b.wg.Done()
	var (
		cur      []*batchEntry
		size     int
		timer    = time.NewTimer(time.Hour)
		fire     <-chan time.Time
		stopping = b.r.ph.noStart.Done()
		wait     = b.wait
	)
	timer.Stop()
	defer timer.Stop()
	flush := func() {
		if len(cur) > 0 {
			b.send(cur)
		}
		cur, size, fire = nil, 0, nil
		timer.Stop()
	}
	for {
		select {
		case e, ok := <-b.in:
			if !ok {
				flush()
				return
			}
			n := len(e.d.m.Data())
			if len(cur) > 0 && size+n > b.bytes {
				flush() // it goes in the next one
			}
			cur, size = append(cur, e), size+n
			if len(cur) >= b.max || size >= b.bytes || wait <= 0 {
				flush()
			} else if len(cur) == 1 {
				timer.Reset(wait)
				fire = timer.C
			}
		case <-fire:
			flush()
		case <-stopping:
			// Nothing new starts: what has gathered goes at once, and so
			// does every entry from now on (a last delivery sent in the
			// grace period).
			stopping, wait = nil, 0
			flush()
		}
	}
}

// send sends entries as one batch once a slot is free.
func (b *batcher) send(entries []*batchEntry) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.slots <- struct{}{}
		defer func() { <-b.slots }()
		b.deliver(entries)
	}()
}

// deliver sends one batch request and answers each entry.
func (b *batcher) deliver(entries []*batchEntry) {
	r := b.r
	answerAll := func(res batchResult) {
		for _, e := range entries {
			e.done <- res
		}
	}
	if r.limiter != nil {
		began := time.Now()
		if err := r.limiter.Wait(r.ph.requests); err != nil {
			answerAll(batchResult{err: errNotSent})
			return
		}
		r.m.rateWait.Add(time.Since(began).Seconds())
	}
	// In stream order, as a reader of the batch expects; the workers hand
	// their entries in whatever order they got to them.
	slices.SortFunc(entries, func(x, y *batchEntry) int {
		return cmp.Compare(x.d.meta.Sequence.Stream, y.d.meta.Sequence.Stream)
	})
	ids := make([]string, len(entries))
	es := make([]batch.Entry, len(entries))
	for i, e := range entries {
		ids[i] = strconv.FormatUint(e.d.meta.Sequence.Stream, 10)
		es[i] = entryOf(ids[i], e)
	}
	body := batch.Encode(make([]byte, 0, 512*len(entries)), es)
	h := http.Header{"Content-Type": {batch.ContentType}, batch.HeaderBatch: {strconv.Itoa(len(entries))}}
	span := r.startBatchSpan(entries, h)
	ctx, cancel := context.WithTimeout(r.ph.requests, r.o.HTTPTimeout)
	defer cancel()
	r.m.inflight.Inc()
	began := time.Now()
	var a *apphttp.Answer
	var err error
	if r.epErr != nil {
		err = &apphttp.AppError{Kind: apphttp.KindTransport, Err: r.epErr}
	} else {
		if r.o.Stamp != nil {
			r.o.Stamp(h, body)
		}
		a, err = r.app.Post(ctx, h, body, batchAnswerLimit)
	}
	took := time.Since(began)
	r.m.inflight.Dec()
	span.end(err)
	b.requests.WithLabelValues(resultLabel(err)).Inc()
	b.entries.Observe(float64(len(entries)))
	if err != nil {
		answerAll(batchResult{took: took, err: err})
		return
	}
	ans := batch.ReadAnswer(a.Body, a.Header.Get("Content-Type"), ids)
	if a.Cut {
		ans = batch.ReadAnswer([]byte("{"), "", ids) // unreadable: every entry retried
		ans.Problem = fmt.Sprintf("the answer is over %d bytes: every entry retried", batchAnswerLimit)
	}
	if ans.Problem != "" {
		r.log.Warn("cannot read all of the app's answer to a batch", "entries", len(entries), "status", a.Status, "problem", ans.Problem)
	}
	app := &apphttp.AppError{Kind: apphttp.KindStatus, Status: a.Status, RetryAfter: a.Header.Get("Retry-After")}
	for i, e := range entries {
		switch ans.Statuses[i] {
		case batch.Success:
			e.done <- batchResult{answer: &apphttp.Answer{Status: a.Status, Header: a.Header}, took: took}
		default:
			e.done <- batchResult{took: took, err: &entryError{status: ans.Statuses[i], app: app}}
		}
	}
}

// entryOf is e as the batch carries it: the message, its metadata, and the
// application headers it would have been sent with (courier's own are the
// entry's fields).
func entryOf(id string, e *batchEntry) batch.Entry {
	d := e.d
	h := make(http.Header, len(e.h))
	for name, vs := range e.h {
		if strings.HasPrefix(name, "Courier-") || name == HeaderIdempotencyKey || name == "Content-Type" {
			continue
		}
		h[name] = vs
	}
	return batch.Entry{
		ID: id, Key: d.key, Attempt: d.attempt, Subject: d.m.Subject(), Stream: d.meta.Stream,
		Sequence: d.meta.Sequence.Stream, Published: d.meta.Timestamp, ContentType: e.h.Get("Content-Type"),
		Header: h, Data: d.m.Data(),
	}
}

// classify is Classify, with an entry the app's answer to its batch
// refused: retried as a transient failure, or dropped as a permanent one.
func (r *Runner) classify(err error) apphttp.Class {
	var ee *entryError
	if errors.As(err, &ee) {
		if ee.status == batch.Drop {
			return apphttp.Permanent
		}
		return apphttp.Transient
	}
	return apphttp.Classify(err, r.o.Retryable)
}

// startBatchSpan starts the span of a batch request when tracing is on: a
// client span linked to each entry's attempt span, each of them linked to
// it in turn, whose context the request carries (traceparent on h). It
// returns nil when tracing is off.
func (r *Runner) startBatchSpan(entries []*batchEntry, h http.Header) *attemptSpan {
	if r.o.Tracer == nil {
		return nil
	}
	links := make([]trace.Link, 0, len(entries))
	for _, e := range entries {
		if e.span != nil {
			links = append(links, trace.LinkFromContext(e.span.ctx))
		}
	}
	ctx, span := r.o.Tracer.Start(context.Background(), "send "+r.o.Stream+" batch",
		trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.Int("messaging.batch.message_count", len(entries)),
			attribute.String("courier.stream", r.o.Stream),
		))
	for _, e := range entries {
		if e.span != nil {
			e.span.span.AddLink(trace.Link{SpanContext: span.SpanContext()})
		}
	}
	r.propagator().Inject(ctx, propagation.HeaderCarrier(h))
	return &attemptSpan{span: span, ctx: ctx}
}
