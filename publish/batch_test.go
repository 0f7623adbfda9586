package publish

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/trace"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

// batchReply is the API's answer to a batch.
type batchReply struct {
	status     int
	retryAfter string
	Entries    []struct {
		EntryID   string `json:"entryId"`
		Status    int    `json:"status"`
		Stream    string `json:"stream"`
		Seq       uint64 `json:"seq"`
		Duplicate *bool  `json:"duplicate"`
		Schedule  string `json:"schedule"`
		DeliverAt string `json:"deliver_at"`
		Error     string `json:"error"`
	} `json:"entries"`
	Error string `json:"error"`
}

// postBatch POSTs body to BatchPath + suffix with headers (name, value
// pairs).
func (a *api) postBatch(suffix, body string, headers ...string) batchReply {
	a.t.Helper()
	b, err := a.tryBatch(suffix, body, headers...)
	if err != nil {
		a.t.Fatalf("POST %s%s: %v", BatchPath, suffix, err)
	}
	return b
}

// tryBatch is postBatch returning a transport error instead of failing.
func (a *api) tryBatch(suffix, body string, headers ...string) (batchReply, error) {
	return a.sendBatch(suffix, strings.NewReader(body), headers...)
}

// sendBatch is tryBatch with the body read from body: its length declared
// only if net/http can tell it (a *strings.Reader), else sent chunked.
func (a *api) sendBatch(suffix string, body io.Reader, headers ...string) (batchReply, error) {
	req, err := http.NewRequest(http.MethodPost, a.url+BatchPath+suffix, body)
	if err != nil {
		return batchReply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return batchReply{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return batchReply{}, err
	}
	r := batchReply{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	if err := json.Unmarshal(raw, &r); err != nil {
		a.t.Errorf("answer %d %q: not JSON: %v", resp.StatusCode, raw, err)
	}
	return r, nil
}

// keyedBatch is a batch of n entries with keys prefix-0... and their keys
// as their data (JSON strings).
func keyedBatch(prefix string, n int) string {
	var b strings.Builder
	b.WriteString(`{"entries":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"idempotencyKey":%q,"data":%q}`, fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("%s-%d", prefix, i))
	}
	b.WriteString(`]}`)
	return b.String()
}

// TestBatchStored: every entry of a batch is stored as its own message,
// with its subject (the entry's, else the path's), its data (JSON as it is,
// or base64 decoded), its headers, its content type and its key as
// Nats-Msg-Id; the answer lists each entry's stream and sequence in order,
// entryIds defaulting to the position, and each entry counts as a publish.
func TestBatchStored(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{})

	body := `{"entries":[
	  {"entryId":"a","idempotencyKey":"order-42-paid","contentType":"application/json","headers":{"x-tenant":["7"],"traceparent":["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]},"data":{"order":42}},
	  {"subject":"orders.refunded","dataBase64":"` + base64.StdEncoding.EncodeToString([]byte("\x00binary\xff")) + `","headers":{"Nats-Expected-Stream":["ORDERS"]}},
	  {"entryId":"c","attempt":1,"stream":"IN","sequence":9,"published":"2026-12-02T10:00:00Z","data":"as received"}
	]}`
	r := a.postBatch("/orders.paid", body)
	if r.status != 200 || r.Error != "" || len(r.Entries) != 3 {
		t.Fatalf("answer %d %q, %d entries", r.status, r.Error, len(r.Entries))
	}
	for i, want := range []string{"a", "1", "c"} {
		e := r.Entries[i]
		if e.EntryID != want || e.Status != 200 || e.Stream != "ORDERS" || e.Seq != uint64(i+1) || e.Duplicate == nil || *e.Duplicate || e.Error != "" {
			t.Errorf("entry %d: %+v", i, e)
		}
	}
	m := stored(t, js, "ORDERS", 1)
	if m.Subject != "orders.paid" || string(m.Data) != `{"order":42}` || m.Header.Get(nats.MsgIdHdr) != "order-42-paid" ||
		m.Header.Get("X-Tenant") != "7" || m.Header.Get("Content-Type") != "application/json" ||
		m.Header.Get("traceparent") != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Errorf("entry a stored on %s as %q with %v", m.Subject, m.Data, m.Header)
	}
	m = stored(t, js, "ORDERS", 2)
	if m.Subject != "orders.refunded" || string(m.Data) != "\x00binary\xff" || !strings.HasPrefix(m.Header.Get(nats.MsgIdHdr), generatedIDPrefix) {
		t.Errorf("entry 1 stored on %s as %q with %v", m.Subject, m.Data, m.Header)
	}
	if m = stored(t, js, "ORDERS", 3); string(m.Data) != `"as received"` || m.Header.Get("Attempt") != "" {
		t.Errorf("entry c stored as %q with %v", m.Data, m.Header)
	}
	if a.count(outcomeStored) != 3 {
		t.Errorf("stored counted %v, want 3 (one per entry)", a.count(outcomeStored))
	}
	if n := testutil.CollectAndCount(a.srv.m.batchSize); n != 1 {
		t.Errorf("batch size histogram: %d series", n)
	}
	if got := histogramSum(t, a, "courier_publish_batch_entries"); got != 3 {
		t.Errorf("batch entries observed %v, want 3", got)
	}
	if value(a.srv.m.inflight) != 0 || len(a.srv.slots) != 0 {
		t.Errorf("after the batch: inflight %v, slots held %d", value(a.srv.m.inflight), len(a.srv.slots))
	}
}

