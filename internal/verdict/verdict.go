// Package verdict names what a dedup store says of a key before a delivery.
// It is the one type proxy (which asks) and dedup (which answers) share, so
// neither imports the other.
package verdict

// Verdict is a dedup store's answer for one key.
type Verdict int

const (
	// New: the key has not been processed. A store shared by replicas has
	// also claimed it for this caller, who must Record or Release it.
	New Verdict = iota
	// Processed: the key was recorded; the delivery is a duplicate.
	Processed
	// Claimed: another replica holds a live claim on the key (its delivery
	// is under way); ask again later.
	Claimed
)

// String names the verdict for logs.
func (v Verdict) String() string {
	switch v {
	case New:
		return "new"
	case Processed:
		return "processed"
	case Claimed:
		return "claimed"
	}
	return "unknown"
}
