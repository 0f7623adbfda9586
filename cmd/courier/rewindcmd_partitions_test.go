package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natshdr"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/partition"
	"github.com/courierhq/courier/rewind"
)

// partsSettled reports whether every partition of the durable on the work
// stream has delivered and settled all it has, twice 50 ms apart.
func (h *harness) partsSettled(partitions int) bool {
	once := func() bool {
		work := partition.StreamName(h.stream, "courier")
		for i := range partitions {
			info := h.consumerInfoOn(work, partition.ConsumerName("courier", i))
			if info == nil || info.NumPending != 0 || info.NumAckPending != 0 {
				return false
			}
		}
		return true
	}
	if !once() {
		return false
	}
	time.Sleep(50 * time.Millisecond)
	return once()
}

// workGeneration is the generation of the work stream's source.
func (h *harness) workGeneration() int {
	s, err := h.js.Stream(context.Background(), partition.StreamName(h.stream, "courier"))
	if err != nil {
		h.t.Fatal(err)
	}
	return partition.Generation(s.CachedInfo().Config)
}

// replaysOf are the calls of calls marked with rewind id, and checks that
// they are each of want once, each key's (Order) in stream order.
func checkReplays(t *testing.T, calls []replayCall, id string, want []uint64) {
	t.Helper()
	last := map[string]uint64{}
	var got []uint64
	for _, c := range calls {
		if c.replay != id {
			continue
		}
		if c.seq <= last[c.order] {
			t.Errorf("key %s: sequence %d replayed after %d", c.order, c.seq, last[c.order])
		}
		last[c.order] = c.seq
		got = append(got, c.seq)
	}
	slices.Sort(got)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("rewind %s replayed sequences %v, want each of %v once", id, got, want)
	}
}

