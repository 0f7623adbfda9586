// Package editdist measures how far apart two names are, so that a name
// that is not known can be answered with the closest that is (a misspelt
// variable, stream or consumer).
package editdist

// Distance is the Levenshtein distance between a and b, in bytes (the
// names compared are ASCII).
func Distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Closest returns the name of known closest to name, if one is close
// enough to be what was meant (at most two edits, or a third of its
// length), else "". Of names as close, the first in known wins. The
// comparison is exact: callers fold case first where case does not count.
func Closest(name string, known []string) string {
	best, bestDist := "", -1
	for _, k := range known {
		d := Distance(name, k)
		if d > max(2, len(k)/3) {
			continue
		}
		if bestDist < 0 || d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}
