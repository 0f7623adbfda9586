package partition

import (
	"slices"
	"testing"
)

// Every partition goes to exactly one member, each holding its share
// (ceil(partitions / members)) at most, and a member leaving moves few of
// the others' partitions.
func TestAssign(t *testing.T) {
	members := []string{"courier-7d9f-a", "courier-7d9f-b", "courier-7d9f-c"}
	for _, n := range []int{2, 8, 12, 60} {
		owner := map[int]string{}
		for _, m := range members {
			got := Assign(members, m, n)
			for _, p := range got {
				if o, ok := owner[p]; ok {
					t.Fatalf("%d partitions: partition %d assigned to %s and %s", n, p, o, m)
				}
				owner[p] = m
			}
			if share := (n + 2) / 3; len(got) > share || n >= 3 && len(got) < n/3 {
				t.Errorf("%d partitions: %s holds %d, want about %d", n, m, len(got), share)
			}
		}
		if len(owner) != n {
			t.Fatalf("%d partitions: %d assigned", n, len(owner))
		}
		rest, moved := members[:2], 0
		for _, m := range rest {
			for _, p := range Assign(rest, m, n) {
				if owner[p] != m && owner[p] != members[2] {
					moved++
				}
			}
		}
		if n >= 8 && moved > n/4 {
			t.Errorf("%d partitions: %d of those of the members that stayed moved when one left", n, moved)
		}
	}
	if got := Assign([]string{"only"}, "only", 4); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Errorf("a lone member holds %v, want every partition", got)
	}
	if got := Assign(members, "stranger", 4); len(got) != 0 {
		t.Errorf("a courier outside the members holds %v", got)
	}
	reversed := slices.Clone(members)
	slices.Reverse(reversed)
	if a, b := Assign(members, members[0], 12), Assign(reversed, members[0], 12); !slices.Equal(a, b) {
		t.Errorf("the order members are listed in changes the assignment: %v, %v", a, b)
	}
}