// Messages published with Nats-Msg-Id are replayed too: the work stream
// keeps no duplicate window of its own, which would drop a rewind's copies
// as duplicates of the first (nothing replayed, and what gave way to a
// copy lost). A work stream an earlier courier made with its stream's
// window loses it at the rewind.
func TestRewindPartitionedDurableWithMessageIDs(t *testing.T) {
	h := newHarness(t)
	a := &replayApp{}
	app := httptest.NewServer(a)
	t.Cleanup(app.Close)
	env := h.env(app.URL, "COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=3", "COURIER_LOG_LEVEL=info")
	start(t, env)
	var seqs []uint64
	for i := range 9 {
		key := []string{"k1", "k2", "k3"}[i%3]
		seqs = append(seqs, h.publish("orders."+key, fmt.Sprintf("%s-%d", key, i/3), map[string]string{"Order": key, "Nats-Msg-Id": fmt.Sprint("id-", i)}))
	}
	poll.Until(t, 15*time.Second, "all delivered", func() bool { return a.count() == 9 && h.partsSettled(3) })
	ctx := context.Background()
	work, err := h.js.Stream(ctx, partition.StreamName(h.stream, "courier"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := work.CachedInfo().Config
	if cfg.Duplicates != 0 {
		t.Errorf("the work stream was made with a duplicate window of %s, want none", cfg.Duplicates)
	}
	cfg.Duplicates = 2 * time.Minute // as an earlier courier made it
	if _, err := h.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if out, err := rewindCLI(env, "--to-seq", fmt.Sprint(seqs[3]), "--yes"); err != nil {
		t.Fatalf("rewind: %v\n%s", err, out)
	}
	poll.Until(t, 15*time.Second, "the range delivered again and settled", func() bool { return a.count() == 15 && h.partsSettled(3) })
	checkReplays(t, a.all(), a.all()[9].replay, seqs[3:])
	info, err := work.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Duplicates != 0 {
		t.Errorf("after the rewind the work stream has a duplicate window of %s, want none", info.Config.Duplicates)
	}
}

// A partitioned durable rewound to a sequence, then again to a later one,
// its courier running throughout: without --yes nothing changes (exit 2)
// and the plan names the range, its count and every partition; with it,
// every message from the point on reaches the app once more, marked with
// the rewind's id, each key's in stream order, and courier status says the
// rewind is done; a message published after is delivered once, unmarked.
func TestRewindPartitionedDurable(t *testing.T) {
	h := newHarness(t)
	a := &replayApp{}
	app := httptest.NewServer(a)
	t.Cleanup(app.Close)
	env := h.env(app.URL, "COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=3", "COURIER_LOG_LEVEL=info")
	c := start(t, env)
	var seqs []uint64
	for i := range 12 {
		key := []string{"k1", "k2", "k3"}[i%3]
		seqs = append(seqs, h.publish("orders."+key, fmt.Sprintf("%s-%d", key, i/3), map[string]string{"Order": key}))
	}
	poll.Until(t, 15*time.Second, "all delivered", func() bool { return a.count() == 12 && h.partsSettled(3) })

	out, err := rewindCLI(env, "--to-seq", fmt.Sprint(seqs[4]))
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 {
		t.Fatalf("rewind without --yes: %v, want exit 2\n%s", err, out)
	}
	for _, want := range []string{fmt.Sprintf("stream sequences %d to %d: 8 message(s)", seqs[4], seqs[11]), "courier-p0", "courier-p1", "courier-p2"} {
		if !strings.Contains(out, want) {
			t.Errorf("rewind without --yes said %q, want it to contain %q", out, want)
		}
	}
	if g := h.workGeneration(); g != 0 {
		t.Errorf("after a rewind without --yes the work stream's source is at generation %d, want 0", g)
	}

	if out, err = rewindCLI(env, "--to-seq", fmt.Sprint(seqs[4]), "--yes"); err != nil {
		t.Fatalf("rewind: %v\n%s", err, out)
	}
	poll.Until(t, 15*time.Second, "the range delivered again and settled", func() bool { return a.count() == 20 && h.partsSettled(3) })
	first := a.all()[12].replay
	if first == "" || !strings.Contains(out, "Courier-Replay: "+first) {
		t.Fatalf("the first call after the rewind carried Courier-Replay %q; the rewind said %q", first, out)
	}
	checkReplays(t, a.all(), first, seqs[4:])

	var status bytes.Buffer
	if err := run(context.Background(), []string{"status"}, env, &status, io.Discard); err != nil {
		t.Fatalf("courier status: %v", err)
	}
	if want := fmt.Sprintf("sequences %d to %d, done", seqs[4], seqs[11]); !strings.Contains(status.String(), want) {
		t.Errorf("courier status does not show the rewind done (%q):\n%s", want, status.String())
	}

	// A second rewind: a source of a new generation again, its own id.
	if out, err = rewindCLI(env, "--to-seq", fmt.Sprint(seqs[8]), "--yes"); err != nil {
		t.Fatalf("second rewind: %v\n%s", err, out)
	}
	poll.Until(t, 15*time.Second, "the second range delivered again", func() bool { return a.count() == 24 && h.partsSettled(3) })
	second := a.all()[20].replay
	if second == "" || second == first {
		t.Fatalf("the second rewind's calls carried Courier-Replay %q (the first's was %q)", second, first)
	}
	checkReplays(t, a.all(), second, seqs[8:])
	if g := h.workGeneration(); g != 2 {
		t.Errorf("after two rewinds the work stream's source is at generation %d, want 2", g)
	}

	later := h.publish("orders.k1", "later", map[string]string{"Order": "k1"})
	poll.Until(t, 10*time.Second, "a later message delivered", func() bool { return a.count() == 25 && h.partsSettled(3) })
	if c := a.all()[24]; c.seq != later || c.replay != "" {
		t.Errorf("the message published after the rewinds came as %+v, want sequence %d unmarked", c, later)
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
}

// A partitioned durable on a 3-node cluster with two couriers running as
// processes, one of them killed (SIGKILL) in the middle of the rewind's
// replay: the other takes its partitions over and every message of the
// range reaches the app again, marked with the rewind's id, each key's in
// stream order (a message the killed courier had sent and not settled may
// come once more, right after itself).
func TestRewindPartitionedThroughAKill(t *testing.T) {
	k := newCluster(t)
	a := &replayApp{slow: 50 * time.Millisecond}
	app := httptest.NewServer(a)
	t.Cleanup(app.Close)
	extra := []string{"COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=3", "COURIER_ACK_WAIT=2s"}
	victim := startChild(t, k.env(app.URL, 0, extra...))
	waitReady(t, victim.asCourier())
	survivor := startChild(t, k.env(app.URL, 1, extra...))
	waitReady(t, survivor.asCourier())
	var seqs []uint64
	for i := range 30 {
		key := []string{"k1", "k2", "k3", "k4", "k5"}[i%5]
		seqs = append(seqs, k.publish("orders."+key, fmt.Sprintf("%s-%d", key, i/5), map[string]string{"Order": key}))
	}
	poll.Until(t, 30*time.Second, "all delivered", func() bool { return a.count() >= 30 && k.partsSettled(3) })
	before := a.count()

	if out, err := rewindCLI(k.env(app.URL, 2, extra...), "--to-seq", fmt.Sprint(seqs[0]), "--yes"); err != nil {
		t.Fatalf("rewind: %v\n%s", err, out)
	}
	poll.Until(t, 30*time.Second, "the replay under way", func() bool { return a.count() >= before+8 })
	victim.kill(t)
	if replayedOnce(a.all()[before:], seqs) {
		t.Fatal("the replay was over before the kill: the test proves nothing")
	}
	poll.Until(t, 60*time.Second, "the range delivered again and settled", func() bool {
		return replayedOnce(a.all()[before:], seqs) && k.partsSettled(3)
	})
	calls := a.all()[before:]
	id := calls[0].replay
	last := map[string]uint64{}
	for _, c := range calls {
		if c.replay != id {
			t.Errorf("after the rewind %q came with Courier-Replay %q, want %q", c.body, c.replay, id)
		}
		if c.seq < last[c.order] {
			t.Errorf("key %s: sequence %d replayed after %d", c.order, c.seq, last[c.order])
		}
		last[c.order] = c.seq
	}
	if extra := len(calls) - len(seqs); extra > 3*2 {
		t.Errorf("%d calls more than the range's %d: more than the killed courier can have had out", extra, len(seqs))
	}
}

// replayedOnce reports whether calls hold every one of seqs.
func replayedOnce(calls []replayCall, seqs []uint64) bool {
	seen := map[uint64]bool{}
	for _, c := range calls {
		if c.replay != "" {
			seen[c.seq] = true
		}
	}
	for _, s := range seqs {
		if !seen[s] {
			return false
		}
	}
	return true
}

// A rewind while the app holds a partition's message and the partitions
// have more waiting that they have not delivered: the held message is
// delivered once (its copy in the range is its duplicate), and what was
// waiting gives way to its copy, which comes behind its key's replayed
// earlier messages: each key's messages after the held one reach the app
// in stream order, each once.
func TestRewindPartitionedWithABacklog(t *testing.T) {
	h := newHarness(t)
	a := &replayApp{}
	gate := make(chan struct{})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	var mu sync.Mutex
	holding, held := false, map[uint64]bool{}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hold := holding
		if hold {
			seq, _ := strconv.ParseUint(r.Header.Get("Courier-Sequence"), 10, 64)
			held[seq] = true
		}
		mu.Unlock()
		if hold {
			<-gate
		}
		a.ServeHTTP(w, r)
	}))
	t.Cleanup(app.Close)
	t.Cleanup(open)
	env := h.env(app.URL, "COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=2", "COURIER_MAX_ACK_PENDING=1", "COURIER_MAX_INFLIGHT=1", "COURIER_HTTP_TIMEOUT=60s", "COURIER_LOG_LEVEL=info")
	c := start(t, env)
	var seqs []uint64
	publish := func(n int) {
		for i := range n {
			key := []string{"k1", "k2", "k3", "k4"}[i%4]
			seqs = append(seqs, h.publish("orders."+key, key, map[string]string{"Order": key}))
		}
	}
	publish(8)
	poll.Until(t, 15*time.Second, "the first messages delivered", func() bool { return a.count() == 8 && h.partsSettled(2) })
	mu.Lock()
	holding = true
	mu.Unlock()
	publish(12)
	// Each partition with messages has one at the app and the rest
	// waiting on the server (COURIER_MAX_ACK_PENDING=1).
	var waiting uint64
	poll.Until(t, 15*time.Second, "the partitions' messages held or waiting", func() bool {
		waiting = 0
		out := 0
		for i := range 2 {
			info := h.consumerInfoOn(partition.StreamName(h.stream, "courier"), partition.ConsumerName("courier", i))
			waiting, out = waiting+info.NumPending, out+info.NumAckPending
		}
		mu.Lock()
		defer mu.Unlock()
		return len(held) > 0 && waiting > 0 && waiting+uint64(out) == 12
	})
	mu.Lock()
	for _, s := range h.outOfPartitions(2) {
		held[s] = true // with the courier, delivered once
	}
	mu.Unlock()
	if out, err := rewindCLI(env, "--to-seq", fmt.Sprint(seqs[0]), "--yes"); err != nil {
		t.Fatalf("rewind: %v\n%s", err, out)
	} else if want := fmt.Sprintf("%d message(s) not delivered yet come in their turn", waiting); !strings.Contains(out, want) || waiting == 0 {
		t.Errorf("the rewind said %q, want %q", out, want)
	}
	mu.Lock()
	holding = false
	mu.Unlock()
	open()
	poll.Until(t, 20*time.Second, "everything delivered and settled", func() bool { return a.count() == 8+20 && h.partsSettled(2) })
	calls := a.all()[8:]
	got := map[uint64]int{}
	last := map[string]uint64{}
	for _, c := range calls {
		got[c.seq]++
		if held[c.seq] {
			continue // the courier had it when the rewind came
		}
		if c.seq <= last[c.order] {
			t.Errorf("key %s: sequence %d delivered after %d", c.order, c.seq, last[c.order])
		}
		last[c.order] = c.seq
	}
	for _, s := range seqs {
		if got[s] != 1 {
			t.Errorf("sequence %d reached the app %d times after the rewind, want once", s, got[s])
		}
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
}

// outOfPartitions are the stream sequences of the messages the partitions'
// consumers have delivered and not had settled: those a courier holds.
func (h *harness) outOfPartitions(partitions int) []uint64 {
	h.t.Helper()
	ctx := context.Background()
	work, err := h.js.Stream(ctx, partition.StreamName(h.stream, "courier"))
	if err != nil {
		h.t.Fatal(err)
	}
	var out []uint64
	for i := range partitions {
		info := h.consumerInfoOn(partition.StreamName(h.stream, "courier"), partition.ConsumerName("courier", i))
		for seq := info.AckFloor.Stream + 1; seq <= info.Delivered.Stream; {
			m, err := work.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(partition.FilterSubject(i)))
			if err != nil || m.Sequence > info.Delivered.Stream {
				break
			}
			if _, origin, _, ok := natshdr.Source(m.Header); ok {
				out = append(out, origin)
			}
			seq = m.Sequence + 1
		}
	}
	return out
}

