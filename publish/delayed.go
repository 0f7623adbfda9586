package publish

// Delayed publishes (docs/delayed-delivery.md): a message published with
// Courier-Delay or Courier-Deliver-At is stored now, as a schedule in the
// stream of its subject (package schedule), and JetStream delivers it to
// its subject at that time. The answer is 202 with the schedule's id and
// time once the stream acknowledged the schedule.
//
// Before the first delayed publish to a stream, and again every
// streamCheckTTL, courier checks that the stream can hold schedules
// (schedule.Check) and that none of courier's durables on it would be
// handed the schedules themselves: a durable set up before the stream
// captured them has a filter that takes them in, and would deliver each
// message when published (and, on a work-queue or interest stream, delete
// its schedule with the ack). Either is refused with 409 and what fixes it:
// a stream's configuration, which retrying cannot change.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/schedule"
)

// streamCheckTTL is how long a stream found able to hold schedules is
// taken as such; one found unable is checked again at the next publish,
// so that a stream fixed as the refusal said is used at once.
const streamCheckTTL = 10 * time.Second

// maxStreamsBySubject bounds the subjects whose stream is remembered.
const maxStreamsBySubject = 4096

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
	for name := range h {
		if strings.HasPrefix(name, "Nats-Expected-") && name != "Nats-Expected-Stream" {
			return time.Time{}, true, refuse(http.StatusBadRequest, outcomeInvalid, "%s: %s", name, schedule.ErrExpectation.Error())
		}
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
			// Stored within the duplicate window: its own time, if it waits.
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
	// Delivered since, the read finds nothing: the answer keeps this
	// request's time and no sequence.
	if info, err := schedule.Lookup(ctx, s.js, s.o.SchedulePrefix, id); err == nil {
		res.ack.Sequence, res.sched.at = info.Seq, info.DeliverAt
	}
	return res
}

// schedStreams remembers, for delayed publishes, which stream captures a
// subject and whether it can hold schedules. Safe for concurrent use.
type schedStreams struct {
	mu        sync.Mutex
	bySubject map[string]string
	byName    map[string]*schedStream
	// warned names the consumers already logged as handed schedules.
	warned map[string]bool
}

// schedStream is a stream as delayed publishes see it.
type schedStream struct {
	name    string
	maxAge  time.Duration
	err     error // why it cannot take a delayed publish now; nil: it can
	checked time.Time
}

func newSchedStreams() *schedStreams {
	return &schedStreams{bySubject: map[string]string{}, byName: map[string]*schedStream{}, warned: map[string]bool{}}
}

// forSubject returns the stream that captures subj, checked within
// streamCheckTTL. Its error is a 404 refusal when no stream captures subj,
// else a failed look-up that another attempt may fix.
func (c *schedStreams) forSubject(ctx context.Context, s *Server, subj string) (*schedStream, error) {
	c.mu.Lock()
	name := c.bySubject[subj]
	st := c.byName[name]
	c.mu.Unlock()
	if name == "" {
		var err error
		name, err = s.js.StreamNameBySubject(ctx, subj)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, refuse(http.StatusNotFound, outcomeNoStream, "no stream captures the subject")
		}
		if err != nil {
			return nil, fmt.Errorf("looking up the stream of %s: %w", subj, err)
		}
	}
	if st == nil || st.err != nil || time.Since(st.checked) > streamCheckTTL {
		var err error
		if st, err = c.check(ctx, s, name); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bySubject) >= maxStreamsBySubject {
		clear(c.bySubject)
	}
	c.bySubject[subj] = name
	c.byName[name] = st
	return st, nil
}

// forget drops what is known of stream name, so that the next delayed
// publish checks it again.
func (c *schedStreams) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.byName, name)
}

