package publish

// A batch of publishes in one request: POST BatchPath, each entry naming
// its subject, or BatchPath/<subject>, the subject of the entries that name
// none. Its body is the shape courier delivers batches in (SPEC behaviour
// 22), so that an app can publish an entry as it received one:
//
//	{"entries":[{"entryId":"a","subject":"orders.paid","idempotencyKey":"order-42-paid",
//	  "contentType":"application/json","headers":{"X-Tenant":["7"]},"data":{"order":42}},
//	 {"entryId":"b","dataBase64":"aGk="}]}
//
// The whole batch is checked before anything is published: a request that
// cannot be read, or an entry that could never be stored as it is (a
// subject outside the allowed ones, a Nats-* header courier does not pass,
// a header NATS cannot carry, too large), refuses the batch with the status
// a single publish would get and the entry named, and nothing is stored. Then every entry is published
// at once, as its own message with its own acknowledgement and courier's
// retries, and the answer lists each entry's outcome in the order sent:
//
//	{"entries":[{"entryId":"a","status":200,"stream":"ORDERS","seq":12,"duplicate":false},
//	 {"entryId":"b","status":503,"error":"no acknowledgement within 10s: ..."}]}
//
// It is 200 only when every entry was stored; otherwise 503 with
// Retry-After when any entry may succeed if sent again, else the first
// failed entry's status, with "error" saying how many were not stored. A
// failure is never swallowed: the status says one happened, the entries
// which. Entries with an idempotencyKey can be sent again as they are;
// courier's own ids (for entries without one) hold only within one request.
// An entry whose headers hold Courier-Delay or Courier-Deliver-At is
// delivered later (delayed.go): its answer is 202 with "schedule" and
// "deliver_at", and it counts as stored.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natshdr"
)

// BatchPath is where batches are served: POST BatchPath, or BatchPath +
// "/" + the subject of the entries that name none.
const BatchPath = "/v1/publish-batch"

// maxBatchEntries bounds a batch's entries, and with them the slots one
// request takes of Options.MaxConcurrent.
const maxBatchEntries = 128

// maxBatches bounds the batch requests in progress at once, and with them
// the bodies courier holds (each at most Options.MaxBatchBytes); one more
// is answered 503 busy at once.
const maxBatches = 64

// batchBody is a batch request's body.
type batchBody struct {
	Entries []batchEntry `json:"entries"`
}

// batchEntry is one message of a batch.
type batchEntry struct {
	EntryID        string              `json:"entryId"`
	Subject        string              `json:"subject"`
	IdempotencyKey string              `json:"idempotencyKey"`
	ContentType    string              `json:"contentType"`
	Headers        map[string][]string `json:"headers"`
	Data           json.RawMessage     `json:"data"`
	DataBase64     *string             `json:"dataBase64"`
	// What courier's delivered entries also carry, read and ignored, so
	// that a received entry can be published as it is; any other field
	// is refused (a misspelt idempotencyKey would otherwise be lost).
	Attempt   json.RawMessage `json:"attempt"`
	Stream    json.RawMessage `json:"stream"`
	Sequence  json.RawMessage `json:"sequence"`
	Published json.RawMessage `json:"published"`
	// dataB64 is dataBase64 as decodeBatch found it, not yet decoded
	// (non-nil when given), in place of DataBase64.
	dataB64 []byte
}

// entryAnswer is one entry's part of the answer.
type entryAnswer struct {
	EntryID   string `json:"entryId"`
	Status    int    `json:"status"`
	Stream    string `json:"stream,omitempty"`
	Seq       uint64 `json:"seq,omitempty"`
	Duplicate *bool  `json:"duplicate,omitempty"`
	// Schedule and DeliverAt answer a delayed entry (202), as a single
	// delayed publish's answer does.
	Schedule  string `json:"schedule,omitempty"`
	DeliverAt string `json:"deliver_at,omitempty"`
	Error     string `json:"error,omitempty"`
}

// batchAnswer is the answer to a batch that was published.
type batchAnswer struct {
	Entries []entryAnswer `json:"entries"`
	Error   string        `json:"error,omitempty"`
}

