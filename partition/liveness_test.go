package partition

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

// A courier's term lasts while its heartbeats are stored within the TTL:
// it ends once the TTL runs out, whether or not anything asked meanwhile,
// and the next heartbeat stored begins another.
func TestTerm(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := Join(ctx, js, MembersBucket("S", "c"), Options{Instance: "a", Partitions: 1, TTL: 3 * time.Second, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.stopWatch)
	check := func(what string, wantTerm uint64, wantLive bool) {
		t.Helper()
		if term, live := m.Term(); term != wantTerm || live != wantLive {
			t.Errorf("%s: term %d, live %v; want %d, %v", what, term, live, wantTerm, wantLive)
		}
	}
	check("joined", 1, true)
	advance(2 * time.Second)
	check("2s after its heartbeat", 1, true)
	if err := m.put(ctx); err != nil {
		t.Fatal(err)
	}
	check("renewed within the TTL", 1, true)
	advance(3 * time.Second)
	check("the TTL after its heartbeat", 1, false)
	if err := m.put(ctx); err != nil {
		t.Fatal(err)
	}
	check("a heartbeat stored after it lapsed", 2, true)
	// Paused past the TTL, and a heartbeat stored before anything asks.
	advance(5 * time.Second)
	if err := m.put(ctx); err != nil {
		t.Fatal(err)
	}
	check("a heartbeat stored after a pause, unasked", 3, true)
}

// The pin of a courier whose key expired, and a pin no courier names, are
// orphaned for the courier the partition is assigned to, and for no other;
// a live courier's pin is not.
func TestOrphaned(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	join := func(id string) *Members {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m, err := Join(ctx, js, MembersBucket("S", "c"), Options{
			Instance: id, Partitions: 1, Interval: 200 * time.Millisecond, TTL: time.Second,
			Pins: func() map[int]string { return map[int]string{0: "pin-" + id} },
		})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a, b := join("a"), join("b")
	t.Cleanup(a.Start(context.Background()))
	t.Cleanup(b.Start(context.Background()))
	dead := join("dead") // never renews its key
	dead.stopWatch()
	// assignee is the one of a and b the partition is assigned to, once
	// both see only each other.
	var assignee, other *Members
	poll.Until(t, 10*time.Second, "the dead courier's key expired, and the partition assigned to a or b", func() bool {
		ga, _ := a.Assigned()
		gb, _ := b.Assigned()
		a.mu.Lock()
		_, stillA := a.seen["dead"]
		a.mu.Unlock()
		b.mu.Lock()
		_, stillB := b.seen["dead"]
		b.mu.Unlock()
		if stillA || stillB || len(ga)+len(gb) != 1 {
			return false
		}
		assignee, other = a, b
		if len(gb) == 1 {
			assignee, other = b, a
		}
		return true
	})
	if !assignee.Orphaned(0, "pin-dead") {
		t.Error("the dead courier's pin is not orphaned for the courier the partition is assigned to")
	}
	if other.Orphaned(0, "pin-dead") {
		t.Error("the dead courier's pin is orphaned for a courier the partition is not assigned to")
	}
	if assignee.Orphaned(0, "pin-"+other.Instance()) {
		t.Error("a live courier's pin is orphaned")
	}
	if assignee.Orphaned(0, "pin-unknown") {
		t.Error("a pin no courier names is orphaned at once")
	}
	poll.Until(t, 5*time.Second, "a pin no courier names orphaned a TTL after it was first asked of", func() bool {
		return assignee.Orphaned(0, "pin-unknown")
	})
}

// A courier that could not store its heartbeats for a while (here, its
// clock jumps past its TTL, as a pause or a bucket out of reach leaves it)
// begins a new term with its next one, and takes no other courier's pin
// for orphaned until that term has lasted the TTL: the others were likely
// cut off as it was, and are given the time to put theirs again.
func TestOrphanedNotByACourierJustBack(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	var mu sync.Mutex
	var ahead time.Duration
	now := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return time.Now().Add(ahead)
	}
	const ttl = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := Join(ctx, js, MembersBucket("S", "c"), Options{
		Instance: "a", Partitions: 1, Interval: 100 * time.Millisecond, TTL: ttl, Now: now,
		Pins: func() map[int]string { return map[int]string{0: "pin-a"} },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Start(context.Background()))
	poll.Until(t, 10*time.Second, "a pin no courier names orphaned", func() bool { return a.Orphaned(0, "pin-gone") })
	before, _ := a.Term()
	mu.Lock()
	ahead = 2 * ttl
	mu.Unlock()
	jumped := time.Now()
	if a.Orphaned(0, "pin-gone") {
		t.Fatal("a pin is orphaned for a courier whose own heartbeat is older than its TTL")
	}
	poll.Until(t, 5*time.Second, "a new term", func() bool {
		term, live := a.Term()
		return live && term > before
	})
	for time.Since(jumped) < ttl/2 {
		if a.Orphaned(0, "pin-gone") {
			t.Fatalf("a pin is orphaned %s after the courier's new term began, within its TTL (%s)", time.Since(jumped), ttl)
		}
		time.Sleep(20 * time.Millisecond)
	}
	poll.Until(t, 5*time.Second, "the pin orphaned once the new term lasted the TTL", func() bool { return a.Orphaned(0, "pin-gone") })
}

// A membership bucket deleted while couriers run is made again by their
// next heartbeat: their terms go on.
func TestBucketMadeAgain(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := Join(ctx, js, MembersBucket("S", "c"), Options{Instance: "a", Partitions: 1, Interval: 200 * time.Millisecond, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Start(context.Background()))
	if err := js.DeleteKeyValue(ctx, MembersBucket("S", "c")); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the bucket made again, holding the courier's key", func() bool {
		kv, err := js.KeyValue(ctx, MembersBucket("S", "c"))
		if err != nil {
			return false
		}
		_, err = kv.Get(ctx, "members.a")
		return err == nil
	})
	if _, live := m.Term(); !live {
		t.Error("the courier's term lapsed")
	}
}
