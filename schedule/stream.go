package schedule

// Whether a stream can hold courier's schedules, the one command that makes
// it, and the filter subjects that leave the schedules out of a durable.
//
// JetStream's rules (nats-server 2.15 server/stream.go, the Nats-Schedule
// checks of processJetStreamMsg, and checkStreamCfg): a schedule is held
// by a stream with allow_msg_schedules (which cannot be turned off again,
// and is refused with discard new, on a counter stream, a mirror or a
// stream with sources); its subject must be one the stream captures, and
// its target a subject of the same stream.

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/subject"
)

// NotReady is a stream that cannot hold courier's schedules: why, and the
// command that fixes it when one can ("" otherwise).
type NotReady struct {
	Stream string
	Why    string
	Fix    string
}

func (e *NotReady) Error() string {
	msg := fmt.Sprintf("stream %s cannot hold delayed messages: %s", e.Stream, e.Why)
	if e.Fix != "" {
		msg += "; fix it with `" + e.Fix + "`, then restart the couriers consuming " + e.Stream + " (their durables then leave the schedules out)"
	}
	return msg
}

// ServerSupports reports whether a nats-server of version (as the server
// says it, 2.12.0 or v2.12.0-beta) holds message schedules: 2.12 or later.
func ServerSupports(version string) bool {
	v := strings.TrimPrefix(version, "v")
	majorS, rest, _ := strings.Cut(v, ".")
	minorS, _, _ := strings.Cut(rest, ".")
	major, err1 := strconv.Atoi(majorS)
	minor, err2 := strconv.Atoi(strings.SplitN(minorS, "-", 2)[0])
	if err1 != nil || err2 != nil {
		return false
	}
	return major > 2 || major == 2 && minor >= 12
}

// Check says whether stream cfg can hold courier's schedules under prefix,
// on a server of serverVersion: nil, or a *NotReady.
func Check(cfg jetstream.StreamConfig, prefix, serverVersion string) error {
	notReady := func(why, fix string) error { return &NotReady{Stream: cfg.Name, Why: why, Fix: fix} }
	if !ServerSupports(serverVersion) {
		return notReady(fmt.Sprintf("the NATS server is %s, and message schedules need nats-server 2.12 or later: upgrade it", serverVersion), "")
	}
	switch {
	case cfg.Mirror != nil:
		return notReady("it is a mirror, which JetStream does not let hold schedules; publish to the stream it mirrors", "")
	case len(cfg.Sources) > 0:
		return notReady("it has sources, and JetStream does not let such a stream hold schedules; publish to a stream without sources", "")
	case cfg.AllowMsgCounter:
		return notReady("it is a counter stream, which JetStream does not let hold schedules", "")
	}
	mine := Subjects(prefix, cfg.Name)
	for _, s := range cfg.Subjects {
		if subject.Overlap(s, mine) && !subject.Within(s, prefix+".>") {
			return notReady(fmt.Sprintf("its subject %q takes in the schedules' subjects %s and others, so courier's durables could not leave the schedules out (JetStream has no filter that excludes); give it %s as a subject of its own and narrow %q", s, mine, mine, s), "")
		}
	}
	captured := slices.ContainsFunc(cfg.Subjects, func(s string) bool { return subject.Within(mine, s) })
	if cfg.AllowMsgSchedules && captured {
		return nil
	}
	var why []string
	if !cfg.AllowMsgSchedules {
		why = append(why, "allow_msg_schedules is off")
	}
	if !captured {
		why = append(why, fmt.Sprintf("it does not capture %s, where courier keeps its schedules (COURIER_SCHEDULE_PREFIX=%s)", mine, prefix))
	}
	return notReady(strings.Join(why, ", and "), FixCommand(cfg, prefix))
}

// FixCommand is the nats CLI command that lets stream cfg hold courier's
// schedules under prefix: --allow-schedules (with --discard=old, which
// schedules need, if the stream discards new), and the schedules' subjects
// added to the stream's (--subjects replaces the list, so it names them
// all).
func FixCommand(cfg jetstream.StreamConfig, prefix string) string {
	mine := Subjects(prefix, cfg.Name)
	cmd := "nats stream edit " + cfg.Name
	if !cfg.AllowMsgSchedules {
		cmd += " --allow-schedules"
		if cfg.Discard == jetstream.DiscardNew {
			cmd += " --discard=old"
		}
	}
	if !slices.ContainsFunc(cfg.Subjects, func(s string) bool { return subject.Within(mine, s) }) {
		subjects := append(slices.Clone(cfg.Subjects), mine)
		cmd += " --subjects='" + strings.Join(subjects, ",") + "'"
	}
	return cmd
}