// pending is a checked entry, ready to publish.
type pending struct {
	id        string
	m         *nats.Msg
	generated bool        // courier made its Nats-Msg-Id
	carrier   http.Header // where its trace context comes from
	// delayed entries are delivered at at (Courier-Delay or
	// Courier-Deliver-At; delayed.go).
	delayed bool
	at      time.Time
}

func (s *Server) serveBatch(w http.ResponseWriter, r *http.Request, subj string) {
	start := time.Now()
	deadline := start.Add(s.o.Timeout)
	// The bodies and entries held at once are bounded by the batches in
	// progress.
	var entries []pending
	var refused *result
	select {
	case s.batches <- struct{}{}:
		entries, refused = s.checkBatch(r, subj, deadline)
		if refused != nil {
			// Given back before the refusal is answered or counted, so that
			// whoever sees either finds the batch gone.
			<-s.batches
		} else {
			defer func() { <-s.batches }()
		}
	default:
		refused = &result{status: http.StatusServiceUnavailable, outcome: outcomeBusy,
			msg: fmt.Sprintf("courier busy: %d batches in progress", cap(s.batches))}
	}
	if refused != nil {
		s.answer(w, *refused)
		s.m.observe(refused.outcome, time.Since(start).Seconds())
		if s.log.Enabled(r.Context(), slog.LevelDebug) {
			s.log.Debug("publish batch refused", "status", refused.status, "outcome", refused.outcome, "reason", refused.msg)
		}
		return
	}
	defer s.release(len(entries))
	results := s.publishBatch(r, entries, deadline)
	elapsed := time.Since(start).Seconds()
	for _, res := range results {
		s.m.observe(res.outcome, elapsed)
	}
	s.m.batchSize.Observe(float64(len(entries)))
	status, ans := batchOutcome(entries, results)
	h := w.Header()
	h["Content-Type"] = s.hdr.contentType
	h["Cache-Control"] = s.hdr.cacheControl
	if status == http.StatusServiceUnavailable {
		h["Retry-After"] = s.hdr.retryAfter
	}
	body, err := json.Marshal(ans)
	if err != nil { // strings and numbers only: cannot happen
		body = []byte(`{"error":"encoding the answer failed"}`)
	}
	h["Content-Length"] = []string{strconv.Itoa(len(body) + 1)}
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
	if s.log.Enabled(r.Context(), slog.LevelDebug) {
		s.log.Debug("published batch", "entries", len(entries), "status", status, "error", ans.Error)
	}
}

// checkBatch decides everything about a batch that needs no publish: the
// token, the path's subject, the body, each entry, the slots and the
// connection. It returns the entries ready to publish, holding a slot each
// (the caller releases them), or the refusal of the whole request.
func (s *Server) checkBatch(r *http.Request, pathSubj string, deadline time.Time) ([]pending, *result) {
	if res := s.admit(r); res != nil {
		return nil, res
	}
	if pathSubj != "" {
		if err := s.allowed(pathSubj); err != nil {
			return nil, refuseAll(err)
		}
	}
	entries, err := s.readBatch(r, pathSubj)
	if err != nil {
		return nil, refuseAll(err)
	}
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()
	if !s.acquire(len(entries), ctx.Done()) {
		if r.Context().Err() != nil {
			return nil, &result{status: http.StatusServiceUnavailable, outcome: outcomeCanceled, msg: "the request ended before its turn"}
		}
		return nil, s.busy()
	}
	if err := s.waitConnected(ctx, deadline); err != nil {
		s.release(len(entries))
		res := s.timedOut(r.Context(), err)
		return nil, &res
	}
	if err := checkSizes(entries, s.nc.MaxPayload()); err != nil {
		s.release(len(entries))
		return nil, refuseAll(err)
	}
	return entries, nil
}

// refuseAll is the answer refusing a whole request with err.
func refuseAll(err error) *result {
	res := fail(err)
	return &res
}

