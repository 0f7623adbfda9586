package editdist

import "testing"

func TestDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"abc", "", 3},
		{"", "abc", 3},
		{"COURIER_MAX_INFLIGHT", "COURIER_MAX_INFLIGHT", 0},
		{"COURIER_MAX_INFLGHT", "COURIER_MAX_INFLIGHT", 1},
		{"orders", "ORDERS", 6},
		{"kitten", "sitting", 3},
	} {
		if got := Distance(c.a, c.b); got != c.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestClosest(t *testing.T) {
	known := []string{"status", "pause", "resume", "cleanup", "config", "dlq"}
	for _, c := range []struct{ name, want string }{
		{"statsu", "status"},
		{"staus", "status"},
		{"pasue", "pause"},
		{"clean-up", "cleanup"},
		{"dlg", "dlq"},
		{"frobnicate", ""},
		{"", ""},
		{"status", "status"},
	} {
		if got := Closest(c.name, known); got != c.want {
			t.Errorf("Closest(%q) = %q, want %q", c.name, got, c.want)
		}
	}
}