// A rewind of a partitioned durable while a key's message waits out a long
// retry (Retry-After 20s) and the key's later messages wait behind it: the
// retried message and those behind it are earlier copies of messages the
// rewind copies again, so they are acked unsent and the key's line does not
// await the retry; the key's messages from the rewind's point reach the app
// in stream order, each once, as the replay (the retried one too), well
// before the retry is due; its retry, when it comes back, is acked unsent.
func TestRewindPartitionedDuringARetryKeepsOrderPerKey(t *testing.T) {
	h := newHarness(t)
	a := &replayApp{}
	var mu sync.Mutex
	var failedAt time.Time
	retrying := make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		first := r.Header.Get("N") == "2" && failedAt.IsZero()
		if first {
			failedAt = time.Now()
			close(retrying)
		}
		mu.Unlock()
		if first {
			w.Header().Set("Retry-After", "20")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		a.ServeHTTP(w, r)
	}))
	t.Cleanup(app.Close)
	env := h.env(app.URL, "COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=2", "COURIER_LOG_LEVEL=info")
	c := start(t, env)
	var seqs []uint64
	for n := range 5 {
		seqs = append(seqs, h.publish("orders.k", fmt.Sprintf("k-%d", n), map[string]string{"Order": "k", "N": strconv.Itoa(n)}))
	}
	select {
	case <-retrying:
	case <-time.After(15 * time.Second):
		t.Fatal("k's third message was not tried")
	}
	// 0 and 1 delivered, 2 retried, 3 and 4 with the courier behind it.
	poll.Until(t, 10*time.Second, "k's messages with the courier", func() bool {
		pending := uint64(0)
		for i := range 2 {
			pending += h.consumerInfoOn(partition.StreamName(h.stream, "courier"), partition.ConsumerName("courier", i)).NumPending
		}
		return a.count() == 2 && pending == 0
	})
	if out, err := rewindCLI(env, "--to-seq", fmt.Sprint(seqs[1]), "--yes"); err != nil {
		t.Fatalf("rewind: %v\n%s", err, out)
	}
	poll.Until(t, 40*time.Second, "k's replays", func() bool { return a.count() >= 6 })
	mu.Lock()
	replayedIn := time.Since(failedAt)
	mu.Unlock()
	poll.Until(t, 40*time.Second, "everything settled, the retry too", func() bool { return h.partsSettled(2) })
	calls := a.all()
	id := calls[2].replay
	if id == "" {
		t.Fatalf("the first call after the rewind came without Courier-Replay: %+v", calls[2])
	}
	var got []uint64
	for _, c := range calls[2:] {
		if c.replay != id {
			t.Errorf("after the rewind %q came with Courier-Replay %q, want %q", c.body, c.replay, id)
		}
		got = append(got, c.seq)
	}
	if fmt.Sprint(got) != fmt.Sprint(seqs[1:]) {
		t.Errorf("after the rewind k reached the app as %v, want %v, each once in stream order", got, seqs[1:])
	}
	if replayedIn >= 20*time.Second {
		t.Errorf("k's replays were all in %s after its retry was scheduled: they waited for the retry (Retry-After 20s)", replayedIn.Round(time.Second))
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
}