// acquire takes n slots of Options.MaxConcurrent, all or none. With a nil
// done it takes only what is free now; else it waits for them until done
// is closed, one caller waiting at a time, so that two batches never hold
// part of what each needs.
func (s *Server) acquire(n int, done <-chan struct{}) bool {
	if done != nil {
		select {
		case s.turn <- struct{}{}:
			defer func() { <-s.turn }()
		case <-done:
			return false
		}
	}
	for i := range n {
		select {
		case s.slots <- struct{}{}:
			continue
		default:
		}
		if done != nil {
			select {
			case s.slots <- struct{}{}:
				continue
			case <-done:
			}
		}
		for range i {
			<-s.slots
		}
		return false
	}
	s.m.inflight.Add(float64(n))
	return true
}

// release gives back n slots acquire took.
func (s *Server) release(n int) {
	for range n {
		<-s.slots
	}
	s.m.inflight.Sub(float64(n))
}

// maxEntries is the most entries a batch may carry: maxBatchEntries, or
// fewer when Options.MaxConcurrent is smaller (a batch needs a slot each).
func (s *Server) maxEntries() int { return min(maxBatchEntries, s.o.MaxConcurrent) }

// busy is the answer when the slots are taken.
func (s *Server) busy() *result {
	return &result{status: http.StatusServiceUnavailable, outcome: outcomeBusy,
		msg: fmt.Sprintf("courier busy: %d publishes in progress", s.o.MaxConcurrent)}
}

