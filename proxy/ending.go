// The ending: how a delivery ends, one type from the decision that says it
// (decide.go) to the settler that carries it out (settle.go). Its kind's
// String is the word metrics, spans and logs use for it. A new ending is a
// kind here, a case of settler.end (and the method that carries it out),
// and the place in decide.go that says it.

package proxy

import (
	"fmt"
	"time"

	"github.com/courierhq/courier/apphttp"
)

// ending is how a delivery ends, as the decision says it and the settler
// carries it out (settler.end). The zero ending is none: not ended, the
// delivery is sent (again).
type ending struct {
	kind endKind
	back giveBackMode // endGiveBack: when, and what of a last delivery
	why  string       // endGiveBack: for the log; endHeld: what holds it, for its dead letter and the log; endDuplicate: why, if not its key processed
	f    failure      // endDeadLetter
	err  error        // endRetry: the attempt's
	// endRetry: the app's Retry-After, capped, if it gave one (fromApp);
	// else the delay is the backoff schedule's.
	retryAfter time.Duration
	fromApp    bool
	answer     *apphttp.Answer // endSucceeded
	took       time.Duration   // endSucceeded
}

// endKind names the ways a delivery ends.
type endKind int

const (
	endNone       endKind = iota // not ended: sent (again)
	endHeld                      // held in progress, spending nothing, then sent again (decider.holdAgain)
	endSucceeded                 // a 2xx: acked once its success record is stored and its key recorded
	endDuplicate                 // its key processed already: acked
	endReferenced                // the original of a stored reference dead letter: NAK'd with BackoffMax (references.go)
	endRetry                     // a transient failure: NAK'd with a delay
	endDeadLetter                // dead-lettered: stored, then terminated
	endGiveBack                  // given back: NAK'd without delay, for another delivery to take it at once
	nEndKinds
)

// String is the kind's label in metrics (courier_messages_total{outcome}),
// spans (courier.outcome) and logs.
func (k endKind) String() string {
	switch k {
	case endNone:
		return "none"
	case endHeld:
		return "held"
	case endSucceeded:
		return "delivered"
	case endDuplicate:
		return "duplicate"
	case endReferenced:
		return "referenced"
	case endRetry:
		return "retried"
	case endDeadLetter:
		return "dead_lettered"
	case endGiveBack:
		return "released"
	}
	return fmt.Sprintf("endKind(%d)", int(k))
}

// counted says what the kind's label means in courier_messages_total, or
// "" for a kind not counted there: none and held do not end a delivery,
// and the original of a reference dead letter was counted when its dead
// letter was stored.
func (k endKind) counted() string {
	switch k {
	case endSucceeded:
		return "acked after a 2xx"
	case endDuplicate:
		return "acked, key already processed"
	case endRetry:
		return "NAK'd with a delay"
	case endDeadLetter:
		return "terminated after its dead letter was stored"
	case endGiveBack:
		return "NAK'd at shutdown"
	}
	return ""
}

// giveBackMode says when a delivery is given back, and whether its last
// allowed delivery is dead-lettered instead.
type giveBackMode int

const (
	// giveBackLater gives the delivery back once fetching has stopped (a
	// message NAK'd before could come straight back to the open pull and
	// spend another delivery). A NAK spends the delivery: on the message's
	// last allowed one JetStream would give up on it without the app
	// having seen it, so such a message is dead-lettered instead, saying
	// so.
	giveBackLater giveBackMode = iota
	// giveBackUnpulled is giveBackLater for a message no pull can bring
	// back (its partition no longer fetches): nothing is waited for.
	giveBackUnpulled
	// giveBackNow NAKs the message at once, whatever delivery it is on.
	giveBackNow
	// giveBackMoved is giveBackNow for a key's head admitted before the
	// durable's pin moved away (orderer.outdated): its lines then await it
	// as a retried head (orderer.gaveBack), should the pin come back.
	giveBackMoved
)

// whySuperseded is why an earlier copy of a message that a rewind copies
// again is acked as a duplicate, unsent (sourced.go, copyOf.superseded).
const whySuperseded = "an earlier copy of a message a rewind copies again: its copy delivers it, in its key's order"

func giveBackEnding(mode giveBackMode, why string) ending {
	return ending{kind: endGiveBack, back: mode, why: why}
}

func deadLetterEnding(f failure) ending { return ending{kind: endDeadLetter, f: f} }

// heldEnding holds a delivery and sends it again once it may; why says what
// holds it.
func heldEnding(why string) ending { return ending{kind: endHeld, why: why} }
