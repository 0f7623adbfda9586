package partition

import (
	"slices"
	"testing"
)

// Every partition goes to exactly one member, about evenly, and a member
// leaving moves only the partitions it held.
func TestAssign(t *testing.T) {
	members := []string{"courier-7d9f-a", "courier-7d9f-b", "courier-7d9f-c"}
	const n = 60
	owner := map[int]string{}
	for _, m := range members {
		for _, p := range Assign(members, m, n) {
			if o, ok := owner[p]; ok {
				t.Fatalf("partition %d assigned to %s and %s", p, o, m)
			}
			owner[p] = m
		}
		if got := len(Assign(members, m, n)); got < n/6 {
			t.Errorf("%s holds %d of %d partitions: not spread", m, got, n)
		}
	}
	if len(owner) != n {
		t.Fatalf("%d of %d partitions assigned", len(owner), n)
	}
	rest := members[:2]
	for _, m := range rest {
		for _, p := range Assign(rest, m, n) {
			if owner[p] != m && owner[p] != members[2] {
				t.Errorf("partition %d moved from %s to %s though %s stayed", p, owner[p], m, owner[p])
			}
		}
	}
	if got := Assign([]string{"only"}, "only", 4); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Errorf("a lone member holds %v, want every partition", got)
	}
	if got := Assign(members, "stranger", 4); len(got) != 0 {
		t.Errorf("a courier outside the members holds %v", got)
	}
}