// forgeRewind stores, in the durable's rewinds bucket, a record no rewind
// wrote, as whoever can write the bucket could: its copy point names every
// copy the work stream holds or will hold, by a generation of its source
// that is not there.
func (h *harness) forgeRewind(id string) {
	h.t.Helper()
	ctx := context.Background()
	kv, err := rewind.Open(ctx, h.js, h.stream, "courier", 1)
	if err != nil {
		h.t.Fatal(err)
	}
	rec := fmt.Sprintf(`{"id":%q,"stream":%q,"from":1,"to":1,"at":"2026-01-01T00:00:00Z","copied":1000000000,"copied_at":"2100-01-01T00:00:00Z","generation":1}`, id, h.stream)
	if _, err := kv.Put(ctx, id, []byte(rec)); err != nil {
		h.t.Fatal(err)
	}
}

// A rewind record forged on a partitioned durable, naming a copy point no
// rewind made, whether stored before the courier starts or while it runs:
// the work stream does not confirm it, so the courier warns and acks
// nothing unsent by it: every message reaches the app once (the record's
// range, sequence 1, marked as its replay).
func TestRewindPartitionedForgedCopyPointIgnored(t *testing.T) {
	h := newHarness(t)
	a := &replayApp{}
	app := httptest.NewServer(a)
	t.Cleanup(app.Close)
	env := h.env(app.URL, "COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=2", "COURIER_LOG_LEVEL=info")
	h.forgeRewind("forged-1")
	c := start(t, env)
	var seqs []uint64
	publish := func(n int) {
		for i := range n {
			key := []string{"k1", "k2", "k3"}[i%3]
			seqs = append(seqs, h.publish("orders."+key, key, map[string]string{"Order": key}))
		}
	}
	publish(6)
	poll.Until(t, 15*time.Second, "the messages published after the first forged record delivered", func() bool {
		return a.count() == 6 && h.partsSettled(2)
	})
	h.forgeRewind("forged-2")
	poll.Until(t, 10*time.Second, "the courier warns of the second forged record", func() bool {
		return strings.Count(c.logs.String(), "its copy point is ignored") == 2
	})
	publish(6)
	poll.Until(t, 15*time.Second, "the messages published after the second forged record delivered", func() bool {
		return a.count() == 12 && h.partsSettled(2)
	})
	got := map[uint64]int{}
	for _, call := range a.all() {
		got[call.seq]++
		if want := map[bool]string{true: "forged-1"}[call.seq == 1]; call.replay != want {
			t.Errorf("sequence %d came with Courier-Replay %q, want %q", call.seq, call.replay, want)
		}
	}
	for _, s := range seqs {
		if got[s] != 1 {
			t.Errorf("sequence %d reached the app %d times, want once", s, got[s])
		}
	}
	for _, want := range []string{`"rewind":"forged-1"`, `"rewind":"forged-2"`, "delivered, not acked unsent", "names generation 1 of the work stream's source, which is at generation 0"} {
		if !strings.Contains(c.logs.String(), want) {
			t.Errorf("the courier's logs lack %q", want)
		}
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
}
