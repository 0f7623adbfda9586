package main

import (
	"fmt"
	"io"
)

// The order variants of the drain scenario: order per key
// (COURIER_ORDER_KEY) against the same courier unordered, on orderKeys
// keys (message i on bench.<run>.<i % orderKeys>), and, on one key, against
// the usual way to keep order without courier: a consumer with
// MaxAckPending 1, here the forwarder's, which then forwards one message
// at a time. All at focusInflight, to the same instant app.
const orderKeys = 1000

// orderVariants are the drain variants of order per key.
var orderVariants = []variant{orderUnordered, orderKeyed, orderOneKey, orderForwarder}

// keys is how many ordering keys v's messages carry in their subjects; 0:
// none, every message on one subject.
func (v variant) keys() int {
	switch v {
	case orderUnordered, orderKeyed:
		return orderKeys
	case orderOneKey, orderForwarder:
		return 1
	}
	return 0
}

// orderEnv is what v sets beyond the rest of its variant: the ordering
// key, the subject's third token (bench.<run>.<key>), or the forwarder's
// MaxAckPending of 1.
func (v variant) orderEnv() []string {
	switch v {
	case orderKeyed, orderOneKey:
		return []string{"COURIER_ORDER_KEY=subject:3"}
	case orderForwarder:
		return []string{"COURIER_MAX_ACK_PENDING=1"}
	}
	return nil
}

// printOrder writes the targets of order per key, as per-round ratios.
func (rep *report) printOrder(w io.Writer, rows []drainRow) {
	on, okOn := find(rows, orderKeyed, focusInflight)
	off, okOff := find(rows, orderUnordered, focusInflight)
	if okOn && okOff {
		fmt.Fprintf(w, "order per key, %d keys at %d in flight: ordered / unordered courier msgs/s %s× (target >= 0.8), CPU per message %s×\n",
			orderKeys, focusInflight, spread(ratios(on, off, drainResult.rate), "%.2f"), spread(ratios(on, off, cpuPerMsg), "%.2f"))
	}
	one, okOne := find(rows, orderOneKey, focusInflight)
	fw, okFw := find(rows, orderForwarder, focusInflight)
	if okOne && okFw {
		fmt.Fprintf(w, "order per key, one key: ordered courier / the forwarder with MaxAckPending 1 msgs/s %s× (target >= 1.0), CPU per message %s×\n",
			spread(ratios(one, fw, drainResult.rate), "%.2f"), spread(ratios(one, fw, cpuPerMsg), "%.2f"))
	}
}