// histogramSum is the sum of the histogram name on a's registry.
func histogramSum(t *testing.T, a *api, name string) float64 {
	t.Helper()
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleSum()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

// TestBatchIdempotent: a batch sent again with the same keys is answered
// 200 with every entry a duplicate of the sequence first named, and
// nothing more is stored; a batch mixing sent and new entries stores only
// the new.
func TestBatchIdempotent(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{})

	first := a.postBatch("/orders.created", keyedBatch("k", 10))
	again := a.postBatch("/orders.created", keyedBatch("k", 10))
	if first.status != 200 || again.status != 200 {
		t.Fatalf("answers %d %q, %d %q", first.status, first.Error, again.status, again.Error)
	}
	for i := range 10 {
		f, g := first.Entries[i], again.Entries[i]
		if *f.Duplicate || !*g.Duplicate || g.Seq != f.Seq {
			t.Errorf("entry %d: first %+v, again %+v", i, f, g)
		}
	}
	more := a.postBatch("/orders.created", keyedBatch("k", 15))
	if more.status != 200 || msgCount(t, js, "ORDERS") != 15 {
		t.Fatalf("mixed batch %d %q; %d stored, want 15", more.status, more.Error, msgCount(t, js, "ORDERS"))
	}
	for i, e := range more.Entries {
		if *e.Duplicate != (i < 10) {
			t.Errorf("entry %d of the mixed batch: %+v", i, e)
		}
	}
	if a.count(outcomeDuplicate) != 20 || a.count(outcomeStored) != 15 {
		t.Errorf("duplicates %v, stored %v", a.count(outcomeDuplicate), a.count(outcomeStored))
	}
}

