package proxy

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/orderkey"
	"github.com/courierhq/courier/ordermark"
)

func testOrderer(t *testing.T) (*orderer, *[]jetstream.Msg) {
	t.Helper()
	key, err := orderkey.Parse("subject:2")
	if err != nil {
		t.Fatal(err)
	}
	o := newOrderer(key, time.Now, newLetGo(), func(bool) {})
	var untracked []jetstream.Msg
	o.untrack = func(m jetstream.Msg) { untracked = append(untracked, m) }
	return o, &untracked
}

// clockedOrderer is an orderer of subject:2 keys on a clock the test moves
// (*at), awaiting heads out elsewhere for 5 s (markWait).
func clockedOrderer(t *testing.T) (*orderer, *time.Time) {
	t.Helper()
	key, err := orderkey.Parse("subject:2")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1000, 0)
	o := newOrderer(key, func() time.Time { return at }, newLetGo(), func(bool) {})
	o.markWait = 5 * time.Second
	return o, &at
}

// A message waiting behind its key that comes back (its ack wait ran out
// while courier held it; the tracker prevents it, so the messages here are
// made up) replaces the waiting copy, which is no longer kept in progress:
// a partition's hand-over waits for nothing that will never be settled.
func TestOrderRedeliveredWaitingCopyUntracked(t *testing.T) {
	o, untracked := testOrderer(t)
	head, first, again := &fakeMsg{seq: 1}, &fakeMsg{seq: 2}, &fakeMsg{seq: 2}
	if !o.admit(&queued{m: head}) {
		t.Fatal("the key's first message waits")
	}
	if o.admit(&queued{m: first}) || o.admit(&queued{m: again}) {
		t.Fatal("a later message of a busy key goes")
	}
	if len(*untracked) != 1 || (*untracked)[0] != first {
		t.Fatalf("untracked %v, want the replaced copy", *untracked)
	}
	if n := o.waitingBehind("x"); n != 1 {
		t.Errorf("%d waiting, want 1", n)
	}
}

// Handing a partition on: what waits behind a head that is not in flight
// (retried) is returned in stream order and its line forgotten; a line
// whose head is in flight goes on, until that head is retried too.
func TestOrderHandOn(t *testing.T) {
	o, _ := testOrderer(t)
	msgs := map[uint64]*fakeMsg{}
	admit := func(seq uint64, subject string) bool {
		m := &fakeMsg{seq: seq, subject: subject}
		msgs[seq] = m
		return o.admit(&queued{m: m})
	}
	admit(1, "s.a")
	admit(2, "s.b")
	admit(4, "s.a")
	admit(3, "s.a")
	admit(5, "s.b")
	o.retrying("a", 1, time.Second) // a's head awaits its redelivery
	got := o.handOn()
	if len(got) != 2 || got[0].seq != 3 || got[1].seq != 4 {
		t.Fatalf("handOn returned %v, want a's 3 and 4", seqs(got))
	}
	if n := o.waitingBehind("b"); n != 1 {
		t.Errorf("b has %d waiting, want its 5 still", n)
	}
	if back := o.retrying("b", 2, time.Second); len(back) != 1 || back[0] != jetstream.Msg(msgs[5]) {
		t.Errorf("b's head retried while handing on gave back %d messages, want 5 alone", len(back))
	}
}

// The pull the pin came with brings back what another courier held in the
// order each fell due (JETSTREAM.md, "Order"): held until open, they go in
// stream order, though the key's head, known from its mark, came first and
// could be settled before an earlier message than the next one arrived.
func TestOrderHeldUntilThePullIsIn(t *testing.T) {
	o, _ := testOrderer(t)
	o.marks = newMarker(nil, slog.Default()) // never written: not run
	o.mu.Lock()
	o.markWait = time.Minute
	o.addMarked("k", ordermark.Mark{Seq: 1})
	o.mu.Unlock()
	o.hold()
	for _, seq := range []uint64{1, 3, 2, 4} {
		if o.admit(&queued{m: &fakeMsg{seq: seq, subject: "s.k"}}) {
			t.Fatalf("%d went while the pull's messages were held", seq)
		}
	}
	if q, ok := o.rel.pop(); ok {
		t.Fatalf("%d let go while held", q.seq)
	}
	o.open(false)
	var order []uint64
	for range 4 {
		q, ok := o.rel.pop()
		if !ok {
			t.Fatalf("let go %v, then nothing", order)
		}
		order = append(order, q.seq)
		o.settled("k", q.seq)
	}
	if fmt.Sprint(order) != "[1 2 3 4]" {
		t.Errorf("let go in the order %v, want [1 2 3 4]", order)
	}
}

