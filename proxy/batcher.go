package proxy

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/batch"
	"github.com/courierhq/courier/proxy/limit"
)

// Batches (Options.BatchMax > 1), as README's "Batches" describes them.
//
// Each message keeps its own delivery: dedup check, claim, span, breaker,
// settling. Where a single message would be sent, its worker hands the
// delivery to the batch gathering (handoff.go), whose answer settles it, or
// while the gate is closed or for the breaker's probe, adds its entry
// (submit) and waits for the entry's own result. Either way decide reads the
// entry's part as it reads the answer to a single request, so every promise
// holds per entry. The batcher gathers entries into one request
// (batch.Encode) until it holds BatchMax entries or BatchBytes of message
// data, or BatchWait after its first entry; sends at most MaxInflight
// batches at once, each one request to the rate limit; and gives each
// entry its part of the answer (batch.ReadAnswer). A non-2xx answer, or
// none, is every entry's.

// batchAnswerLimit bounds what is read of the app's answer to a batch: a
// status object per entry fits many times over.
const batchAnswerLimit = 4 << 20

// batchEntry is one delivery waiting for its part of a batch: a field of
// the delivery, answered on its worker's channel (lane.batchDone).
type batchEntry struct {
	d    *delivery
	h    http.Header  // its application headers (entryHeaders); nil: none
	ct   string       // its content type
	span *attemptSpan // nil: tracing off
	done chan result
	to   int // its target (routes.go): a batch holds one target's entries
	// ready is its delivery's checks (decider.goAhead), made once its
	// batch's waits are over, right before the batch is written.
	ready func() error
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

// batchAnswer is the app's answer to the entry's batch, for metrics.
func (e *entryError) batchAnswer() *apphttp.AppError { return e.app }

// gathering is a batch gathering: its entries and their message bytes;
// gen names it (the timer set for it sends only it); timer is nil until
// its first entry.
type gathering struct {
	cur   []*batchEntry
	size  int
	most  int // entries it may hold: max, or less (caps)
	gen   uint64
	timer *time.Timer
}

// batcher gathers deliveries into batch requests. The workers add their
// entries to the batch that is gathering, under mu, and the one whose entry
// fills it hands it on; a timer sends one that is not full BatchWait after
// its first entry. Run starts it and, once every worker has returned,
// stops it and waits for the batches in flight (stop). It holds no pointer
// to the runner: each entry's part of an answer goes to entryAnswerer,
// and requests go through the sender (send.go).
type batcher struct {
	s       *sender
	answers entryAnswerer
	hold    interface{ open() bool } // the holder (hold.go): whether the gate is open
	workers *sync.WaitGroup          // Run's: an entry handed off counts as a worker
	trace   *tracing
	log     *slog.Logger
	ph      *phases // set by start
	traced  bool    // an entry's headers carry its span's traceparent
	// keepAnswers: an entry's answer makes its success record.
	keepAnswers bool
	maxDeliver  int
	retryable   func(status int) bool
	max         int
	bytes       int
	wait        time.Duration
	// places bound what the workers and the batches hold: a message a
	// worker holds or an entry handed off (handoff.go).
	places chan struct{}
	// slots holds one sendBuf per batch request that may be in flight
	// (MaxInflight): a request takes one, and its buffers with it, and
	// keeps it until its entries' keys are recorded (batchRecords), after
	// its slot of the in-flight limit is given back.
	slots chan *sendBuf
	wg    sync.WaitGroup
	quit  chan struct{} // closed by stop: the watch on shutdown ends

	// The batches gathering, one per target (routes.go). now: courier is
	// stopping, every entry goes at once.
	mu        sync.Mutex
	gathering []gathering
	now       bool
	// caps holds, by stream sequence, the most entries the batch of a
	// message's next delivery may hold: half the batch it was in when
	// that failed as a whole (split). Kept in memory only: after a
	// restart, or on another replica, an entry goes in a full batch again,
	// but always alone on its last allowed delivery, which needs no memory.
	caps map[uint64]int

	// Batches as batches; their entries count as messages in every other
	// metric.
	requests *prometheus.CounterVec
	entries  prometheus.Histogram
}

// entryAnswerer is given each entry's part of its batch's answer
// (Runner.answer, handoff.go). Safe for concurrent use.
type entryAnswerer interface {
	answer(e *batchEntry, res result)
}

func newBatcher(o Options, s *sender, answers entryAnswerer, h *holder, workers *sync.WaitGroup, t *tracing, log *slog.Logger) *batcher {
	b := &batcher{
		s: s, answers: answers, hold: h, workers: workers, trace: t, log: log,
		traced: o.Tracer != nil, keepAnswers: o.Success != nil, maxDeliver: o.MaxDeliver, retryable: o.Retryable,
		max: o.BatchMax, bytes: o.BatchBytes, wait: o.BatchWait, caps: map[uint64]int{},
		gathering: make([]gathering, len(s.targets)),
		slots:     make(chan *sendBuf, o.MaxInflight), quit: make(chan struct{}),
		places: make(chan struct{}, o.MaxInflight*o.BatchMax),
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
	for range o.MaxInflight {
		b.slots <- &sendBuf{}
	}
	o.Registerer.MustRegister(b.requests, b.entries)
	return b
}

// headers are entryHeaders'.
func (b *batcher) headers(d *delivery) (http.Header, string, []apphttp.DroppedHeader) {
	return entryHeaders(d.m, b.traced)
}

// send hands d, with its application headers h and content type ct
// (entryHeaders), to the next batch and returns its part of the answer.
func (b *batcher) send(d *delivery, h http.Header, ct string, span *attemptSpan, ready func() error) (*apphttp.Answer, time.Duration, error) {
	res := b.submit(d, h, ct, span, ready)
	return res.answer, res.took, res.err
}

// submit is send's result.
func (b *batcher) submit(d *delivery, h http.Header, ct string, span *attemptSpan, ready func() error) result {
	if b.ph.requests.Err() != nil {
		return result{err: errNotSent}
	}
	e := &batchEntry{d: d, h: h, ct: ct, span: span, done: d.batchDone, ready: ready}
	if e.done == nil {
		e.done = make(chan result, 1)
	}
	b.add(e)
	return <-e.done // every entry added is answered
}

// add adds e to the batch gathering. A batch goes when full (entries or
// bytes: an entry that would take it over BatchBytes goes in the next one),
// BatchWait after its first entry, or at once once courier is stopping.
//
// An entry may cap the batch it goes in (capOf): the batch gathering goes
// first if it would hold more.
func (b *batcher) add(e *batchEntry) {
	n := len(e.d.m.Data())
	e.to = b.s.targetOf(e.d.m.Subject())
	b.mu.Lock()
	defer b.mu.Unlock()
	g := &b.gathering[e.to]
	most := b.capOf(e.d)
	if len(g.cur) > 0 && (g.size+n > b.bytes || len(g.cur)+1 > min(g.most, most)) {
		b.flushLocked(e.to)
	}
	if g.cur == nil {
		g.cur, g.most = make([]*batchEntry, 0, b.max), b.max
	}
	g.most = min(g.most, most)
	g.cur, g.size = append(g.cur, e), g.size+n
	switch {
	case len(g.cur) >= g.most || g.size >= b.bytes || b.now || b.wait <= 0:
		b.flushLocked(e.to)
	case len(g.cur) == 1:
		to, gen := e.to, g.gen
		g.timer = time.AfterFunc(b.wait, func() { b.flushGen(to, gen) })
	}
}

// capOf is the most entries the batch of d may hold: one on its last
// allowed delivery (a message that makes every batch fail is then
// dead-lettered after a request of its own, and none is dead-lettered for
// it), else what split left for it, else max. Called with mu held.
func (b *batcher) capOf(d *delivery) int {
	if d.last(b.maxDeliver) {
		return 1
	}
	seq := d.meta.Sequence.Stream
	if c, ok := b.caps[seq]; ok {
		delete(b.caps, seq)
		return c
	}
	return b.max
}

// maxCaps bounds the caps kept: past it they are forgotten, which costs
// only the splitting of batches; the last delivery still goes alone.
const maxCaps = 1 << 16

// split notes that entries failed as one batch, saying nothing of which
// failed: each goes again in a batch of at most half as many.
func (b *batcher) split(entries []*batchEntry) {
	half := max(len(entries)/2, 1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.caps)+len(entries) > maxCaps {
		clear(b.caps)
	}
	for _, e := range entries {
		b.caps[e.d.meta.Sequence.Stream] = half
	}
}

// flushGen sends target to's batch gen once its BatchWait is over, unless
// it went already.
func (b *batcher) flushGen(to int, gen uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gathering[to].gen == gen {
		b.flushLocked(to)
	}
}

// flushLocked sends target to's batch gathering, if it has entries, and
// starts the next. b.mu is held.
func (b *batcher) flushLocked(to int) {
	g := &b.gathering[to]
	if g.timer != nil {
		g.timer.Stop() // if it fired already, flushGen finds gen moved on
		g.timer = nil
	}
	g.gen++
	if len(g.cur) > 0 {
		b.sendBatch(g.cur)
	}
	g.cur, g.size = nil, 0
}

// start watches for shutdown (ph: Run's phases) until stop: once nothing
// new starts, what has gathered goes at once, and so does every entry from
// then on (a last delivery sent in the grace period).
func (b *batcher) start(ph *phases) {
	b.ph = ph
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		select {
		case <-b.ph.noStart.Done():
		case <-b.quit:
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		b.now = true
		for to := range b.gathering {
			b.flushLocked(to)
		}
	}()
}

// stop, once no entry can come (the workers have returned), waits for the
// batches in flight.
func (b *batcher) stop() {
	close(b.quit)
	b.wg.Wait()
}

// sendBatch sends entries as one batch once a slot is free.
func (b *batcher) sendBatch(entries []*batchEntry) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		buf := <-b.slots
		defer func() { b.slots <- buf }()
		b.deliver(entries, buf)
	}()
}