// TestBatchRefusals: a batch that cannot be read, or with an entry that
// could never be stored as it is, is refused whole with the status a
// single publish would get and an error naming the entry; nothing of it is
// stored and no slot stays taken.
func TestBatchRefusals(t *testing.T) {
	srv, js := smallPayloadOrders(t)
	a := startAPI(t, srv.ClientURL(), Options{Subjects: []string{"orders.>", "$JS.>"}, MaxBatchBytes: 64 << 10})

	ok := `{"data":1}`
	big := fmt.Sprintf(`{"data":"%s"}`, strings.Repeat("x", maxPayload))
	tests := []struct {
		name, path, body string
		status           int
		outcome, want    string
	}{
		{"not JSON", "/orders.x", `{"entries":[`, 400, outcomeInvalid, "not JSON of the shape"},
		{"not an object", "/orders.x", `[1,2]`, 400, outcomeInvalid, "not JSON of the shape"},
		{"more after it", "/orders.x", `{"entries":[` + ok + `]} {}`, 400, outcomeInvalid, "followed by more"},
		{"a misspelt field", "/orders.x", `{"entries":[{"idempotency_key":"k","data":1}]}`, 400, outcomeInvalid, `unknown field "idempotency_key"`},
		{"headers not lists", "/orders.x", `{"entries":[{"headers":{"X-A":"v"},"data":1}]}`, 400, outcomeInvalid, "headers"},
		{"no entries", "/orders.x", `{"entries":[]}`, 400, outcomeInvalid, "no entries"},
		{"too many entries", "/orders.x", keyedBatch("many", maxBatchEntries+1), 413, outcomeTooLarge, "more than the 128"},
		{"too large", "/orders.x", `{"entries":[{"data":"` + strings.Repeat("y", 70<<10) + `"}]}`, 413, outcomeTooLarge, "larger than 65536 bytes"},
		{"the same entryId", "/orders.x", `{"entries":[{"entryId":"a","data":1},{"entryId":"a","data":2}]}`, 400, outcomeInvalid, `entries 0 and 1 have the same entryId "a"`},
		{"data twice", "/orders.x", `{"entries":[` + ok + `,{"data":1,"dataBase64":"AA=="}]}`, 400, outcomeInvalid, `entry 1 (entryId "1"): both data and dataBase64`},
		{"not base64", "/orders.x", `{"entries":[{"dataBase64":"!!"}]}`, 400, outcomeInvalid, "not standard base64"},
		{"no subject", "", `{"entries":[{"subject":"orders.a","data":1},{"data":2}]}`, 400, outcomeInvalid, `entry 1 (entryId "1"): no subject`},
		{"an entry outside the subjects", "/orders.x", `{"entries":[` + ok + `,{"entryId":"b","subject":"billing.x","data":1}]}`, 403, outcomeForbidden, `entry 1 (entryId "b"): subject "billing.x" is not among`},
		{"the path outside the subjects", "/billing.x", `{"entries":[` + ok + `]}`, 403, outcomeForbidden, "not among"},
		{"reserved", "", `{"entries":[{"subject":"$JS.API.STREAM.DELETE.ORDERS"}]}`, 403, outcomeForbidden, "reserved by NATS"},
		{"a wildcard", "", `{"entries":[{"subject":"orders.*","data":1}]}`, 400, outcomeInvalid, "not a literal subject"},
		{"a Nats header NATS acts on", "/orders.x", `{"entries":[{"headers":{"Nats-Rollup":["sub"]},"data":1}]}`, 400, outcomeInvalid, "Nats-Rollup is not accepted"},
		{"two content types", "/orders.x", `{"entries":[{"contentType":"text/plain","headers":{"content-type":["application/json"]},"data":1}]}`, 400, outcomeInvalid, "send one of them"},
		{"two ids", "/orders.x", `{"entries":[{"idempotencyKey":"a","headers":{"Idempotency-Key":["b"]},"data":1}]}`, 400, outcomeInvalid, "send one of them"},
		{"over max_payload", "/orders.x", `{"entries":[` + ok + `,` + big + `]}`, 413, outcomeTooLarge, `entry 1 (entryId "1"): the message is`},
		// What NATS cannot carry as it is: nats.go fails a header name
		// outside an HTTP token's characters at every attempt, and stores
		// a space for a CR or LF of a value.
		{"a header name with a space", "/orders.x", `{"entries":[` + ok + `,{"entryId":"b","headers":{"X Tenant":["7"]},"data":1}]}`, 400, outcomeInvalid, `entry 1 (entryId "b"): header name "X Tenant" cannot be carried by NATS`},
		{"an empty header name", "/orders.x", `{"entries":[` + ok + `,{"headers":{"":["7"]},"data":1}]}`, 400, outcomeInvalid, `entry 1 (entryId "1"): header name "" cannot be carried`},
		{"a header name with a colon", "/orders.x", `{"entries":[{"headers":{"X-A:b":["7"]},"data":1},` + ok + `]}`, 400, outcomeInvalid, `entry 0 (entryId "0"): header name "X-A:b"`},
		{"a header value with CR LF", "/orders.x", `{"entries":[` + ok + `,{"headers":{"X-Note":["a\r\nInjected: 1"]},"data":1}]}`, 400, outcomeInvalid, `entry 1 (entryId "1"): header X-Note: a value holding a line break`},
		{"a header value with LF", "/orders.x", `{"entries":[` + ok + `,{"headers":{"X-Note":["ok","a\nb"]},"data":1}]}`, 400, outcomeInvalid, "a value holding a line break"},
		{"a content type with CR", "/orders.x", `{"entries":[` + ok + `,{"contentType":"text/plain\r","data":1}]}`, 400, outcomeInvalid, "header Content-Type: a value holding a line break"},
		{"an idempotency key with LF", "/orders.x", `{"entries":[` + ok + `,{"idempotencyKey":"k\n1","data":1}]}`, 400, outcomeInvalid, "a value holding a line break"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := a.count(tt.outcome)
			r := a.postBatch(tt.path, tt.body)
			if r.status != tt.status || !strings.Contains(r.Error, tt.want) || len(r.Entries) != 0 {
				t.Errorf("answer %d %q (%d entries), want %d containing %q", r.status, r.Error, len(r.Entries), tt.status, tt.want)
			}
			if got := a.count(tt.outcome); got != before+1 {
				t.Errorf("%s counted %v, want %v", tt.outcome, got, before+1)
			}
		})
	}
	if n := msgCount(t, js, "ORDERS"); n != 0 {
		t.Errorf("%d messages stored by refused batches", n)
	}
	if len(a.srv.slots) != 0 || len(a.srv.batches) != 0 || value(a.srv.m.inflight) != 0 {
		t.Errorf("slots %d, batches %d, inflight %v held after refusals", len(a.srv.slots), len(a.srv.batches), value(a.srv.m.inflight))
	}

	tok := startAPI(t, srv.ClientURL(), Options{Token: func() string { return "t0ken" }})
	if r := tok.postBatch("/orders.x", `{"entries":[`+ok+`]}`); r.status != 401 || !strings.Contains(r.Error, "bearer token") {
		t.Errorf("without the token: %d %q", r.status, r.Error)
	}
	if r := tok.postBatch("/orders.x", `{"entries":[`+ok+`]}`, "Authorization", "Bearer t0ken"); r.status != 200 {
		t.Errorf("with the token: %d %q", r.status, r.Error)
	}
}