func seqs(qs []queued) []uint64 {
	out := make([]uint64, len(qs))
	for i, q := range qs {
		out[i] = q.seq
	}
	return out
}

// The pin moved away while a key's head was with a worker and a later
// message waited behind it (given back), then came back before that
// message did (a consumer leader change moves the pin and gives it again):
// once the head is settled here, the given-back message is the key's next,
// and a still later one arriving first waits for it.
func TestOrderPinBackAwaitsWhatWasGivenBack(t *testing.T) {
	for _, marks := range []bool{false, true} {
		t.Run(fmt.Sprint("marks=", marks), func(t *testing.T) {
			o, _ := testOrderer(t)
			if marks {
				o.marks = newMarker(nil, slog.Default()) // never written: not run
			}
			if !o.admit(&queued{m: &fakeMsg{seq: 6, subject: "s.k"}}) {
				t.Fatal("the key's first message waits")
			}
			if q, ok := o.rel.pop(); ok {
				t.Fatalf("%d let go: admit sends the head itself", q.seq)
			}
			if o.admit(&queued{m: &fakeMsg{seq: 7, subject: "s.k"}}) {
				t.Fatal("7 went while 6 was with a worker")
			}
			back := o.unpinned()
			if len(back) != 1 || back[0].seq != 7 {
				t.Fatalf("unpinned gave back %v, want 7", seqs(back))
			}
			o.settled("k", 6) // the head's request was answered 2xx
			if o.admit(&queued{m: &fakeMsg{seq: 8, subject: "s.k"}}) {
				t.Fatal("8 went before 7, which was given back, came back")
			}
			if !o.admit(&queued{m: &fakeMsg{seq: 7, subject: "s.k"}}) {
				t.Fatal("7, the key's next, waits")
			}
			o.settled("k", 7)
			if q, ok := o.rel.pop(); !ok || q.seq != 8 {
				t.Fatalf("after 7, let go %v %v, want 8", q.seq, ok)
			}
		})
	}
}

// A key's mark may name a later message than one the consumer still has
// out: a courier that took the pin without knowing what was out (its
// barrier) gave back the later one and marked it. When the pin comes to
// this courier with both out, the earlier is awaited first, and the marked
// one, arriving first, waits for it.
func TestOrderAwaitOutBeforeAMarkedHead(t *testing.T) {
	o, _ := testOrderer(t)
	o.marks = newMarker(nil, slog.Default()) // never written: not run
	o.mu.Lock()
	o.markWait = time.Minute
	o.addMarked("k", ordermark.Mark{Seq: 5})
	o.mu.Unlock()
	o.awaitOut(map[string][]uint64{"k": {3, 5, 8}})
	o.open(true)
	if o.admit(&queued{m: &fakeMsg{seq: 5, subject: "s.k"}}) {
		t.Fatal("5, the marked head, went while 3, earlier, was out")
	}
	if o.admit(&queued{m: &fakeMsg{seq: 8, subject: "s.k"}}) {
		t.Fatal("8 went while 3 and 5 were out")
	}
	if !o.admit(&queued{m: &fakeMsg{seq: 3, subject: "s.k"}}) {
		t.Fatal("3, the earliest out, waits")
	}
	var order []uint64
	o.settled("k", 3)
	for range 2 {
		q, ok := o.rel.pop()
		if !ok {
			t.Fatalf("after 3, let go %v, then nothing", order)
		}
		order = append(order, q.seq)
		o.settled("k", q.seq)
	}
	if fmt.Sprint(order) != "[5 8]" {
		t.Errorf("after 3, let go %v, want [5 8]", order)
	}
}

