package subject

import (
	"fmt"
	"strings"
	"testing"
)

func TestPartitionTransforms(t *testing.T) {
	for _, tc := range []struct {
		filters []string
		token   int
		want    []string // source → destination
	}{
		{[]string{"orders.*.*"}, 2, []string{"orders.*.* → {{partition(4,1)}}.orders.{{wildcard(1)}}.{{wildcard(2)}}"}},
		{[]string{"orders.*.*"}, 3, []string{"orders.*.* → {{partition(4,2)}}.orders.{{wildcard(1)}}.{{wildcard(2)}}"}},
		{[]string{"orders.*.>"}, 2, []string{"orders.*.> → {{partition(4,1)}}.orders.{{wildcard(1)}}.>"}},
		{[]string{"orders.>"}, 2, []string{
			"orders.* → {{partition(4,1)}}.orders.{{wildcard(1)}}",
			"orders.*.> → {{partition(4,1)}}.orders.{{wildcard(1)}}.>",
		}},
		{[]string{"orders.>"}, 3, []string{
			"orders.* → {{partition(4)}}.orders.{{wildcard(1)}}",
			"orders.*.* → {{partition(4,2)}}.orders.{{wildcard(1)}}.{{wildcard(2)}}",
			"orders.*.*.> → {{partition(4,2)}}.orders.{{wildcard(1)}}.{{wildcard(2)}}.>",
		}},
		{[]string{">"}, 1, []string{"* → {{partition(4,1)}}.{{wildcard(1)}}", "*.> → {{partition(4,1)}}.{{wildcard(1)}}.>"}},
		{[]string{"a.b", "c.*"}, 3, []string{"a.b → {{partition(4)}}.a.b", "c.* → {{partition(4)}}.c.{{wildcard(1)}}"}},
	} {
		got, err := PartitionTransforms(tc.filters, tc.token, 4)
		if err != nil {
			t.Errorf("%q token %d: %v", tc.filters, tc.token, err)
			continue
		}
		var lines []string
		for _, tr := range got {
			lines = append(lines, tr.Source+" → "+tr.Destination)
		}
		if fmt.Sprint(lines) != fmt.Sprint(tc.want) {
			t.Errorf("%q token %d:\n got %q\nwant %q", tc.filters, tc.token, lines, tc.want)
		}
	}
}

func TestPartitionTransformsRefuse(t *testing.T) {
	for _, tc := range []struct {
		filters []string
		token   int
		want    string
	}{
		{[]string{"orders.eu.*"}, 2, `"orders.eu.*" has "eu" as its token 2`},
		{[]string{"orders.*", "x.y.>"}, 2, `"x.y.>" has "y"`},
		{[]string{"orders..x"}, 2, "empty token"},
		{[]string{"orders.*"}, 0, "at least 1"},
	} {
		_, err := PartitionTransforms(tc.filters, tc.token, 4)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q token %d: error %v, want one saying %q", tc.filters, tc.token, err, tc.want)
		}
	}
}

// Each generation writes one more zero in front of every partition count
// of a destination; Generation reads it back from one destination or
// several joined by form feeds.
func TestGeneration(t *testing.T) {
	dests := "{{partition(4,1)}}.orders.{{wildcard(1)}}.>\f{{partition(4,1)}}.orders.{{wildcard(1)}}"
	for gen := range 4 {
		got := AtGeneration(dests, gen)
		if n := strings.Count(got, "{{partition("+strings.Repeat("0", gen)+"4,1)}}"); n != 2 {
			t.Errorf("generation %d written as %q", gen, got)
		}
		if g := Generation(got); g != gen {
			t.Errorf("Generation(%q) = %d, want %d", got, g, gen)
		}
		if again := AtGeneration(got, 0); again != dests {
			t.Errorf("generation %d written back at 0 as %q", gen, again)
		}
	}
	if g := Generation("orders.{{wildcard(1)}}"); g != 0 {
		t.Errorf("a destination without a partition at generation %d", g)
	}
}