// TestBatchOfManyEntriesRefusedWithinItsBody: a batch of more entries than
// a request may carry is refused (413) once the entry past the bound is
// read, so that what its refusal holds is bounded by its body (at most
// MaxBatchBytes), not by its count of entries: the 8 MiB of 2.8 million
// empty entries, read whole, took 2 GiB. Read by decodeBatch, and by
// encoding/json (its first entry holds an escape, which decodeBatch leaves
// to it).
func TestBatchOfManyEntriesRefusedWithinItsBody(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	a := startAPI(t, srv.ClientURL(), Options{})
	limit := int(a.srv.o.MaxBatchBytes)
	for _, tc := range []struct{ name, first string }{
		{"decodeBatch", `{}`},
		{"encoding/json", `{"entryId":"\u0041"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			b.Grow(limit)
			b.WriteString(`{"entries":[` + tc.first)
			for b.Len()+len(`,{}]}`) <= limit {
				b.WriteString(`,{}`)
			}
			b.WriteString(`]}`)
			body := b.String()

			r := a.postBatch("/orders.x", body)
			if r.status != http.StatusRequestEntityTooLarge || !strings.Contains(r.Error, "more than the 128 entries a request may carry") {
				t.Errorf("%d bytes of empty entries: answer %d %q, want 413 saying a request carries at most 128", len(body), r.status, r.Error)
			}

			// The reading of that body alone, measured.
			req := httptest.NewRequest(http.MethodPost, BatchPath+"/orders.x", strings.NewReader(body))
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := a.srv.readBatch(req, "orders.x")
			runtime.ReadMemStats(&after)
			var ref *refusal
			if !errors.As(err, &ref) || ref.status != http.StatusRequestEntityTooLarge {
				t.Fatalf("readBatch: %v, want a 413 refusal", err)
			}
			// Most of it is readAll growing into the body (about 5 times
			// its size, counting every step); 3.7 GiB were allocated when
			// every entry was read.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 10*uint64(len(body)) {
				t.Errorf("refusing %d bytes of %d entries allocated %d MiB, more than 10 times the body", len(body), strings.Count(body, "{")-1, alloc>>20)
			}
		})
	}
}

// TestBatchBodyLengths: a batch whose length is not declared (sent
// chunked) is read whole and stored, and refused 413 once it grows past
// MaxBatchBytes; one larger than what is set aside before it arrives
// (firstRead) is read whole too.
func TestBatchBodyLengths(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{MaxBatchBytes: 4 << 20})
	undeclared := func(body string) io.Reader { return io.MultiReader(strings.NewReader(body)) }

	r, err := a.sendBatch("/orders.chunked", undeclared(keyedBatch("chunked", 20)))
	if err != nil || r.status != 200 || len(r.Entries) != 20 {
		t.Fatalf("chunked batch: %v, answer %d %q, %d entries", err, r.status, r.Error, len(r.Entries))
	}
	// 3 entries of 600 KB of base64 each: 1.8 MB, past firstRead.
	var b strings.Builder
	b.WriteString(`{"entries":[`)
	for i := range 3 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"idempotencyKey":"large-%d","dataBase64":"%s"}`, i, base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{byte(i)}, 450<<10)))
	}
	b.WriteString(`]}`)
	if b.Len() <= firstRead {
		t.Fatalf("the large batch is %d bytes, not past %d", b.Len(), firstRead)
	}
	for _, body := range []io.Reader{strings.NewReader(b.String()), undeclared(b.String())} {
		r, err := a.sendBatch("/orders.large", body)
		if err != nil || r.status != 200 || len(r.Entries) != 3 {
			t.Fatalf("large batch: %v, answer %d %q, %d entries", err, r.status, r.Error, len(r.Entries))
		}
	}
	stream, err := js.Stream(context.Background(), "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetLastMsgForSubject(context.Background(), "orders.large")
	if err != nil || !bytes.Equal(m.Data, bytes.Repeat([]byte{2}, 450<<10)) {
		t.Fatalf("the large batch's last entry: %v, %d bytes", err, len(m.Data))
	}
	before := a.count(outcomeTooLarge)
	r, err = a.sendBatch("/orders.chunked", undeclared(`{"entries":[{"data":"`+strings.Repeat("y", 5<<20)+`"}]}`))
	if err != nil || r.status != 413 || !strings.Contains(r.Error, "larger than 4194304 bytes") {
		t.Errorf("chunked batch over MaxBatchBytes: %v, answer %d %q", err, r.status, r.Error)
	}
	if got := a.count(outcomeTooLarge); got != before+1 {
		t.Errorf("too large counted %v, want %v", got, before+1)
	}
	// 20 chunked, and each large one stored once (the second sent again
	// with the same keys: duplicates).
	if n := msgCount(t, js, "ORDERS"); n != 23 {
		t.Errorf("%d messages stored, want 23", n)
	}
}