// Leave returns the filter subjects of a durable on stream cfg that take
// what filters take (none: the whole stream) but the schedules under
// prefix (<prefix>.<stream>.>, and any other subject under <prefix>.,
// which courier owns). JetStream has no filter that excludes, so a filter
// that takes in the schedules and more is replaced by its meets with the
// stream's subjects, those under prefix dropped. changed is false when no
// filter takes in a schedule: filters are returned as they are (none stays
// none, the whole stream, whatever it captures later). When the schedules
// cannot be left out (a stream subject such as ">" takes them in with
// others) and the stream allows schedules, filters are returned as they
// are with an error wrapping ErrCannotLeave, for the caller to warn of
// (Check refuses delayed publishes to such a stream, so courier stores no
// schedule there); with allow_msg_schedules off no schedule can be stored
// and filters stand. Any other error says that every filter is under the
// prefix.
func Leave(cfg jetstream.StreamConfig, filters []string, prefix string) (out []string, changed bool, err error) {
	mine := Subjects(prefix, cfg.Name)
	courier := prefix + ".>"
	given := filters
	if len(given) == 0 {
		given = cfg.Subjects
	}
	if !slices.ContainsFunc(given, func(f string) bool { return subject.Overlap(f, mine) }) {
		return filters, false, nil
	}
	for _, f := range given {
		if !subject.Overlap(f, mine) {
			out = append(out, f)
			continue
		}
		for _, s := range cfg.Subjects {
			m, ok := subject.Meet(f, s)
			switch {
			case !ok:
				continue
			case !subject.Overlap(m, mine):
				out = append(out, m)
			case subject.Within(m, courier):
				// the schedules, or other subjects under courier's prefix
			case cfg.AllowMsgSchedules:
				return filters, false, fmt.Errorf("the filter %q takes in stream %s's subject %q, which takes in %s, where delayed messages wait, and more (JetStream has no filter that excludes), so the durable would be handed any schedule stored there; courier stores none there, but give the stream %s as a subject of its own and narrow %q, or set COURIER_SUBJECTS to leave it out: %w", f, cfg.Name, s, mine, mine, s, ErrCannotLeave)
			default:
				return filters, false, nil // no schedule can be stored
			}
		}
	}
	if len(out) == 0 {
		return nil, false, fmt.Errorf("every filter of the durable on stream %s is under %s, where courier keeps the schedules of delayed messages: set COURIER_SUBJECTS to the subjects the app consumes", cfg.Name, courier)
	}
	return slices.Compact(out), true, nil
}

// ErrCannotLeave is Leave's error for filters that cannot leave the
// schedules out.
var ErrCannotLeave = errors.New("the schedules cannot be left out of the durable")

// Receives reports whether a consumer of stream with configuration cc is
// handed schedules under prefix, the stream capturing them: its filter
// subjects (none: the whole stream) take in some of <prefix>.<stream>.>.
func Receives(cc jetstream.ConsumerConfig, prefix, stream string) bool {
	mine := Subjects(prefix, stream)
	filters := cc.FilterSubjects
	if cc.FilterSubject != "" {
		filters = append(filters, cc.FilterSubject)
	}
	if len(filters) == 0 {
		return true
	}
	return slices.ContainsFunc(filters, func(f string) bool { return subject.Overlap(f, mine) })
}

// Holder is the durable consumer that keeps the schedules of an interest
// stream: such a stream drops at once a message no consumer's filter takes
// in, and courier's durables leave the schedules out. It takes in the
// schedules alone and is never pulled, so each waits until the server
// delivers (and purges) it, or a cancel does.
const Holder = "courier-schedules"

// HolderConfig is the Holder of stream under prefix.
func HolderConfig(prefix, stream string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       Holder,
		Description:   "courier: keeps the delayed messages of an interest stream until their time (never pulled; COURIER_SCHEDULE_PREFIX)",
		FilterSubject: Subjects(prefix, stream),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// HolderCommand is the nats CLI command that creates the Holder of stream
// under prefix, for when courier may not.
func HolderCommand(prefix, stream string) string {
	return fmt.Sprintf("nats consumer add %s %s --pull --filter='%s' --ack=explicit --deliver=all --defaults", stream, Holder, Subjects(prefix, stream))
}
