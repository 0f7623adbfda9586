package proxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Each kind of ending has a label of its own, and the labels users see in
// courier_messages_total, spans (courier.outcome) and logs stay as they
// were.
func TestEndKindLabels(t *testing.T) {
	want := map[endKind]string{
		endNone: "none", endHeld: "held", endSucceeded: "delivered", endDuplicate: "duplicate",
		endReferenced: "referenced", endRetry: "retried", endDeadLetter: "dead_lettered", endGiveBack: "released",
	}
	seen := map[string]endKind{}
	for k := range nEndKinds {
		got := k.String()
		if w, ok := want[k]; !ok {
			t.Errorf("kind %d (%q) is not in this test: add its label", int(k), got)
		} else if got != w {
			t.Errorf("kind %d labelled %q, want %q", int(k), got, w)
		}
		if prev, dup := seen[got]; dup {
			t.Errorf("kinds %d and %d share the label %q", int(prev), int(k), got)
		}
		seen[got] = k
	}
}

// courier_messages_total has a series for each kind counted, at 0 from the
// start, and its help names them as before.
func TestMessagesCountsEachEnding(t *testing.T) {
	reg := prometheus.NewRegistry()
	newMetrics(reg, nil)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	const help = "Messages by how their delivery ended: delivered (acked after a 2xx), duplicate (acked, key already processed), retried (NAK'd with a delay), dead_lettered (terminated after its dead letter was stored), released (NAK'd at shutdown)."
	for _, f := range fams {
		if f.GetName() != "courier_messages_total" {
			continue
		}
		if f.GetHelp() != help {
			t.Errorf("help %q, want %q", f.GetHelp(), help)
		}
		var got []string
		for _, m := range f.GetMetric() {
			got = append(got, m.GetLabel()[0].GetValue())
		}
		if want := "dead_lettered delivered duplicate released retried"; strings.Join(got, " ") != want {
			t.Errorf("series %v, want %s", got, want)
		}
		return
	}
	t.Fatal("no courier_messages_total")
}

// The settler, asked to end a delivery as something that does not end it,
// or as a kind it does not know, panics naming it: a kind forgotten there
// does not leave a message unsettled, silently.
func TestSettlerEndFailsLoudly(t *testing.T) {
	for _, k := range []endKind{endNone, endHeld, nEndKinds} {
		t.Run(k.String(), func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), k.String()) {
					t.Errorf("end as %s: recovered %v, want a panic naming it", k, r)
				}
			}()
			(&settler{}).end(&delivery{}, ending{kind: k})
		})
	}
}