// TestBatchEntryFailures: entries the server turns down (an expectation
// that does not hold, a subject no stream captures) fail alone: the
// others are stored, the answer is the first failure's status, not 200,
// with each entry's outcome and an error saying how many were not stored.
func TestBatchEntryFailures(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{Subjects: []string{"orders.>", "nostream.>"}})

	r := a.postBatch("/orders.x", `{"entries":[
	  {"entryId":"ok","data":1},
	  {"entryId":"expect","headers":{"Nats-Expected-Last-Sequence":["99"]},"data":2},
	  {"entryId":"nowhere","subject":"nostream.x","data":3},
	  {"entryId":"ok2","data":4}]}`)
	if r.status != 412 || !strings.Contains(r.Error, `2 of 4 entries not stored`) || !strings.Contains(r.Error, `entryId "expect"`) {
		t.Fatalf("answer %d %q", r.status, r.Error)
	}
	want := []struct {
		status int
		err    string
	}{{200, ""}, {412, "wrong last sequence"}, {404, "no stream captures"}, {200, ""}}
	for i, w := range want {
		e := r.Entries[i]
		if e.Status != w.status || !strings.Contains(e.Error, w.err) || (w.status == 200) != (e.Seq != 0) {
			t.Errorf("entry %s: %+v, want %d %q", e.EntryID, e, w.status, w.err)
		}
	}
	if n := msgCount(t, js, "ORDERS"); n != 2 {
		t.Errorf("%d stored, want the 2 that could be", n)
	}
	if a.count(outcomeExpectation) != 1 || a.count(outcomeNoStream) != 1 || a.count(outcomeStored) != 2 {
		t.Errorf("expectation %v, no_stream %v, stored %v", a.count(outcomeExpectation), a.count(outcomeNoStream), a.count(outcomeStored))
	}
}