// sendBuf is what one batch request is built in, kept from one request to
// the next: the body (when the endpoint is done with it once Post returns,
// and it is not over maxKeptBody) and the entries.
type sendBuf struct {
	body    []byte
	entries []batch.Entry
	ids     []string
}

// maxKeptBody bounds the body buffer a sendBuf keeps between requests: a
// batch of large messages does not hold its memory for good.
const maxKeptBody = 256 << 10

// encode builds the body of entries, sorted, in buf: their ids (one string
// for all), the entries as the batch carries them, the JSON.
func (b *batcher) encode(entries []*batchEntry, buf *sendBuf) (body []byte, ids []string) {
	var idb []byte
	size := 0
	for _, e := range entries {
		idb = strconv.AppendUint(idb, e.d.meta.Sequence.Stream, 10)
		size += 512 + len(e.d.m.Data())*4/3
	}
	all := string(idb)
	ids, es := buf.ids[:0], buf.entries[:0]
	at := 0
	for _, e := range entries {
		n := len(strconv.AppendUint(idb[:0], e.d.meta.Sequence.Stream, 10))
		ids = append(ids, all[at:at+n])
		at += n
		es = append(es, entryOf(ids[len(ids)-1], e))
	}
	if cap(buf.body) < size {
		buf.body = make([]byte, 0, size)
	}
	body = batch.Encode(buf.body[:0], es)
	clear(es) // no message is held past its request
	buf.ids, buf.entries = ids, es[:0]
	return body, ids
}

