package subject

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Transform is a subject transform of a stream source: messages matching
// Source are stored under Destination (nats-server's subject mapping
// functions, such as {{wildcard(1)}} and {{partition(n,1)}}).
type Transform struct {
	Source, Destination string
}

// PartitionTransforms returns the transforms that put the partition of a
// message's token-th token (1-based), out of partitions, in front of its
// subject, for a source whose subjects are filters (a stream's subjects, or
// a consumer's filter subjects). The server computes a partition from
// wildcard tokens only, so the key's token must be a '*' in each filter, or
// fall under its '>' (then the filter is split: the subjects short of the
// key, which have none and are spread by their whole subject, and those
// with it); a filter with a literal there is refused with an error naming
// it. A filter with fewer tokens than token, and no '>', has no key either:
// its messages are spread by their whole subject.
func PartitionTransforms(filters []string, token, partitions int) ([]Transform, error) {
	if token < 1 || partitions < 1 {
		return nil, fmt.Errorf("partitioning by token %d into %d partitions: both must be at least 1", token, partitions)
	}
	var out []Transform
	for _, f := range filters {
		if err := Check(f); err != nil {
			return nil, err
		}
		toks := strings.Split(f, ".")
		full := toks[len(toks)-1] == ">"
		fixed := toks
		if full {
			fixed = toks[:len(toks)-1]
		}
		switch {
		case token <= len(fixed) && fixed[token-1] != "*":
			return nil, fmt.Errorf("subject %q has %q as its token %d, the ordering key: the server partitions by wildcard tokens only, so that token must be a *; give COURIER_SUBJECTS filters with * there", f, fixed[token-1], token)
		case token <= len(fixed):
			out = append(out, partitionBy(toks, token, partitions))
		case !full:
			out = append(out, partitionBy(toks, 0, partitions)) // no key
		default:
			// The '>' holds the key's token: the subjects that end short of
			// it have no key; those that reach it are partitioned by it.
			for n := len(fixed) + 1; n < token; n++ {
				out = append(out, partitionBy(stars(fixed, n), 0, partitions))
			}
			keyed := stars(fixed, token)
			out = append(out, partitionBy(keyed, token, partitions),
				partitionBy(append(keyed, ">"), token, partitions))
		}
	}
	return out, nil
}

// stars is fixed followed by '*' tokens up to n tokens in all.
func stars(fixed []string, n int) []string {
	out := append([]string(nil), fixed...)
	for len(out) < n {
		out = append(out, "*")
	}
	return out
}

// partitionBy is the transform of the filter toks that prepends the
// partition of its token-th token (0: of the whole subject) and keeps the
// subject as it was.
func partitionBy(toks []string, token, partitions int) Transform {
	dest := make([]string, len(toks))
	wildcard, keyWildcard := 0, 0
	for i, t := range toks {
		switch t {
		case "*":
			wildcard++
			if i == token-1 {
				keyWildcard = wildcard
			}
			dest[i] = "{{wildcard(" + strconv.Itoa(wildcard) + ")}}"
		default:
			dest[i] = t
		}
	}
	p := "{{partition(" + strconv.Itoa(partitions) + ")}}"
	if keyWildcard > 0 {
		p = "{{partition(" + strconv.Itoa(partitions) + "," + strconv.Itoa(keyWildcard) + ")}}"
	}
	return Transform{Source: strings.Join(toks, "."), Destination: p + "." + strings.Join(dest, ".")}
}

// A work stream's source written again by a rewind (package partition,
// resource.go) writes each partition count with one more leading zero:
// "{{partition(04,1)}}", then "{{partition(004,1)}}". The server reads the
// count as a number, so the partitions stay as they were; the zeros count
// the source's generation, and the server's Nats-Stream-Source header names
// the destinations of the source that copied each message, zeros and all.

// partitionArg is where a destination's partition count starts, with the
// zeros in front of it.
var partitionArg = regexp.MustCompile(`\{\{partition\((0*)`)

// Generation is the generation written in destinations, one transform
// destination or several joined by form feeds (as a Nats-Stream-Source
// header lists them): the zeros in front of the first partition count; 0
// without one.
func Generation(destinations string) int {
	m := partitionArg.FindStringSubmatch(destinations)
	if m == nil {
		return 0
	}
	return len(m[1])
}

// AtGeneration is destination with each partition count written for
// generation gen.
func AtGeneration(destination string, gen int) string {
	return partitionArg.ReplaceAllString(destination, "{{partition("+strings.Repeat("0", gen))
}
