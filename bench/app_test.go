package main

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/courierhq/courier/batch"
)

// batchBody is a batch request of n benchmark messages of run, ids
// [0, n), as courier encodes it.
func batchBody(run uint64, n int) []byte {
	es := make([]batch.Entry, n)
	for i := range es {
		seq := uint64(1000 + i)
		es[i] = batch.Entry{ID: strconv.FormatUint(seq, 10), Key: "BENCH:" + strconv.FormatUint(seq, 10), Attempt: 1,
			Subject: "bench.x", Stream: "BENCH", Sequence: seq, Published: time.Now(),
			ContentType: "application/octet-stream", Header: http.Header{"X-Trace": {`a "quoted" value`}},
			Data: newBody(256, run, uint64(i), time.Now())}
	}
	return batch.Encode(nil, es)
}

func TestReceiveBatchCountsEveryEntry(t *testing.T) {
	body := batchBody(7, 32)
	tl := newTally(7, 32)
	if !tl.receiveBatch(body, "32", time.Now()) {
		t.Fatal("a batch of 32 was not read as one")
	}
	select {
	case <-tl.Done():
	default:
		t.Fatalf("after one batch of 32: %d of 32 distinct messages recorded", tl.distinct.Load())
	}
	if got := tl.requests.Load(); got != 32 {
		t.Fatalf("entries recorded = %d, want 32", got)
	}
}

func TestReceiveBatchRefusesWhatIsNotTheBatchItSays(t *testing.T) {
	body := batchBody(7, 4)
	for _, c := range []struct {
		name, declared string
		body           []byte
	}{
		{"fewer entries than declared", "5", body},
		{"no count", "", body},
		{"not a batch", "4", []byte(`{"items":[]}`)},
		{"bad base64", "1", []byte(`{"entries":[{"dataBase64":"!!"}]}`)},
		{"unterminated", "1", []byte(`{"entries":[{"dataBase64":"AAAA`)},
	} {
		if newTally(7, 4).receiveBatch(c.body, c.declared, time.Now()) {
			t.Errorf("%s: read as a batch", c.name)
		}
	}
}

// BenchmarkReceiveBatch is the benchmark app's cost per entry of a batch of
// 32 (bench/app.go says why it scans rather than decodes).
func BenchmarkReceiveBatch(b *testing.B) {
	body := batchBody(1, 32)
	tl := newTally(1, 0)
	for b.Loop() {
		tl.receiveBatch(body, "32", time.Now())
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/32, "ns/entry")
}
