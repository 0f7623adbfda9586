// The causes that hold deliveries (gate.go), and what each means in
// metrics, /readyz and the logs.

package proxy

// cause is one reason courier holds deliveries: while any cause is held it
// fetches nothing, starts no request, and keeps what it has in progress.
type cause int

const (
	// causeApp: the app cannot be reached (no connection could be made),
	// or its health URL fails.
	causeApp cause = iota
	// causeStore: the dedup store cannot answer a check.
	causeStore
	// causeBreaker: the app fails transiently again and again (breaker.go).
	causeBreaker
	// causePaused: the consumer is paused on the server (courier pause).
	causePaused
	nCauses
)

// Label names the cause in metrics (courier_delivery_held{cause}).
func (c cause) Label() string {
	switch c {
	case causeApp:
		return "app_unavailable"
	case causeStore:
		return "store_unavailable"
	case causeBreaker:
		return "breaker_open"
	case causePaused:
		return "paused"
	}
	return "unknown"
}

// readyLine, stopLine and resumeLine say what the cause means in /readyz
// and in the logs.
func (c cause) readyLine() string {
	return [...]string{"app unavailable", "dedup store unavailable", "breaker open", "consumer paused"}[c]
}

func (c cause) stopLine() string {
	return [...]string{
		"app unavailable: holding messages and pausing fetching until it answers",
		"dedup store unavailable: holding messages and pausing fetching until it answers",
		"breaker open: the app fails again and again; holding messages and probing with one at a time",
		"consumer paused: holding messages, fetching nothing",
	}[c]
}

func (c cause) resumeLine() string {
	return [...]string{"app available again", "dedup store available again", "breaker closed: a probe succeeded; sending again", "consumer resumed"}[c]
}