// keep keeps body in buf for the next request, if the endpoint is done
// with it and it is not too large.
func (b *batcher) keep(buf *sendBuf, to target, body []byte) {
	buf.body = nil
	if to.err == nil && to.ep.BodyDone() && cap(body) <= maxKeptBody {
		buf.body = body[:0]
	}
}

// deliver sends one batch request, built in buf, and answers each entry.
// Once the request's waits are over, each entry's checks are made (admit):
// an entry they refuse is answered errRefused and left out; a batch left
// with none is not sent.
func (b *batcher) deliver(entries []*batchEntry, buf *sendBuf) {
	answerAll := func(res result) {
		for _, e := range entries {
			b.answers.answer(e, res)
		}
	}
	var (
		body []byte
		ids  []string
		span *attemptSpan
		ans  batch.Answer
		read bool // ans was read by outcome
	)
	a, took, err := b.s.post(b.ph.requests, request{
		to: entries[0].to, reason: limit.Batch, keep: batchAnswerLimit,
		ready: func() (http.Header, []byte, error) {
			if entries = b.admit(entries); len(entries) == 0 {
				return nil, nil, errRefused
			}
			// In stream order, as a reader of the batch expects; the
			// workers hand their entries in whatever order they got to
			// them.
			slices.SortFunc(entries, func(x, y *batchEntry) int {
				return cmp.Compare(x.d.meta.Sequence.Stream, y.d.meta.Sequence.Stream)
			})
			body, ids = b.encode(entries, buf)
			h := http.Header{"Content-Type": {batch.ContentType}, batch.HeaderBatch: {strconv.Itoa(len(entries))}}
			span = b.trace.startBatch(len(entries), func(i int) *attemptSpan { return entries[i].span }, h)
			return h, body, nil
		},
		outcome: func(a *apphttp.Answer) limit.Outcome {
			// Read once, here, for the limit and the entries: a batch
			// whose entries all failed is no fast success.
			ans, read = b.readAnswer(a, ids), true
			return batchOutcome(ans)
		},
	})
	switch {
	case errors.Is(err, errRefused):
		return // every entry was answered by admit
	case errors.Is(err, errNotSent):
		answerAll(result{err: errNotSent}) // the grace period is over
		return
	}
	b.keep(buf, b.s.targets[entries[0].to], body)
	span.end(err)
	b.requests.WithLabelValues(resultLabel(err)).Inc()
	b.entries.Observe(float64(len(entries)))
	if err != nil {
		if c := b.failedWhole(err); c != apphttp.Success && len(entries) > 1 {
			b.split(entries)
			if c == apphttp.Permanent {
				err = &splitError{err: err, entries: len(entries)}
			}
		}
		answerAll(result{took: took, err: err})
		return
	}
	if !read {
		ans = b.readAnswer(a, ids)
	}
	if ans.Problem != "" {
		b.log.Warn("cannot read all of the app's answer to a batch", "entries", len(entries), "status", a.Status, "problem", ans.Problem)
	}
	if ans.Whole && len(entries) > 1 {
		b.split(entries)
	}
	// The slot is kept until the keys of the entries that succeeded are
	// recorded and acked: what a kill repeats is then at most the batches
	// at the app, not also those answered and not yet recorded.
	recs := &batchRecords{all: make(chan struct{})}
	for _, st := range ans.Statuses {
		if st == batch.Success {
			recs.left.Add(1)
		}
	}
	defer b.awaitRecords(recs)
	var app *apphttp.AppError
	for i, e := range entries {
		switch ans.Statuses[i] {
		case batch.Success:
			var each *apphttp.Answer // what a success record is made of
			if b.keepAnswers {
				each = &apphttp.Answer{Status: a.Status, Header: a.Header}
			}
			e.d.records = recs
			b.answers.answer(e, result{answer: each, took: took})
		default:
			if app == nil {
				app = &apphttp.AppError{Kind: apphttp.KindStatus, Status: a.Status, RetryAfter: a.Header.Get("Retry-After")}
			}
			b.answers.answer(e, result{took: took, err: &entryError{status: ans.Statuses[i], app: app}})
		}
	}
}

