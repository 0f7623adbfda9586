package main

import (
	"strconv"
	"strings"
	"testing"
)

// `courier dlq show` and `ls` print what a publisher (or whoever planted a
// dead letter) wrote as one printable line each: no escape sequence
// reaches the operator's terminal, and no line of the output is forged.
func TestDLQShowCleansWhatWritersChose(t *testing.T) {
	h := newHarness(t)
	seq := h.plant(map[string]string{
		"Courier-Subject":              "orders.created",
		"X-Evil":                       "\x1b]0;owned\x07\x1b[31mred",
		"X-Bidi":                       "abc\u202edcba",
		"Courier-Original-Nats-Msg-Id": "id\x1b[1A",
		"Courier-Reason":               "rejected\x1b[0m",
	}, "body")
	for _, args := range [][]string{{"show", strconv.FormatUint(seq, 10)}, {"ls"}, {"replay", "--dry-run"}} {
		res := h.dlq(args...)
		out := res.stdout + res.stderr
		if strings.ContainsAny(out, "\x1b\x07\u202e") {
			t.Errorf("%v printed a control or bidi character:\n%q", args, out)
		}
	}
	res := h.dlq("show", strconv.FormatUint(seq, 10))
	res.want(t, 0, "X-Evil: ]0;owned  [31mred", "X-Bidi: abc dcba", "Nats-Msg-Id: id [1A")
}
