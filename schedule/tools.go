package schedule

// The schedules waiting in a stream: one read back, cancelled, or all of
// them listed. The publish API's DELETE /v1/schedules/<id> and `courier
// schedules` call these.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/internal/subject"
)

// ErrNotFound is the error for a schedule that is not waiting: delivered
// already, cancelled, or never stored.
var ErrNotFound = errors.New("no such schedule waiting: delivered already, cancelled, or unknown")

// ErrDue is Cancel's error for a schedule whose time is near (CancelMargin)
// or past: the server may be delivering it at this moment, so a cancel
// could not be sure to stop it, and it is left to be delivered.
var ErrDue = errors.New("its time has come: it is being delivered, too late to cancel")

// CancelMargin is how long before its time a schedule can still be
// cancelled for sure: the server fires it by its own clock, which may be
// ahead of courier's.
const CancelMargin = time.Second

// Lookup reads the schedule id waiting in its stream under prefix; the
// error wraps ErrNotFound when none waits.
func Lookup(ctx context.Context, js jetstream.JetStream, prefix string, id ID) (Info, error) {
	s, err := js.Stream(ctx, id.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return Info{}, fmt.Errorf("%s: stream %s not found: %w", id, id.Stream, ErrNotFound)
	}
	if err != nil {
		return Info{}, err
	}
	subj := id.Subject(prefix)
	m, err := s.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Info{}, fmt.Errorf("%s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Info{}, err
	}
	info, ok := infoOf(prefix, m.Subject, m.Header, m.Sequence, m.Time)
	if !ok {
		return Info{}, fmt.Errorf("%s: the message on %s is not a schedule: %w", id, subj, ErrNotFound)
	}
	return info, nil
}

// Cancel removes the schedule id waiting under prefix, so that it is never
// delivered, and returns what it was. Its error wraps ErrNotFound when none
// waits, and ErrDue when its time is within CancelMargin of now or past
// (it is left to be delivered). The schedule is purged by its sequence:
// were one stored again on its subject meanwhile, it would stay.
func Cancel(ctx context.Context, js jetstream.JetStream, prefix string, id ID, now time.Time) (Info, error) {
	info, err := Lookup(ctx, js, prefix, id)
	if err != nil {
		return Info{}, err
	}
	if info.DeliverAt.Before(now.Add(CancelMargin)) {
		return info, fmt.Errorf("%s (due at %s): %w", id, info.DeliverAt.Format(time.RFC3339Nano), ErrDue)
	}
	n, err := purge(ctx, js, id.Stream, id.Subject(prefix), info.Seq+1)
	if err != nil {
		return Info{}, err
	}
	if n == 0 { // delivered since it was read
		return Info{}, fmt.Errorf("%s: %w", id, ErrNotFound)
	}
	return info, nil
}

// purge removes the messages of stream on subj below sequence before, and
// returns how many it removed (nats.go's Purge does not say).
func purge(ctx context.Context, js jetstream.JetStream, stream, subj string, before uint64) (uint64, error) {
	req, err := json.Marshal(jetstream.StreamPurgeRequest{Subject: subj, Sequence: before})
	if err != nil {
		return 0, err
	}
	msg, err := js.Conn().RequestWithContext(ctx, jsutil.APIPrefix(js)+"STREAM.PURGE."+stream, req)
	if err != nil {
		return 0, err
	}
	var resp struct {
		Error  *jetstream.APIError `json:"error"`
		Purged uint64              `json:"purged"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("purging %s: %w", subj, err)
	}
	if resp.Error != nil {
		return 0, resp.Error
	}
	return resp.Purged, nil
}

// List returns the schedules waiting in stream under prefix, soonest
// first. It reads their headers alone, with an ordered consumer.
func List(ctx context.Context, js jetstream.JetStream, prefix, stream string) ([]Info, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	all := Subjects(prefix, stream)
	si, err := s.Info(ctx, jetstream.WithSubjectFilter(all))
	if err != nil {
		return nil, err
	}
	var out []Info
	left := 0 // each subject holds one schedule (a rollup)
	for _, n := range si.State.Subjects {
		left += int(n)
	}
	if left == 0 {
		return out, nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{all}, HeadersOnly: true})
	if err != nil {
		return nil, err
	}
	for left > 0 {
		batch, err := cons.Fetch(min(left, 256), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		var pending uint64
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			pending = md.NumPending
			if info, ok := infoOf(prefix, m.Subject(), m.Headers(), md.Sequence.Stream, md.Timestamp); ok {
				out = append(out, info)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		// Those delivered or cancelled meanwhile are not waited for.
		if n == 0 || pending == 0 {
			break
		}
		left -= n
	}
	slices.SortFunc(out, func(a, b Info) int { return a.DeliverAt.Compare(b.DeliverAt) })
	return out, nil
}

// Streams returns the names of the streams that hold courier's schedules
// under prefix: those whose subjects take in <prefix>.<name>.>.
func Streams(ctx context.Context, js jetstream.JetStream, prefix string) ([]string, error) {
	var names []string
	l := js.ListStreams(ctx)
	for si := range l.Info() {
		mine := Subjects(prefix, si.Config.Name)
		if slices.ContainsFunc(si.Config.Subjects, func(s string) bool { return subject.Within(mine, s) }) {
			names = append(names, si.Config.Name)
		}
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}