// admit makes each entry's checks, once its batch's waits are over, and
// returns those that may go. Those refused are answered errRefused on a
// goroutine of their own: nothing here waits between the checks and the
// write.
func (b *batcher) admit(entries []*batchEntry) []*batchEntry {
	var refused []*batchEntry
	kept := entries[:0]
	for _, e := range entries {
		if e.ready != nil && e.ready() != nil {
			refused = append(refused, e)
			continue
		}
		kept = append(kept, e)
	}
	if len(refused) > 0 {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			for _, e := range refused {
				b.answers.answer(e, result{err: errRefused})
			}
		}()
	}
	return kept
}

// batchOutcome is what a batch's 2xx answer tells the limit: a success
// only if an entry succeeded; entries the app all asked to retry or
// dropped are a failure, not a fast answer.
func batchOutcome(ans batch.Answer) limit.Outcome {
	for _, st := range ans.Statuses {
		if st == batch.Success {
			return limit.Success
		}
	}
	return limit.Failed
}

// readAnswer reads the app's 2xx answer a to a batch of the entries ids.
func (b *batcher) readAnswer(a *apphttp.Answer, ids []string) batch.Answer {
	if a.Cut {
		ans := batch.ReadAnswer([]byte("{"), "", ids) // unreadable: every entry retried
		ans.Problem = fmt.Sprintf("the answer is over %d bytes: every entry retried", batchAnswerLimit)
		return ans
	}
	return batch.ReadAnswer(a.Body, a.Header.Get("Content-Type"), ids)
}

