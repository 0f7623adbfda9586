package publish

// The streams delayed publishes go to, as the publish API knows them.
// Before the first delayed publish to a stream, and again every
// streamCheckTTL, courier checks that the stream can hold schedules
// (schedule.Check) and that none of courier's durables on it would be
// handed the schedules themselves: a durable set up before the stream
// captured them has a filter that takes them in, and would deliver each
// message when published (and, on a work-queue or interest stream, delete
// its schedule with the ack). Either is refused with 409 and what fixes it:
// a stream's configuration, which retrying cannot change. On an interest
// stream it makes sure the consumer that keeps the schedules is there
// (schedule.Holder).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/schedule"
)

// streamCheckTTL is how long a stream found able to hold schedules is
// taken as such; one found unable is checked again at the next publish,
// so that a stream fixed as the refusal said is used at once.
const streamCheckTTL = 10 * time.Second

// maxStreamsBySubject bounds the subjects whose stream is remembered.
const maxStreamsBySubject = 4096

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
// streamCheckTTL (the subject looked up again with it: a stream may have
// been replaced). Its error is a 404 refusal when no stream captures subj,
// else a failed look-up that another attempt may fix.
func (c *schedStreams) forSubject(ctx context.Context, s *Server, subj string) (*schedStream, error) {
	c.mu.Lock()
	st := c.byName[c.bySubject[subj]]
	c.mu.Unlock()
	if st != nil && st.err == nil && time.Since(st.checked) <= streamCheckTTL {
		return st, nil
	}
	name, err := s.js.StreamNameBySubject(ctx, subj)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, refuse(http.StatusNotFound, outcomeNoStream, "no stream captures the subject")
	}
	if err != nil {
		return nil, fmt.Errorf("looking up the stream of %s: %w", subj, err)
	}
	if st, err = c.check(ctx, s, name); err != nil {
		return nil, err
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
