package subject

import "strings"

// Reserved returns the start of s that NATS keeps for itself, or "" when s
// is an ordinary subject: a first token beginning with '$' (by NATS's
// convention the system's: $JS, JetStream's API and advisories; $KV and $O,
// the key-value and object stores; $SYS, the system account; $SRV,
// services) or _INBOX (replies to requests). What is published there is an
// API call, a store's write or a reply, not a message for a stream. The
// start is returned with its '.' ("$JS."), or as the whole subject when it
// is one token.
func Reserved(s string) string {
	first, _, more := strings.Cut(s, ".")
	if !strings.HasPrefix(first, "$") && first != "_INBOX" {
		return ""
	}
	if more {
		return first + "."
	}
	return first
}
