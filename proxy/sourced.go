package proxy

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natshdr"
	"github.com/courierhq/courier/internal/subject"
)

// sourcedMsg is a message of a partition's work stream (partition.go) as
// the rest of courier sees it: the subject, stream and sequence of the
// message it copies, so that the app, dead letters, success records and
// dedup keys see what they would without partitions. The server adds them
// to every sourced message in the Nats-Stream-Source header, "<stream>
// <seq> <filters> <destinations> <subject> [<id>]" (nats-server stream.go,
// genSourceHeader), which is then dropped. Acks go to the work stream's
// message, whose own sequence orders its key's line (streamSeq).
type sourcedMsg struct {
	jetstream.Msg
	held    *atomic.Int64 // its partition's held messages (session.held)
	subject string
	header  nats.Header
	meta    *jetstream.MsgMetadata // the origin's stream and sequence
	seq     uint64                 // the work stream's sequence
	gen     int                    // the generation of the source that copied it
	named   bool                   // its header named the origin
}

// newSourced wraps m, a message of a partition's consumer; held counts
// what the runner holds of the partition (session.held).
func newSourced(m jetstream.Msg, held *atomic.Int64) jetstream.Msg {
	meta, err := m.Metadata()
	if err != nil {
		return m // no metadata: the worker NAKs it as it is
	}
	sm := &sourcedMsg{Msg: m, held: held, seq: meta.Sequence.Stream}
	own := *meta
	sm.meta = &own
	var stream string
	var seq uint64
	sm.subject, sm.header, stream, seq = origin(m.Subject(), m.Headers())
	if stream != "" {
		own.Stream, own.Sequence.Stream, sm.named = stream, seq, true
		sm.gen = subject.Generation(natshdr.SourceDestinations(m.Headers()))
	}
	return sm
}

// copyOf is a partition's message as a rewind sees it: its sequence in the
// work stream, the generation of the work stream's source that copied it
// (the zeros its header's transform destinations write in front of the
// partition count, package partition, resource.go), when the work stream
// stored it, and the origin's stream and sequence. Zero: not a partition's
// message, or one naming no origin.
type copyOf struct {
	work   uint64
	gen    int
	stored time.Time
	stream string
	seq    uint64
}

// copyOfMsg is m's copyOf, if m is a partition's message naming its
// origin.
func copyOfMsg(m jetstream.Msg) copyOf {
	sm, ok := m.(*sourcedMsg)
	if !ok || !sm.named {
		return copyOf{}
	}
	return copyOf{work: sm.seq, gen: sm.gen, stored: sm.meta.Timestamp, stream: sm.meta.Stream, seq: sm.meta.Sequence.Stream}
}

// superseded reports whether c is an earlier copy of a message a rewind
// copies again (Rewinds.Superseded; nil: none): its worker acks it unsent
// (decider.unsent), and its key's line does not await it (orderer.enter).
func (c copyOf) superseded(rw Rewinds) bool {
	return c.stream != "" && rw != nil && rw.Superseded(c.stream, c.seq, c.work, c.gen, c.stored)
}

// origin is the subject and headers of the message that a message of a
// work stream, with subject and h, copies, and that message's stream and
// sequence (none if its header does not name them).
func origin(subject string, h nats.Header) (string, nats.Header, string, uint64) {
	if _, ok := h[natshdr.SourceHeader]; !ok {
		// No origin named: strip the partition token the transform added.
		if _, rest, ok := strings.Cut(subject, "."); ok {
			subject = rest
		}
		return subject, h, "", 0
	}
	var stream string
	var seq uint64
	if st, sq, subj, ok := natshdr.Source(h); ok {
		stream, seq, subject = st, sq, subj
	}
	out := make(nats.Header, len(h))
	for k, v := range h {
		if k != natshdr.SourceHeader {
			out[k] = v
		}
	}
	return subject, out, stream, seq
}

func (m *sourcedMsg) Subject() string      { return m.subject }
func (m *sourcedMsg) Headers() nats.Header { return m.header }

// Metadata returns the origin's stream and sequence, and the work stream's
// delivery count and time.
func (m *sourcedMsg) Metadata() (*jetstream.MsgMetadata, error) {
	c := *m.meta
	return &c, nil
}

// streamSeq is the sequence m has in the stream its consumer reads: the
// work stream's for a partition's message, whose line it orders.
func streamSeq(m jetstream.Msg, meta *jetstream.MsgMetadata) uint64 {
	if sm, ok := m.(*sourcedMsg); ok {
		return sm.seq
	}
	return meta.Sequence.Stream
}