// TestBatchUnavailable: with NATS down, a batch is retried for its time
// and answered 503 with Retry-After, every entry 503; a batch finding
// every slot taken waits for its share rather than being refused, and one
// beyond the batches in progress is refused 503 busy at once.
func TestBatchUnavailable(t *testing.T) {
	srv := natstest.NewServer(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{Timeout: 1500 * time.Millisecond, RetryAfter: 2 * time.Second})
	natstest.Stop(srv)
	poll.Until(t, 5*time.Second, "the API's connection to notice", func() bool { return !a.nc.IsConnected() })

	start := time.Now()
	r := a.postBatch("/orders.x", keyedBatch("down", 3))
	if r.status != 503 || r.retryAfter != "2" || !strings.Contains(r.Error, "3 of 3 entries not stored") || len(r.Entries) != 3 {
		t.Fatalf("NATS down: %d %q %q", r.status, r.retryAfter, r.Error)
	}
	for _, e := range r.Entries {
		if e.Status != 503 || !strings.Contains(e.Error, "no acknowledgement within 1.5s") {
			t.Errorf("entry %s: %+v", e.EntryID, e)
		}
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Errorf("answered after %s", waited)
	}
	if a.count(outcomeUnavailable) != 3 || value(a.srv.m.retries) == 0 {
		t.Errorf("unavailable %v, retries %v", a.count(outcomeUnavailable), value(a.srv.m.retries))
	}

	// Every batch slot taken: one more is refused at once.
	for range maxBatches {
		a.srv.batches <- struct{}{}
	}
	if r := a.postBatch("/orders.x", keyedBatch("busy", 1)); r.status != 503 || r.retryAfter != "2" || !strings.Contains(r.Error, "batches in progress") {
		t.Errorf("beyond the batches in progress: %d %q", r.status, r.Error)
	}
	for range maxBatches {
		<-a.srv.batches
	}
}

// TestBatchWaitsForSlots: batches that together carry more entries than
// MaxConcurrent wait for their share and are all stored; none is refused
// busy, and a batch larger than MaxConcurrent is refused 413 at once.
func TestBatchWaitsForSlots(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{MaxConcurrent: 4})

	var wg sync.WaitGroup
	replies := make([]batchReply, 12)
	for i := range replies {
		wg.Go(func() { replies[i] = a.postBatch("/orders.x", keyedBatch(fmt.Sprintf("b%d", i), 4)) })
	}
	wg.Wait()
	for i, r := range replies {
		if r.status != 200 {
			t.Errorf("batch %d: %d %q", i, r.status, r.Error)
		}
	}
	if n := msgCount(t, js, "ORDERS"); n != 48 || a.count(outcomeBusy) != 0 {
		t.Errorf("%d stored, busy %v; want 48 and 0", n, a.count(outcomeBusy))
	}
	if r := a.postBatch("/orders.x", keyedBatch("five", 5)); r.status != 413 || !strings.Contains(r.Error, "more than the 4") {
		t.Errorf("5 entries with MaxConcurrent 4: %d %q", r.status, r.Error)
	}
}

// TestBatchDuringRestart: batches while the NATS server restarts are
// answered 200 (every entry stored at the sequence named) or 503 with
// Retry-After; a 503'd batch sent again as it was is stored, and no key is
// stored twice.
func TestBatchDuringRestart(t *testing.T) {
	dir := t.TempDir()
	srv := natstest.NewServer(t, natstest.Options{StoreDir: dir})
	var mu sync.Mutex
	t.Cleanup(func() { mu.Lock(); defer mu.Unlock(); natstest.Stop(srv) })
	port := srv.Addr().(*net.TCPAddr).Port
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{Timeout: 1500 * time.Millisecond})

	stop := make(chan struct{})
	batches := batchLoop(a, 3, 8, stop)
	poll.Until(t, 10*time.Second, "batches stored before the restart", func() bool { return a.count(outcomeStored) >= 40 })
	natstest.Stop(srv)
	poll.Until(t, 15*time.Second, "an entry answered 503 while NATS is down", func() bool { return a.count(outcomeUnavailable) >= 1 })
	mu.Lock()
	srv = natstest.NewServer(t, natstest.Options{Port: port, StoreDir: dir})
	mu.Unlock()
	after := a.count(outcomeStored)
	poll.Until(t, 20*time.Second, "batches stored after the restart", func() bool { return a.count(outcomeStored) >= after+40 })
	close(stop)
	checkBatches(t, a, js, batches())
}