// readBatch reads and checks a batch's body: JSON of the batch's shape, at
// most Options.MaxBatchBytes and maxBatchEntries, each entry a message
// courier may publish (its subject allowed, its headers passed, its data
// given once), the entryIds distinct. Entries without an entryId are
// given their position ("0", "1", ...).
func (s *Server) readBatch(r *http.Request, pathSubj string) ([]pending, error) {
	limit := s.o.MaxBatchBytes
	tooLarge := func() error {
		return refuse(http.StatusRequestEntityTooLarge, outcomeTooLarge, "the batch is larger than %d bytes: send fewer entries a request", limit)
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	notJSON := func(err error) error {
		return refuse(http.StatusBadRequest, outcomeInvalid, `the batch is not JSON of the shape {"entries":[{"subject","idempotencyKey","contentType","headers","data" or "dataBase64"}]}: %v`, err)
	}
	body, err := readAll(http.MaxBytesReader(nil, r.Body, limit), r.ContentLength)
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		return nil, tooLarge()
	}
	if err != nil {
		return nil, notJSON(err)
	}
	// decodeBatch leaves the entries' data in body; encoding/json, for
	// the bodies it leaves, copies them. Both stop at the entry past the
	// most a request may carry.
	most := s.maxEntries()
	b, ok := decodeBatch(body, most)
	if !ok {
		b, err = decodeBatchJSON(body, most)
		switch {
		case errors.Is(err, errTrailing):
			return nil, refuse(http.StatusBadRequest, outcomeInvalid, "%v", err)
		case err != nil:
			return nil, notJSON(err)
		}
	}
	switch {
	case len(b.Entries) == 0:
		return nil, refuse(http.StatusBadRequest, outcomeInvalid, `the batch has no entries: send {"entries":[...]}`)
	case len(b.Entries) > most:
		return nil, refuse(http.StatusRequestEntityTooLarge, outcomeTooLarge, "the batch has more than the %d entries a request may carry: split it", most)
	}
	out := make([]pending, len(b.Entries))
	seen := make(map[string]int, len(b.Entries))
	for i := range b.Entries {
		e := &b.Entries[i]
		if e.EntryID == "" {
			e.EntryID = strconv.Itoa(i)
		}
		if j, dup := seen[e.EntryID]; dup {
			return nil, refuse(http.StatusBadRequest, outcomeInvalid, "entries %d and %d have the same entryId %q: each needs its own", j, i, e.EntryID)
		}
		seen[e.EntryID] = i
		p, err := s.entryMsg(r, e, pathSubj)
		if err != nil {
			var ref *refusal
			if errors.As(err, &ref) {
				ref.msg = fmt.Sprintf("entry %d (entryId %q): %s", i, e.EntryID, ref.msg)
			}
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}

// entryMsg makes an entry's message, with the rules of a single publish:
// its subject allowed, its headers as messageHeaders takes a request's
// (idempotencyKey as Idempotency-Key, contentType as Content-Type).
func (s *Server) entryMsg(r *http.Request, e *batchEntry, pathSubj string) (pending, error) {
	subj := e.Subject
	if subj == "" {
		subj = pathSubj
	}
	if subj == "" {
		return pending{}, refuse(http.StatusBadRequest, outcomeInvalid, "no subject: name it in the entry or in the path (%s/<subject>)", BatchPath)
	}
	if err := s.allowed(subj); err != nil {
		return pending{}, err
	}
	b64 := e.dataB64
	if e.DataBase64 != nil {
		b64 = []byte(*e.DataBase64)
	}
	var data []byte
	switch {
	case len(e.Data) > 0 && b64 != nil:
		return pending{}, refuse(http.StatusBadRequest, outcomeInvalid, "both data and dataBase64: give the body once")
	case len(e.Data) > 0:
		data = e.Data
	case b64 != nil:
		data = make([]byte, base64.StdEncoding.DecodedLen(len(b64)))
		n, err := base64.StdEncoding.Decode(data, b64)
		if err != nil {
			return pending{}, refuse(http.StatusBadRequest, outcomeInvalid, "dataBase64 is not standard base64: %v", err)
		}
		data = data[:n:n]
	}
	src := make(http.Header, len(e.Headers)+2)
	for k, vs := range e.Headers {
		canon := http.CanonicalHeaderKey(k)
		src[canon] = append(src[canon], vs...)
	}
	if e.IdempotencyKey != "" {
		if len(src[HeaderIdempotencyKey]) > 0 {
			return pending{}, refuse(http.StatusBadRequest, outcomeInvalid, "idempotencyKey and an %s header: send one of them", HeaderIdempotencyKey)
		}
		src[HeaderIdempotencyKey] = []string{e.IdempotencyKey}
	}
	if e.ContentType != "" {
		if ct := src["Content-Type"]; len(ct) > 0 && (len(ct) > 1 || ct[0] != e.ContentType) {
			return pending{}, refuse(http.StatusBadRequest, outcomeInvalid, "contentType %q and a Content-Type header %q: send one of them", e.ContentType, ct)
		}
		src["Content-Type"] = []string{e.ContentType}
	}
	h, generated, err := messageHeaders(src)
	if err != nil {
		return pending{}, err
	}
	at, delayed, err := takeDelay(h, time.Now())
	if err != nil {
		return pending{}, err
	}
	carrier := r.Header
	if len(src["Traceparent"]) > 0 {
		carrier = src
	}
	return pending{id: e.EntryID, m: &nats.Msg{Subject: subj, Header: h, Data: data}, generated: generated, carrier: carrier,
		delayed: delayed, at: at}, nil
}

// checkSizes refuses (413) a batch with an entry larger than the server's
// max_payload, headers included, before any entry is published.
func checkSizes(entries []pending, maxPayload int64) error {
	for i, p := range entries {
		if size := int64(len(p.m.Data) + natshdr.Size(p.m.Header)); size > maxPayload {
			return refuse(http.StatusRequestEntityTooLarge, outcomeTooLarge,
				"entry %d (entryId %q): the message is %d bytes with its headers, more than the server's max_payload (%d bytes)", i, p.id, size, maxPayload)
		}
	}
	return nil
}

// publishBatch publishes every entry at once, each as a single publish is
// (its own acknowledgement, courier's retries until deadline), and returns
// their results in order. The first attempts go out together from this
// goroutine, as asynchronous publishes whose acknowledgements are awaited
// side by side; only an entry that needs another attempt gets a goroutine
// of its own (again: a single publish's retries).
func (s *Server) publishBatch(r *http.Request, entries []pending, deadline time.Time) []result {
	reqCtx := r.Context()
	results := make([]result, len(entries))
	spans := make([]*span, len(entries))
	futures := make([]jetstream.PubAckFuture, len(entries))
	errs := make([]error, len(entries))
	connected := s.nc.IsConnected()
	var wg sync.WaitGroup
	maxPayload := s.nc.MaxPayload()
	for i, p := range entries {
		spans[i] = s.startSpan(reqCtx, p.carrier, p.m)
		if p.delayed { // its stream is checked first: a publish of its own
			wg.Go(func() { results[i] = s.publishDelayed(reqCtx, deadline, p.m, p.generated, p.at, maxPayload) })
			continue
		}
		if !connected {
			errs[i] = &transient{errNotConnected}
			continue
		}
		futures[i], errs[i] = s.async.PublishMsgAsync(p.m, s.pubOpts...)
	}
	// An attempt's time, as a single publish's (attempt).
	wait := min(time.Until(deadline), attemptTimeout)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	expired := false
	maybeStored := make([]bool, len(entries))
	for i, f := range futures {
		if f == nil {
			continue
		}
		var ack *jetstream.PubAck
		if !expired {
			select {
			case ack = <-f.Ok():
			case errs[i] = <-f.Err():
			case <-timer.C:
				expired = true
			case <-reqCtx.Done():
				expired = true
			}
		}
		if expired && ack == nil && errs[i] == nil {
			select {
			case ack = <-f.Ok():
			case errs[i] = <-f.Err():
			default:
				errs[i] = &transient{errors.New("no acknowledgement within " + wait.String())}
				maybeStored[i] = true
			}
		}
		if ack != nil {
			results[i] = acknowledged(ack, entries[i].generated, false)
		}
	}
	for i, err := range errs {
		if err == nil {
			continue
		}
		wg.Go(func() {
			results[i] = s.again(reqCtx, deadline, entries[i], err, maybeStored[i])
		})
	}
	wg.Wait()
	for i, sp := range spans {
		sp.end(results[i])
	}
	return results
}

// again decides an entry whose first attempt failed with err as a single
// publish's is decided (judge, then settle); an err already *transient
// (not connected, no ack in time) needs no judging.
func (s *Server) again(reqCtx context.Context, deadline time.Time, p pending, err error, maybeStored bool) result {
	var tr *transient
	if !errors.As(err, &tr) {
		ctx, cancel := context.WithDeadline(reqCtx, deadline)
		err = s.judge(ctx, p.m, err, &maybeStored)
		cancel()
	}
	return s.settle(reqCtx, deadline, p.m, p.generated, nil, err, maybeStored)
}

// batchOutcome is the status and body answering a published batch: 200
// when every entry was stored; else 503 when any entry may be stored if
// sent again, or the first failed entry's status.
func batchOutcome(entries []pending, results []result) (int, batchAnswer) {
	ans := batchAnswer{Entries: make([]entryAnswer, len(entries))}
	status, failed, first := http.StatusOK, 0, -1
	for i, res := range results {
		e := entryAnswer{EntryID: entries[i].id, Status: res.status}
		if res.ack != nil {
			dup := res.dup
			e.Stream, e.Seq, e.Duplicate = res.ack.Stream, res.ack.Sequence, &dup
		} else {
			e.Error = res.msg
		}
		if res.sched != nil {
			e.Schedule = res.sched.id.String()
			if !res.sched.at.IsZero() { // none: a duplicate of one delivered or cancelled
				e.DeliverAt = res.sched.at.UTC().Format(time.RFC3339Nano)
			}
		}
		ans.Entries[i] = e
		if res.status == http.StatusOK || res.status == http.StatusAccepted {
			continue
		}
		failed++
		if first < 0 {
			first, status = i, res.status
		}
		if res.status == http.StatusServiceUnavailable {
			status = res.status
		}
	}
	if failed > 0 {
		ans.Error = fmt.Sprintf("%d of %d entries not stored (the entries say which); the first, entryId %q: %s",
			failed, len(entries), entries[first].id, results[first].msg)
	}
	return status, ans
}
