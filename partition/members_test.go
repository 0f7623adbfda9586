package partition

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

// Three members share the partitions out, each exactly once; one that
// leaves (deletes its key) and one that dies (its key expires) hand theirs
// to the others.
func TestMembers(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	const n = 12
	type running struct {
		m    *Members
		stop func()
	}
	join := func(id string, run bool) running {
		t.Helper()
		// Join's context ends as it returns: the watch must outlive it.
		jctx, jcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer jcancel()
		m, err := Join(jctx, js, MembersBucket("S", "c"), Options{
			Instance: id, Partitions: n, Interval: 200 * time.Millisecond, TTL: time.Second,
			Pins: func() map[int]string { return map[int]string{0: "pin-" + id} },
		})
		if err != nil {
			t.Fatal(err)
		}
		if !run {
			return running{m: m, stop: m.stopWatch}
		}
		stop := m.Start(context.Background())
		t.Cleanup(stop)
		return running{m: m, stop: stop}
	}
	// shared reports whether ms hold every partition, each once.
	shared := func(ms ...*Members) bool {
		var all []int
		for _, m := range ms {
			got, _ := m.Assigned()
			all = append(all, got...)
		}
		slices.Sort(all)
		return len(all) == n && len(slices.Compact(all)) == n
	}
	a := join("a", true)
	if got, _ := a.m.Assigned(); len(got) != n {
		t.Fatalf("a alone holds %v, want all %d", got, n)
	}
	b := join("b", true)
	c := join("c", false) // joins, then dies: never renews its key
	poll.Until(t, 10*time.Second, "a, b and c sharing the partitions", func() bool { return shared(a.m, b.m, c.m) })
	members, err := ReadMembers(context.Background(), js, MembersBucket("S", "c"))
	if err != nil || len(members) != 3 || members[0].Pins[0] != "pin-"+members[0].Instance {
		t.Errorf("ReadMembers: %+v, %v; want a, b and c with their pins", members, err)
	}
	c.stop()
	poll.Until(t, 10*time.Second, "a and b taking c's partitions after its key expired", func() bool { return shared(a.m, b.m) })
	_, changed := a.m.Assigned()
	b.stop()
	poll.Until(t, 5*time.Second, "a taking b's partitions after b left", func() bool { return shared(a.m) })
	select {
	case <-changed:
	default:
		t.Error("a's assignment changed without closing its channel")
	}
}