// TestBatchLeaderLoss: on a 3-node cluster, batches while the stream's
// leader is shut down are answered 200 (stored where named) or 503 with
// Retry-After; a new leader takes them, and 503'd batches sent again are
// stored once.
func TestBatchLeaderLoss(t *testing.T) {
	c := natstest.StartCluster(t, 3, natstest.ClusterOptions{})
	_, js := natstest.ConnectURL(t, c.URL())
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Replicas: 3})
	a := startAPI(t, c.URL(), Options{Timeout: 5 * time.Second})

	stop := make(chan struct{})
	batches := batchLoop(a, 3, 8, stop)
	poll.Until(t, 20*time.Second, "batches stored", func() bool { return a.count(outcomeStored) >= 40 })
	leader := c.StreamLeader("ORDERS")
	c.Shutdown(leader)
	after := a.count(outcomeStored)
	poll.Until(t, 60*time.Second, "batches stored under a new leader", func() bool { return a.count(outcomeStored) >= after+40 })
	if now := c.StreamLeader("ORDERS"); now == leader {
		t.Fatalf("leader still node %d", now)
	}
	close(stop)
	checkBatches(t, a, js, batches())
	t.Logf("%v entries answered 503; %v retries within requests", a.count(outcomeUnavailable), value(a.srv.m.retries))
}

// sentBatch is a batch batchLoop sent: its body and answer.
type sentBatch struct {
	prefix string
	n      int
	reply  batchReply
	err    error
}

// batchLoop runs workers each sending batches of n keyed entries to
// orders.created until stop closes, and returns what waits for them and
// returns every batch sent.
func batchLoop(a *api, workers, n int, stop <-chan struct{}) func() []sentBatch {
	var mu sync.Mutex
	var sent []sentBatch
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				b := sentBatch{prefix: fmt.Sprintf("w%d-%d", w, i), n: n}
				b.reply, b.err = a.tryBatch("/orders.created", keyedBatch(b.prefix, n))
				mu.Lock()
				sent = append(sent, b)
				mu.Unlock()
			}
		})
	}
	var once sync.Once
	return func() []sentBatch {
		once.Do(wg.Wait)
		mu.Lock()
		defer mu.Unlock()
		return sent
	}
}

// checkBatches checks what batchLoop got: a 200 has every entry stored at
// the sequence it names with its own data; anything else is a 503 with
// Retry-After, whose stored entries hold what they name and which, sent
// again as it was, is answered 200; and the stream holds each key once.
func checkBatches(t *testing.T, a *api, js jetstream.JetStream, sent []sentBatch) {
	t.Helper()
	keys, retried := 0, 0
	checkStored := func(r batchReply, prefix string, all bool) {
		for i, e := range r.Entries {
			key := fmt.Sprintf("%s-%d", prefix, i)
			if e.Status != 200 {
				if all || e.Status != 503 {
					t.Errorf("%s: entry answered %d: %s", key, e.Status, e.Error)
				}
				continue
			}
			if m := stored(t, js, "ORDERS", e.Seq); string(m.Data) != fmt.Sprintf("%q", key) || m.Header.Get(nats.MsgIdHdr) != key {
				t.Errorf("%s answered seq %d, which holds %q (id %q)", key, e.Seq, m.Data, m.Header.Get(nats.MsgIdHdr))
			}
		}
	}
	for _, b := range sent {
		keys += b.n
		switch {
		case b.err != nil:
			t.Errorf("%s: %v", b.prefix, b.err)
		case b.reply.status == 200:
			checkStored(b.reply, b.prefix, true)
		case b.reply.status == 503 && b.reply.retryAfter != "":
			retried++
			checkStored(b.reply, b.prefix, false)
			var again batchReply
			poll.Until(t, 30*time.Second, "a batch sent again stored", func() bool {
				again = a.postBatch("/orders.created", keyedBatch(b.prefix, b.n))
				return again.status == 200
			})
			checkStored(again, b.prefix, true)
		default:
			t.Errorf("%s: answered %d (Retry-After %q): %s", b.prefix, b.reply.status, b.reply.retryAfter, b.reply.Error)
		}
	}
	seen := storedOnce(t, js, "ORDERS")
	if len(seen) != keys {
		t.Errorf("%d keys stored, %d sent", len(seen), keys)
	}
	t.Logf("%d batches (%d keys), %d answered 503 and sent again", len(sent), keys, retried)
}

