package config

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// statusSyntax is appended to every parse error: what a StatusSet looks like.
const statusSyntax = "expected status codes from 100 to 599 and ranges such as 500-599, comma separated"

// ParseStatusSet parses a comma-separated list of HTTP status codes and
// inclusive ranges, such as "408,429,500,502-599". Spaces around items are
// ignored, and so are empty items. Codes run from 100 to 599, a range's low
// end comes first, and 2xx codes are refused: a 2xx is a success, always
// acked, and listing one as transient is a mistake. An error names every bad
// item; a list with no code at all is an error too.
func ParseStatusSet(s string) (StatusSet, error) {
	var (
		ranges [][2]int
		bad    []string
	)
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		r, err := parseStatusRange(item)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		ranges = append(ranges, r)
	}
	if len(bad) > 0 {
		return StatusSet{}, fmt.Errorf("%s (%s)", strings.Join(bad, "; "), statusSyntax)
	}
	if len(ranges) == 0 {
		return StatusSet{}, errors.New("no status codes (" + statusSyntax + ")")
	}
	return StatusSet{ranges: mergeRanges(ranges)}, nil
}

func parseStatusRange(item string) ([2]int, error) {
	loText, hiText, isRange := strings.Cut(item, "-")
	lo, err1 := strconv.Atoi(strings.TrimSpace(loText))
	hi, err2 := lo, error(nil)
	if isRange {
		hi, err2 = strconv.Atoi(strings.TrimSpace(hiText))
	}
	switch {
	case err1 != nil || err2 != nil:
		return [2]int{}, fmt.Errorf("%q is not a status code or range", item)
	case lo < 100 || lo > 599 || hi < 100 || hi > 599:
		return [2]int{}, fmt.Errorf("%q is outside 100-599", item)
	case lo > hi:
		return [2]int{}, fmt.Errorf("%q is backwards: the low end comes first", item)
	case lo <= 299 && hi >= 200:
		return [2]int{}, fmt.Errorf("%q includes 2xx, which is success: always acked, never retried", item)
	}
	return [2]int{lo, hi}, nil
}

// mergeRanges sorts ranges and joins those that overlap or touch, so that
// equal sets have one text.
func mergeRanges(ranges [][2]int) [][2]int {
	slices.SortFunc(ranges, func(a, b [2]int) int { return a[0] - b[0] })
	out := ranges[:1]
	for _, r := range ranges[1:] {
		last := &out[len(out)-1]
		if r[0] <= last[1]+1 {
			last[1] = max(last[1], r[1])
			continue
		}
		out = append(out, r)
	}
	return out
}

// Contains reports whether code is in the set.
func (s StatusSet) Contains(code int) bool {
	for _, r := range s.ranges {
		if code < r[0] {
			return false // ranges are sorted
		}
		if code <= r[1] {
			return true
		}
	}
	return false
}

// String returns the set in canonical form, which ParseStatusSet reads
// back: codes and ranges in ascending order, overlapping and adjacent ones
// merged (two adjacent codes stay two codes), such as
// "408,409,425,429,500,502-599". The empty set is "".
func (s StatusSet) String() string {
	parts := make([]string, len(s.ranges))
	for i, r := range s.ranges {
		switch r[1] - r[0] {
		case 0:
			parts[i] = strconv.Itoa(r[0])
		case 1: // two codes read better as such: 408,409, not 408-409
			parts[i] = strconv.Itoa(r[0]) + "," + strconv.Itoa(r[1])
		default:
			parts[i] = strconv.Itoa(r[0]) + "-" + strconv.Itoa(r[1])
		}
	}
	return strings.Join(parts, ",")
}