// check reads stream name and decides whether it can take delayed
// publishes (schedule.Check, then its consumers).
func (c *schedStreams) check(ctx context.Context, s *Server, name string) (*schedStream, error) {
	str, err := s.js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("reading stream %s: %w", name, err)
	}
	cfg := str.CachedInfo().Config
	st := &schedStream{name: name, maxAge: cfg.MaxAge, checked: time.Now()}
	if err := schedule.Check(cfg, s.o.SchedulePrefix, s.nc.ConnectedServerVersion()); err != nil {
		st.err = refuse(http.StatusConflict, outcomeNoSchedules, "%s", err.Error())
		return st, nil
	}
	lister := str.ListConsumers(ctx)
	holder := false
	for ci := range lister.Info() {
		if ci.Config.Durable == schedule.Holder {
			holder = true
			continue
		}
		if ci.Config.Durable == "" || !schedule.Receives(ci.Config, s.o.SchedulePrefix, name) {
			continue
		}
		ours := s.o.DurableDescription != "" && ci.Config.Description == s.o.DurableDescription
		if ours || cfg.Retention != jetstream.LimitsPolicy {
			st.err = refuse(http.StatusConflict, outcomeNoSchedules, "%s", receiverProblem(ci, cfg, s.o.SchedulePrefix, ours))
			return st, nil
		}
		c.warn(s, ci, cfg)
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("listing the consumers of stream %s: %w", name, err)
	}
	if cfg.Retention == jetstream.InterestPolicy && !holder {
		if _, err := str.CreateOrUpdateConsumer(ctx, schedule.HolderConfig(s.o.SchedulePrefix, name)); err != nil {
			st.err = refuse(http.StatusConflict, outcomeNoSchedules,
				"stream %s has interest retention, which drops a schedule no consumer takes in, and courier cannot create the consumer that keeps them (%v): create it with `%s`",
				name, err, schedule.HolderCommand(s.o.SchedulePrefix, name))
			return st, nil
		}
		s.log.Info("created the consumer that keeps delayed messages on an interest stream until their time", "stream", name, "consumer", schedule.Holder)
	}
	return st, nil
}

// receiverProblem says why consumer ci of stream cfg stops delayed
// publishes: courier's durable (ours), set up before the stream captured
// the schedules, or another whose ack would delete them.
func receiverProblem(ci *jetstream.ConsumerInfo, cfg jetstream.StreamConfig, prefix string, ours bool) string {
	mine := schedule.Subjects(prefix, cfg.Name)
	if ours {
		return fmt.Sprintf("courier's durable %q on stream %s takes in %s, where delayed messages wait (it was set up before the stream captured them), and would deliver each one when published: restart the couriers consuming %s, whose durables then leave the schedules out", ci.Config.Durable, cfg.Name, mine, cfg.Name)
	}
	return fmt.Sprintf("consumer %q of stream %s (%s retention) takes in %s, where delayed messages wait: its ack would delete a schedule before its time; give it filter subjects that leave %s out", ci.Config.Durable, cfg.Name, cfg.Retention, mine, mine)
}

// warn logs, once per consumer, a consumer of a limits stream that is
// handed the schedules themselves: its app sees each delayed message when
// published, and again when delivered.
func (c *schedStreams) warn(s *Server, ci *jetstream.ConsumerInfo, cfg jetstream.StreamConfig) {
	key := cfg.Name + "/" + ci.Config.Durable
	c.mu.Lock()
	seen := c.warned[key]
	c.warned[key] = true
	c.mu.Unlock()
	if !seen {
		s.log.Warn("a consumer of the stream is handed the schedules of delayed messages themselves: it sees each one when published, then again when delivered; give it filter subjects that leave them out",
			"stream", cfg.Name, "consumer", ci.Config.Durable, "schedules", schedule.Subjects(s.o.SchedulePrefix, cfg.Name))
	}
}

// scheduledBody is the answer to a delayed publish (202).
type scheduledBody struct {
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Schedule  string `json:"schedule"`
	DeliverAt string `json:"deliver_at"`
	Duplicate bool   `json:"duplicate"`
}

func scheduledAnswer(res result) scheduledBody {
	return scheduledBody{Stream: res.ack.Stream, Seq: res.ack.Sequence, Schedule: res.sched.id.String(),
		DeliverAt: res.sched.at.UTC().Format(time.RFC3339Nano), Duplicate: res.dup}
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
				s.log.Warn("delayed publishing off for this stream: a publish with "+schedule.HeaderDelay+" or "+schedule.HeaderDeliverAt+" is refused (409)",
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