// TestBatchSpans: with a tracer, each entry is a producer span of its own,
// whose parent is the entry's traceparent when it has one and the
// request's otherwise, and its message carries the span's context.
func TestBatchSpans(t *testing.T) {
	a, js, rec := tracedAPI(t)

	const reqTrace, entryTrace = "0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736"
	r := a.postBatch("/orders.created", `{"entries":[{"entryId":"plain","data":1},
	  {"entryId":"own","headers":{"traceparent":["00-`+entryTrace+`-00f067aa0ba902b7-01"]},"data":2}]}`,
		"Traceparent", "00-"+reqTrace+"-b7ad6b7169203331-01")
	if r.status != 200 {
		t.Fatalf("batch: %d %q", r.status, r.Error)
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want one per entry", len(spans))
	}
	parents := map[string]string{}
	for _, sp := range spans {
		if sp.SpanKind() != trace.SpanKindProducer || sp.Name() != "send orders.created" {
			t.Errorf("span %q kind %v", sp.Name(), sp.SpanKind())
		}
		parents[sp.Parent().TraceID().String()] = sp.SpanContext().SpanID().String()
	}
	for i, tr := range []string{reqTrace, entryTrace} {
		span, ok := parents[tr]
		if !ok {
			t.Errorf("no span of trace %s: %v", tr, parents)
			continue
		}
		want := "00-" + tr + "-" + span + "-01"
		if got := stored(t, js, "ORDERS", r.Entries[i].Seq).Header.Get("traceparent"); got != want {
			t.Errorf("entry %s carries %q, want its span's %q", r.Entries[i].EntryID, got, want)
		}
	}
}

// TestBatchCallerGoesAway: a batch whose caller leaves while it waits for
// slots is counted canceled, publishes nothing and takes no slot with it.
func TestBatchCallerGoesAway(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{MaxConcurrent: 2})
	for range 2 { // every slot taken
		a.srv.slots <- struct{}{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url+BatchPath+"/orders.x", strings.NewReader(keyedBatch("gone", 2)))
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("answered %d while every slot was taken", resp.StatusCode)
	}
	poll.Until(t, 5*time.Second, "the batch counted canceled", func() bool { return a.count(outcomeCanceled) == 1 })
	for range 2 {
		<-a.srv.slots
	}
	if len(a.srv.slots) != 0 || len(a.srv.batches) != 0 || msgCount(t, js, "ORDERS") != 0 {
		t.Errorf("slots %d, batches %d held; %d stored", len(a.srv.slots), len(a.srv.batches), msgCount(t, js, "ORDERS"))
	}
	if r := a.postBatch("/orders.x", keyedBatch("after", 2)); r.status != 200 {
		t.Errorf("the next batch: %d %q", r.status, r.Error)
	}
}

// TestBatchBeforeConnect: a batch sent before the API has its connection
// waits for it within its time and is stored once it comes; one whose time
// runs out first is answered 503 with Retry-After, nothing stored.
func TestBatchBeforeConnect(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	nc, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	s, err := Listen("127.0.0.1:0", Options{Subjects: []string{"orders.>"}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	a := &api{t: t, srv: s, nc: nc, url: "http://" + s.Addr()}

	if r := a.postBatch("/orders.early", keyedBatch("early", 2)); r.status != 503 || r.retryAfter != "1" || !strings.Contains(r.Error, "not connected") {
		t.Errorf("before the connection: %d %q %q", r.status, r.retryAfter, r.Error)
	}
	waiting := make(chan batchReply, 1)
	go func() { waiting <- a.postBatch("/orders.waits", keyedBatch("w", 3)) }()
	poll.Until(t, 5*time.Second, "the batch waiting", func() bool { return value(s.m.inflight) == 3 })
	s.Connect(nc, js)
	if r := <-waiting; r.status != 200 || len(r.Entries) != 3 || r.Entries[2].Seq != 3 {
		t.Errorf("connected while it waited: %d %q %+v", r.status, r.Error, r.Entries)
	}
}

// checkSizes counts a message as nats.go sends it: the spaces around a
// header value, which nats.go trims, do not count against max_payload.
func TestCheckSizesCountsWhatIsSent(t *testing.T) {
	const maxPayload = 1024
	h := nats.Header{"X-Padded": {"  value  "}, "Nats-Msg-Id": {"a"}}
	sent := (&nats.Msg{Header: h}).Size() // nats.go's count of its header block
	m := &nats.Msg{Subject: "orders.x", Header: h, Data: make([]byte, maxPayload-sent)}
	if err := checkSizes([]pending{{id: "a", m: m}}, maxPayload); err != nil {
		t.Errorf("a message of max_payload as sent: %v", err)
	}
	m.Data = append(m.Data, 'x')
	if err := checkSizes([]pending{{id: "a", m: m}}, maxPayload); err == nil {
		t.Error("a message one byte over max_payload passed")
	}
}
