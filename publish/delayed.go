package publish

// Delayed publishes (docs/delayed-delivery.md): a message published with
// Courier-Delay or Courier-Deliver-At is stored now, as a schedule in the
// stream of its subject (package schedule), and JetStream delivers it to
// its subject at that time. The answer is 202 with the schedule's id and
// time once the stream acknowledged the schedule. Whether a stream can
// take them is schedstreams.go's.

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/schedule"
)

// The JetStream API errors of a schedule (nats-server server/errors.json).
const (
	errSchedulesDisabled      jetstream.ErrorCode = 10188
	errSchedulesTargetInvalid jetstream.ErrorCode = 10190
)

// scheduled is what the answer to a delayed publish names.
type scheduled struct {
	id schedule.ID
	at time.Time
}

// takeDelay reads and removes a message's Courier-Delay and
// Courier-Deliver-At headers (net/http's canonical names, as
// messageHeaders leaves them): the time to deliver at, and whether one
// was asked for. A malformed one, or one with a Nats-Expected-* header
// the server would check against the schedule, is a 400 refusal.
func takeDelay(h nats.Header, now time.Time) (time.Time, bool, error) {
	delay, at := h[schedule.HeaderDelay], h[schedule.HeaderDeliverAt]
	if len(delay) == 0 && len(at) == 0 {
		return time.Time{}, false, nil
	}
	t, _, err := schedule.When(delay, at, now)
	if err != nil {
		return time.Time{}, true, refuse(http.StatusBadRequest, outcomeInvalid, "%s", err.Error())
	}
	if err := schedule.CheckExpectations(h); err != nil {
		return time.Time{}, true, refuse(http.StatusBadRequest, outcomeInvalid, "%s", err.Error())
	}
	delete(h, schedule.HeaderDelay)
	delete(h, schedule.HeaderDeliverAt)
	return t, true, nil
}

// publishDelayed stores m as a schedule delivering it at at, retrying
// until deadline as a publish is, and returns the answer: 202 with the
// schedule, or the refusal.
func (s *Server) publishDelayed(reqCtx context.Context, deadline time.Time, m *nats.Msg, generated bool, at time.Time, maxPayload int64) result {
	ctx, cancel := context.WithDeadline(reqCtx, deadline)
	defer cancel()
	st, err := s.sched.forSubject(ctx, s, m.Subject)
	if err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			return fail(err)
		}
		return s.timedOut(reqCtx, err)
	}
	if st.err != nil {
		return fail(st.err)
	}
	if d := time.Until(at); st.maxAge > 0 && d >= st.maxAge {
		return fail(refuse(http.StatusBadRequest, outcomeInvalid,
			"the delay (%s, to %s) is beyond stream %s's max age (%s), which would remove the schedule before its time",
			d.Round(time.Second), at.Format(time.RFC3339), st.name, st.maxAge))
	}
	key := ""
	if !generated {
		key = m.Header.Get(nats.MsgIdHdr)
	}
	sm, id, err := schedule.Message(m, st.name, s.o.SchedulePrefix, at, key)
	if err != nil {
		return fail(refuse(http.StatusBadRequest, outcomeInvalid, "%s", err.Error()))
	}
	res := s.publishMsg(reqCtx, deadline, sm, generated, maxPayload)
	switch {
	case res.ack != nil:
		res.status, res.sched = http.StatusAccepted, &scheduled{id: id, at: at}
		if res.outcome == outcomeStored {
			res.outcome = outcomeScheduled
		}
		if res.ack.Duplicate {
			// Stored within the duplicate window: its own time, if it
			// waits; none if it was delivered or cancelled since (no
			// deliver_at: nothing waits, and this publish stores nothing).
			res.sched.at = time.Time{}
			if info, err := schedule.Lookup(ctx, s.js, s.o.SchedulePrefix, id); err == nil && info.Seq == res.ack.Sequence {
				res.sched.at = info.DeliverAt
			}
		}
		return res
	case res.code == errWrongLastSequence:
		// The key's schedule waits already (Message expects its subject
		// empty): this publish is that one, sent again.
		return s.waiting(ctx, id, at, generated || res.maybeStored)
	case res.code == errSchedulesDisabled || res.code == errSchedulesTargetInvalid:
		s.sched.forget(st.name)
		if st, err := s.sched.forSubject(ctx, s, m.Subject); err == nil && st.err != nil {
			return fail(st.err)
		}
		res.status, res.outcome = http.StatusConflict, outcomeNoSchedules
	}
	return res
}

// waiting is the answer to a delayed publish whose key's schedule id was
// stored before: 202, a duplicate unless it was this request's own (mine).
func (s *Server) waiting(ctx context.Context, id schedule.ID, at time.Time, mine bool) result {
	res := result{status: http.StatusAccepted, outcome: outcomeDuplicate, dup: !mine, sched: &scheduled{id: id, at: at},
		ack: &jetstream.PubAck{Stream: id.Stream}}
	if mine {
		res.outcome = outcomeScheduled
	}
	// Delivered since, the read finds nothing: the answer has no time and
	// no sequence.
	res.sched.at = time.Time{}
	if info, err := schedule.Lookup(ctx, s.js, s.o.SchedulePrefix, id); err == nil {
		res.ack.Sequence, res.sched.at = info.Seq, info.DeliverAt
	}
	return res
}

// scheduledBody is the answer to a delayed publish (202).
type scheduledBody struct {
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Schedule  string `json:"schedule"`
	DeliverAt string `json:"deliver_at,omitempty"` // none: a duplicate of one delivered or cancelled
	Duplicate bool   `json:"duplicate"`
}

func scheduledAnswer(res result) scheduledBody {
	b := scheduledBody{Stream: res.ack.Stream, Seq: res.ack.Sequence, Schedule: res.sched.id.String(), Duplicate: res.dup}
	if !res.sched.at.IsZero() {
		b.DeliverAt = res.sched.at.UTC().Format(time.RFC3339Nano)
	}
	return b
}

// LogSchedules logs, for each stream that captures Options.Subjects,
// whether delayed publishes to it are taken and where they wait, or why
// not and what fixes it. Call it once Connect was, at start-up; it stops
// early when ctx ends.
func (s *Server) LogSchedules(ctx context.Context) {
	select {
	case <-s.connected:
	default:
		return
	}
	seen := map[string]bool{}
	for _, subj := range s.o.Subjects {
		lister := s.js.StreamNames(ctx, jetstream.WithStreamListSubject(subj))
		for name := range lister.Name() {
			if seen[name] {
				continue
			}
			seen[name] = true
			st, err := s.sched.check(ctx, s, name)
			switch {
			case err != nil:
				s.log.Warn("delayed publishing: cannot read the stream", "stream", name, "error", err)
			case st.err != nil:
				// Info, not a warning: most apps publish nothing delayed.
				s.log.Info("delayed publishing off for this stream: a publish with "+schedule.HeaderDelay+" or "+schedule.HeaderDeliverAt+" is refused (409)",
					"stream", name, "reason", st.err.Error())
			default:
				s.log.Info("delayed publishing on", "stream", name, "schedules", schedule.Subjects(s.o.SchedulePrefix, name))
			}
		}
		if err := lister.Err(); err != nil && ctx.Err() == nil {
			s.log.Warn("delayed publishing: cannot list the streams", "subjects", subj, "error", err)
		}
	}
}
