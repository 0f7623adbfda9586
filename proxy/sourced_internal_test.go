package proxy

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/internal/natshdr"
	"github.com/courierhq/courier/rewind"
)

// headedMsg is a fakeMsg with headers.
type headedMsg struct {
	*fakeMsg
	h nats.Header
}

func (m headedMsg) Headers() nats.Header { return m.h }

// recordRewinds is the one rewind r.
type recordRewinds struct{ r rewind.Record }

func (rw recordRewinds) Replay(stream string, seq uint64) string {
	if rw.r.Covers(stream, seq) {
		return rw.r.ID
	}
	return ""
}

func (rw recordRewinds) Superseded(stream string, seq, work uint64, gen int, stored time.Time) bool {
	return rw.r.Supersedes(stream, seq, work, gen, stored)
}

// A partition's message is known to a rewind by the generation of the
// source that copied it, read from its Nats-Stream-Source header: a copy by
// an earlier generation than the rewind's is superseded, one by the
// rewind's own is not, whatever the record says of the work stream's
// sequences; the header is dropped for the app.
func TestSourcedCopyGeneration(t *testing.T) {
	rw := recordRewinds{rewind.Record{ID: "r1", Stream: "ORDERS", From: 10, To: 20,
		Copied: 40, CopiedAt: time.Now().Add(time.Hour), Generation: 1}}
	for _, tc := range []struct {
		name, dest string
		gen        int
		want       bool
	}{
		{"by the first source", "{{partition(4,1)}}.orders.{{wildcard(1)}}.>", 0, true},
		{"by the rewind's source", "{{partition(04,1)}}.orders.{{wildcard(1)}}.>", 1, false},
	} {
		h := nats.Header{natshdr.SourceHeader: {"ORDERS 12 orders.*.> " + tc.dest + " orders.k.e"}, "Order": {"k"}}
		m := newSourced(headedMsg{&fakeMsg{seq: 35, subject: "0.orders.k.e"}, h}, nil)
		c := copyOfMsg(m)
		if c.gen != tc.gen || c.work != 35 || c.seq != 12 || c.stream != "ORDERS" {
			t.Errorf("%s: copy %+v, want generation %d of ORDERS 12 at 35", tc.name, c, tc.gen)
		}
		if got := c.superseded(rw); got != tc.want {
			t.Errorf("%s: superseded = %v, want %v", tc.name, got, tc.want)
		}
		if _, ok := m.Headers()[natshdr.SourceHeader]; ok || m.Subject() != "orders.k.e" {
			t.Errorf("%s: the app would see %s with %v", tc.name, m.Subject(), m.Headers())
		}
	}
}
