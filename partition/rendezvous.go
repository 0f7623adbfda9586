package partition

import (
	"hash/fnv"
	"slices"
)

// Assign returns the partitions, out of partitions, that self is to pull
// from among members (self included or not), in increasing order. Each
// partition, in turn, goes to the member that scores highest for it
// (rendezvous hashing) among those still under their share, ceil(partitions
// / members): so that every member holds about as many (a replica's
// throughput is bounded by its share), a member joining or leaving moves
// few partitions, and every member computes the same answer from the same
// members.
func Assign(members []string, self string, partitions int) []int {
	ms := slices.Compact(slices.Sorted(slices.Values(members)))
	if len(ms) == 0 {
		return nil
	}
	share := (partitions + len(ms) - 1) / len(ms)
	load := make(map[string]int, len(ms))
	var out []int
	for p := range partitions {
		best, bestScore := "", uint64(0)
		for _, m := range ms {
			if load[m] >= share {
				continue
			}
			if s := score(m, p); best == "" || s > bestScore {
				best, bestScore = m, s
			}
		}
		load[best]++
		if best == self {
			out = append(out, p)
		}
	}
	return out
}

// score is member's weight for partition p: FNV-1a of both, finished with
// SplitMix64's mixer so that similar names (host-1, host-2) spread evenly.
func score(member string, p int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(member))
	h.Write([]byte{0, byte(p >> 24), byte(p >> 16), byte(p >> 8), byte(p)})
	z := h.Sum64()
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