// A key's head awaited at a takeover (out with another courier) that then
// comes to this courier and is retried here comes back here, however long
// its redelivery takes (a pull lost in a consumer leader change costs an
// ack wait): the key's later messages wait for it, not only for the time
// a head known from elsewhere is awaited (order chaos, partitions, seed 7:
// k4/13 sent before k4/12).
func TestOrderRetryOfAnAwaitedHeadAwaitedAsLongAsItTakes(t *testing.T) {
	o, _ := testOrderer(t)
	o.mu.Lock()
	o.markWait = time.Millisecond
	o.mu.Unlock()
	o.awaitOut(map[string][]uint64{"k": {3}})
	o.open(true)
	if !o.admit(&queued{m: &fakeMsg{seq: 3, subject: "s.k"}}) {
		t.Fatal("3, the awaited head, waits")
	}
	if o.admit(&queued{m: &fakeMsg{seq: 4, subject: "s.k"}}) {
		t.Fatal("4 went while 3 was with a worker")
	}
	o.retrying("k", 3, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	o.lift()
	if q, ok := o.rel.pop(); ok {
		t.Fatalf("%d let go while 3, retried here, had not come back", q.seq)
	}
	if !o.admit(&queued{m: &fakeMsg{seq: 3, subject: "s.k"}}) {
		t.Fatal("3, redelivered, waits")
	}
	o.settled("k", 3)
	if q, ok := o.rel.pop(); !ok || q.seq != 4 {
		t.Fatalf("after 3, let go %v %v, want 4", q.seq, ok)
	}
}

// An earlier message of a key redelivered while the key's head waits for
// its retry (an ack lost in a leader change brings a settled message back)
// goes first, as a duplicate or not; then the retried head is awaited
// again before the key's later messages (order chaos, partitions, seed 18:
// k5/9 sent before k5/8, retried, when k5/5 came back).
func TestOrderEarlierRedeliveryThenTheRetriedHead(t *testing.T) {
	o, _ := testOrderer(t)
	if !o.admit(&queued{m: &fakeMsg{seq: 8, subject: "s.k"}}) {
		t.Fatal("the key's first message waits")
	}
	if o.admit(&queued{m: &fakeMsg{seq: 9, subject: "s.k"}}) {
		t.Fatal("9 went while 8 was with a worker")
	}
	o.retrying("k", 8, time.Second)
	if !o.admit(&queued{m: &fakeMsg{seq: 5, subject: "s.k"}}) {
		t.Fatal("5, earlier, redelivered while 8 waits for its retry, waits")
	}
	o.settled("k", 5)
	if q, ok := o.rel.pop(); ok {
		t.Fatalf("%d let go while 8, retried, had not come back", q.seq)
	}
	o.lift()
	if q, ok := o.rel.pop(); ok {
		t.Fatalf("%d let go while 8, retried, had not come back", q.seq)
	}
	if !o.admit(&queued{m: &fakeMsg{seq: 8, subject: "s.k"}}) {
		t.Fatal("8, redelivered, waits")
	}
	o.settled("k", 8)
	if q, ok := o.rel.pop(); !ok || q.seq != 9 {
		t.Fatalf("after 8, let go %v %v, want 9", q.seq, ok)
	}
}

// A keyed message admitted before the pin moved away lapses (is no longer
// kept in progress, tracker.lapse) unless its request was already passing
// its last checks or sent: the courier pinned now awaits it for an ack
// wait, so it must come back within one.
func TestOrderMessagesAdmittedBeforeThePinMovedLapse(t *testing.T) {
	o, _ := testOrderer(t)
	lapsed := map[jetstream.Msg]func() bool{}
	o.lapse = func(m jetstream.Msg, f func() bool) { lapsed[m] = f }
	unsent, sent, behind := &fakeMsg{seq: 1, subject: "s.a"}, &fakeMsg{seq: 2, subject: "s.b"}, &fakeMsg{seq: 3, subject: "s.a"}
	qs := map[jetstream.Msg]*queued{}
	for _, m := range []*fakeMsg{unsent, sent, behind} {
		q := &queued{m: m}
		o.admit(q)
		qs[m] = q
	}
	for m, f := range lapsed {
		if f() {
			t.Fatalf("message %d lapsed while the pin is this courier's", m.(*fakeMsg).seq)
		}
	}
	qs[sent].sending.Store(true)
	o.unpinned()
	if !lapsed[unsent]() {
		t.Error("a head admitted before the pin moved, not sent, is still kept in progress")
	}
	if lapsed[sent]() {
		t.Error("a head sent before the pin moved is no longer kept in progress")
	}
	if len(lapsed) != 3 {
		t.Errorf("%d messages given a lapse, want every keyed one (3)", len(lapsed))
	}
	after := &queued{m: &fakeMsg{seq: 4, subject: "s.c"}}
	o.admit(after)
	if lapsed[after.m]() {
		t.Error("a message admitted after the pin moved lapsed")
	}
}

// While the consumer does not answer (its leader being elected), nothing
// out can come back: the wait for what was out at a takeover starts over
// (postpone), so a key's later message does not go first once the wait
// would have run out meanwhile.
func TestOrderWaitForWhatIsOutStartsOverWhileTheConsumerIsAway(t *testing.T) {
	o, at := clockedOrderer(t)
	o.awaitOut(map[string][]uint64{"a": {5}})
	later := &queued{m: &fakeMsg{seq: 6, subject: "s.a"}}
	if o.admit(later) {
		t.Fatal("a key's later message goes while an earlier one is out")
	}
	*at = (*at).Add(4 * time.Second)
	if !o.awaiting() {
		t.Fatal("nothing awaited while a message is out")
	}
	o.postpone()                     // a read of the consumer failed
	*at = (*at).Add(3 * time.Second) // past the first wait, within the new one
	o.lift()
	if o.lines["a"] == nil || o.lines["a"].head != 5 {
		t.Fatal("the message out was given up within the wait begun again when the consumer did not answer")
	}
	*at = (*at).Add(3 * time.Second)
	o.lift()
	if l := o.lines["a"]; l == nil || l.head != 6 {
		t.Errorf("line %+v: want the later message let go once the new wait is over", o.lines["a"])
	}
}

// supersedes is a rewind of stream S from origin from whose work stream
// stood at copied when it was re-sourced (rewind.Record.Supersedes).
type supersedes struct{ from, copied atomic.Uint64 }

func (r *supersedes) Replay(string, uint64) string { return "" }
func (r *supersedes) Superseded(stream string, seq, work uint64, _ int, _ time.Time) bool {
	return stream == "S" && seq >= r.from.Load() && work <= r.copied.Load()
}

// copyMsg is a partition's message of key k at sequence work of the work
// stream, copying sequence origin of stream S.
func copyMsg(work, origin uint64) *queued {
	m := &fakeMsg{seq: work, subject: "p.s.k"}
	return &queued{m: &sourcedMsg{Msg: m, subject: "s.k", seq: work, named: true,
		meta: &jetstream.MsgMetadata{Stream: "S", Sequence: jetstream.SequencePair{Stream: origin}, Timestamp: time.Now()}}}
}

// A rewind of a partitioned durable while a key's head waits out a retry
// with later messages behind it: they are earlier copies of messages the
// rewind copies again (superseded). The first of the rewind's copies to
// arrive stops the line awaiting the retried head: what waited behind it
// is let go (its workers ack it unsent), then the copies in stream order.
// The head, when it comes back, passes the line by, which its settling
// does not disturb.
func TestOrderPassesOverASupersededRetriedHead(t *testing.T) {
	o, _ := testOrderer(t)
	rw := &supersedes{}
	o.rewinds = rw
	if !o.admit(copyMsg(2, 2)) {
		t.Fatal("the key's first message waits")
	}
	if o.admit(copyMsg(3, 3)) || o.admit(copyMsg(4, 4)) {
		t.Fatal("a later message went while 2 was with a worker")
	}
	o.retrying("k", 2, time.Hour)
	// The rewind to origin 1: the work stream stood at 4.
	rw.from.Store(1)
	rw.copied.Store(4)
	if o.admit(copyMsg(5, 1)) {
		t.Fatal("the copy of origin 1 went before what waited behind the retried head")
	}
	var order []uint64
	for range 3 {
		q, ok := o.rel.pop()
		if !ok {
			t.Fatalf("let go %v, then nothing", order)
		}
		order = append(order, q.seq)
		if q.seq == 3 && o.admit(copyMsg(6, 2)) {
			t.Fatal("the copy of origin 2 went while 3 was with a worker")
		}
		if q.seq != 5 {
			o.settled("k", q.seq) // acked unsent
		}
	}
	if fmt.Sprint(order) != "[3 4 5]" {
		t.Fatalf("let go %v, want [3 4 5]: the retried head not awaited", order)
	}
	// 5 with a worker, 6 behind it; the retried head comes back.
	if !o.admit(copyMsg(2, 2)) {
		t.Fatal("the retried head, superseded, came back and waits")
	}
	if n := o.settled("k", 2); n != 0 {
		t.Errorf("the retried head's settling said %d waited behind it", n)
	}
	if q, ok := o.rel.pop(); ok {
		t.Fatalf("%d let go by the retried head's settling", q.seq)
	}
	if n := o.settled("k", 5); n != 1 {
		t.Errorf("5 settled with %d behind it, want 1", n)
	}
	if q, ok := o.rel.pop(); !ok || q.seq != 6 {
		t.Fatalf("after 5, let go %v %v, want 6", q.seq, ok)
	}
}

// A key's retried head that no rewind supersedes, or one known only by its
// work stream's sequence, is awaited as before.
func TestOrderAwaitsARetriedHeadNotSuperseded(t *testing.T) {
	for _, tc := range []struct {
		name string
		head *queued
	}{
		{"before the rewind's point", copyMsg(2, 2)},
		{"no origin", &queued{m: &fakeMsg{seq: 2, subject: "s.k"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, _ := testOrderer(t)
			rw := &supersedes{}
			o.rewinds = rw
			if !o.admit(tc.head) {
				t.Fatal("the key's first message waits")
			}
			o.retrying("k", 2, time.Hour)
			rw.from.Store(3)
			rw.copied.Store(4)
			if o.admit(copyMsg(5, 3)) {
				t.Fatal("the rewind's copy went while the retried head was awaited")
			}
			if q, ok := o.rel.pop(); ok {
				t.Fatalf("%d let go while the retried head was awaited", q.seq)
			}
		})
	}
}

// A head awaited until stale whose redelivery is late (lost, or delayed by
// a leader's election) is awaited a few times longer while the consumer's
// ack floor is below it: still out, it comes back. Past that, or once the
// floor passes it, its line goes on.
func TestOrderStaleHeadAboveTheFloorAwaitedLonger(t *testing.T) {
	o, at := clockedOrderer(t)
	o.ackFloor(4)
	o.awaitOut(map[string][]uint64{"a": {5}})
	if o.admit(&queued{m: &fakeMsg{seq: 6, subject: "s.a"}}) {
		t.Fatal("a key's later message goes while an earlier one is out")
	}
	for i := range staleExtensions {
		*at = (*at).Add(6 * time.Second)
		o.lift()
		if l := o.lines["a"]; l == nil || l.head != 5 {
			t.Fatalf("after %d waits the head out was given up while the ack floor is below it", i+1)
		}
	}
	*at = (*at).Add(6 * time.Second)
	o.lift()
	if l := o.lines["a"]; l == nil || l.head != 6 {
		t.Errorf("line %+v: want the later message let go once the head was awaited %d times longer", o.lines["a"], staleExtensions)
	}

	o.awaitOut(map[string][]uint64{"b": {10}})
	o.ackFloor(10)
	if l := o.lines["b"]; l != nil {
		t.Errorf("line %+v: want a head the ack floor passed let go", l)
	}
}
