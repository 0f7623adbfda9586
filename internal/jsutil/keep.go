package jsutil

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Keeping is what a caller relies on a stream for, beyond what every caller
// needs of it: to keep messages across a server restart (file storage) and
// to accept new ones (not sealed). The zero value needs nothing more.
type Keeping struct {
	// What names the messages in Unsuitable's text, as in "dead letters".
	What string
	// Acked: the messages are published expecting the stream's
	// acknowledgement, which no_ack withholds. Messages the server
	// publishes itself (advisories) wait for none.
	Acked bool
	// WithoutInterest: the messages must stay while no consumer is
	// interested in them and after every consumer acked them, which
	// interest retention does not do. A caller whose own durable consumer
	// reads them needs no such thing.
	WithoutInterest bool
}

// Unsuitable returns nil when a stream with cfg keeps messages as k says,
// else an error naming the stream and every reason it would lose or refuse
// all of them, each with what to change, as in `stream "X" uses memory
// storage, which loses dead letters when the server restarts (...); it is
// sealed and accepts no new messages (...)`. What only loses or refuses some
// (limits, a short max_age) is the caller's to warn about. Callers wrap the
// error in one of their own, for errors.Is.
func Unsuitable(cfg jetstream.StreamConfig, k Keeping) error {
	var why []string
	if k.WithoutInterest && cfg.Retention == jetstream.InterestPolicy {
		why = append(why, "uses interest retention, which stores nothing while no consumer is interested and removes what all consumers acked (use a stream with limits retention)")
	}
	if cfg.Storage == jetstream.MemoryStorage {
		why = append(why, fmt.Sprintf("uses memory storage, which loses %s when the server restarts (use a stream with file storage; storage cannot be changed on an existing stream)", k.What))
	}
	if k.Acked && cfg.NoAck {
		why = append(why, "has no_ack set, so no publish to it is ever acknowledged (set no_ack to false)")
	}
	if cfg.Sealed {
		why = append(why, "is sealed and accepts no new messages (capture the subject in another stream)")
	}
	if len(why) == 0 {
		return nil
	}
	return fmt.Errorf("stream %q %s", cfg.Name, strings.Join(why, "; it "))
}