// failedWhole returns how err, a batch request's, classifies if it says
// the batch failed as a whole (Transient or Permanent): the app answered
// it with a status, or the request timed out or lost its connection after
// it was sent. Else Success: the app could not be reached, or courier did
// not send it, and no entry failed.
func (b *batcher) failedWhole(err error) apphttp.Class {
	if errors.Is(err, errNotSent) || b.ph.requests.Err() != nil {
		return apphttp.Success
	}
	switch c := apphttp.Classify(err, b.retryable); c {
	case apphttp.Transient, apphttp.Permanent:
		return c
	}
	return apphttp.Success
}

// maxRecordWait bounds how long a batch's slot waits for its entries'
// keys to be recorded: an entry whose success record cannot be stored yet
// is held, and must not hold the slot.
const maxRecordWait = 5 * time.Second

// awaitRecords waits until every entry of recs is recorded and acked, at
// most maxRecordWait, or until the grace period is over.
func (b *batcher) awaitRecords(recs *batchRecords) {
	if recs.left.Load() == 0 {
		return
	}
	t := time.NewTimer(maxRecordWait)
	defer t.Stop()
	select {
	case <-recs.all:
	case <-t.C:
	case <-b.ph.requests.Done():
	}
}

// splitError is the answer to a batch of several entries that failed as a
// whole with an answer that would end a single message (a 4xx): as it
// says nothing of which entry the app refused, each entry is retried, in a
// batch of at most half as many (split), and only an entry sent alone is
// rejected. It does not count towards the breaker: the app answered.
type splitError struct {
	err     error
	entries int
}

func (e *splitError) Error() string {
	return fmt.Sprintf("the batch of %d entries failed as a whole (%v): each goes again in a smaller batch", e.entries, e.err)
}

func (e *splitError) Unwrap() error { return e.err }

// entryOf is e as the batch carries it: the message, its metadata, and its
// application headers (courier's own are the entry's fields).
func entryOf(id string, e *batchEntry) batch.Entry {
	d := e.d
	return batch.Entry{
		ID: id, Key: d.key, Attempt: d.attempt, Subject: d.m.Subject(), Stream: d.meta.Stream,
		Sequence: d.meta.Sequence.Stream, Published: d.meta.Timestamp, ContentType: e.ct, Replay: d.replay,
		Header: e.h, Data: d.m.Data(),
	}
}

// entryHeaders returns the headers of m's entry in a batch: those its
// request alone would carry of its own (BuildHeaders: not NATS's, not what
// HTTP cannot carry, which are returned as dropped; not courier's Courier-*
// and Idempotency-Key, which are the entry's fields), and its content type
// (application/octet-stream if it has none), which is a field too. The map
// is nil when there are none, unless traced: the span's traceparent goes
// in it.
func entryHeaders(m jetstream.Msg, traced bool) (http.Header, string, []apphttp.DroppedHeader) {
	src := m.Headers()
	n := 0
	for name := range src {
		if !apphttp.IsNATSHeader(name) {
			n++
		}
	}
	if n == 0 && !traced {
		return nil, "application/octet-stream", nil
	}
	h := make(http.Header, n+2)
	dropped := apphttp.AppHeaders(h, src, false)
	ct := h.Get("Content-Type")
	if ct == "" {
		ct = "application/octet-stream"
	}
	for name := range h {
		if strings.HasPrefix(name, "Courier-") || name == "Content-Type" {
			delete(h, name)
		}
	}
	return h, ct, dropped
}

// classify is Classify, with an entry the app's answer to its batch
// refused: retried as a transient failure, or dropped as a permanent one.
func classify(err error, retryable func(status int) bool) apphttp.Class {
	if err == nil {
		return apphttp.Success // before errors.As, whose target escapes
	}
	var ee *entryError
	if errors.As(err, &ee) {
		if ee.status == batch.Drop {
			return apphttp.Permanent
		}
		return apphttp.Transient
	}
	if se := (*splitError)(nil); errors.As(err, &se) {
		return apphttp.Transient
	}
	return apphttp.Classify(err, retryable)
}
