package main

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
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
	for _, c := range []struct {
		name string
		read func(*tally, []byte, string, time.Time) bool
	}{
		{"scanned", (*tally).receiveBatch},
		{"decoded with encoding/json", (*tally).receiveBatchJSON},
	} {
		t.Run(c.name, func(t *testing.T) { testReceiveBatchCountsEveryEntry(t, c.read) })
	}
}

func testReceiveBatchCountsEveryEntry(t *testing.T, read func(*tally, []byte, string, time.Time) bool) {
	body := batchBody(7, 32)
	tl := newTally(7, 32)
	if !read(tl, body, "32", time.Now()) {
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

// BenchmarkReceiveBatchJSON is receiveBatchJSON's cost per entry of a
// batch of 32: the app of the variant that decodes batches with
// encoding/json.
func BenchmarkReceiveBatchJSON(b *testing.B) {
	body := batchBody(1, 32)
	tl := newTally(1, 0)
	for b.Loop() {
		tl.receiveBatchJSON(body, "32", time.Now())
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/32, "ns/entry")
}

func TestOccupancyWeighsEachCountByHowLongItLasted(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type step struct {
		ms    int
		enter bool
	}
	for _, c := range []struct {
		name      string
		steps     []step
		stop      int
		mean, p50 float64
		p90       float64
	}{
		// 1 inside for 10 ms, 2 for 10 ms, 1 for 10 ms, none for 10 ms.
		{"overlapping", []step{{0, true}, {10, true}, {20, false}, {30, false}}, 40, 1.0, 1, 2},
		// 3 inside for 90 ms, none for 10: the idle tail counts.
		{"idle tail", []step{{0, true}, {0, true}, {0, true}, {90, false}, {90, false}, {90, false}}, 100, 2.7, 3, 3},
		// What comes after stop is not counted.
		{"after stop", []step{{0, true}, {50, true}}, 10, 1, 1, 1},
		// An exit timed before the last change counts as at it: 1 inside
		// for 10 ms, then (2 in, 1 out at once) 1 for 10 ms.
		{"out of order", []step{{0, true}, {10, true}, {5, false}, {20, false}}, 20, 1, 1, 1},
	} {
		o := &occupancy{}
		stopped := false
		for _, s := range c.steps {
			if !stopped && s.ms > c.stop {
				o.stop(at(c.stop))
				stopped = true
			}
			if s.enter {
				o.enter(at(s.ms))
			} else {
				o.exit(at(s.ms))
			}
		}
		if !stopped {
			o.stop(at(c.stop))
		}
		if got := o.mean(); math.Abs(got-c.mean) > 1e-9 {
			t.Errorf("%s: mean = %v, want %v", c.name, got, c.mean)
		}
		if got := o.quantile(0.5); got != c.p50 {
			t.Errorf("%s: p50 = %v, want %v", c.name, got, c.p50)
		}
		if got := o.quantile(0.9); got != c.p90 {
			t.Errorf("%s: p90 = %v, want %v", c.name, got, c.p90)
		}
	}
	if m := (&occupancy{}).mean(); !math.IsNaN(m) {
		t.Errorf("nothing recorded: mean = %v, want NaN", m)
	}
}

func TestAppWorkersHoldTheRestInside(t *testing.T) {
	a, err := startApp(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.close)
	// Two workers, each held by a request for half a second: the third
	// request waits inside the app and is counted there.
	a.withWorkers(2)
	a.answerAfter(500 * time.Millisecond)
	o := &occupancy{}
	a.recordInside(o)
	var wg sync.WaitGroup
	codes := make([]int, 3)
	for i := range codes {
		wg.Go(func() {
			resp, err := http.Post(a.URL(), "application/octet-stream", strings.NewReader("x"))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		o.mu.Lock()
		inside := o.inside
		o.mu.Unlock()
		busy := len(*a.workers.Load())
		if inside == 3 && busy == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests inside, %d workers busy; want 3 inside, 2 busy", inside, busy)
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	if n := len(*a.workers.Load()); n != 0 {
		t.Errorf("%d workers busy after every answer, want 0", n)
	}
	for i, c := range codes {
		if c != http.StatusOK {
			t.Errorf("request %d: status %d", i, c)
		}
	}
}

func TestParseLimitReadsTheLimitsMetrics(t *testing.T) {
	text := `# HELP courier_inflight_limit Requests to the app allowed at once.
# TYPE courier_inflight_limit gauge
courier_inflight_limit 9
courier_inflight_limit_changes_total{cause="queueing"} 4
courier_inflight_limit_changes_total{cause="rise"} 17
courier_inflight_limit_min_rtt_seconds 0.0105
courier_inflight_requests 8
`
	rd, err := parseLimit(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if rd.limit != 9 || rd.minRTT != 10500*time.Microsecond || rd.changes["rise"] != 17 || rd.changes["queueing"] != 4 {
		t.Errorf("read %+v", rd)
	}
	labelled := `courier_inflight_limit{subscription="orders"} 5
courier_inflight_limit_changes_total{cause="rise",subscription="orders"} 3
`
	if rd, err := parseLimit(strings.NewReader(labelled)); err != nil || rd.limit != 5 || rd.changes["rise"] != 3 {
		t.Errorf("labelled: read %+v, %v", rd, err)
	}
	if _, err := parseLimit(strings.NewReader("courier_inflight_requests 8\n")); err == nil {
		t.Error("metrics without courier_inflight_limit read without error")
	}
}
