package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/editdist"
	"github.com/courierhq/courier/internal/retry"
	"github.com/courierhq/courier/internal/subject"
	"github.com/courierhq/courier/schedule"
	"github.com/courierhq/courier/success"
)

// setupAttemptTimeout bounds one attempt of a start-up step against
// JetStream; a step that times out is retried.
const setupAttemptTimeout = 10 * time.Second

// retrySetup runs the start-up step f until it succeeds, fails for good, or
// ctx ends (then it returns ctx's error). Errors that time can fix (NATS
// unreachable, timeouts) are retried with backoff; any other is final.
func retrySetup(ctx context.Context, log *slog.Logger, step string, f func(context.Context) error) error {
	return retry.Do(ctx, retry.Policy{}, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, setupAttemptTimeout)
		defer cancel()
		err := f(actx)
		if err != nil && !transientSetupError(err) {
			return retry.Permanent(err)
		}
		return err
	}, func(err error, wait time.Duration) {
		log.Warn("JetStream not answering; retrying start-up", "step", step, "error", err, "in", wait.Round(time.Millisecond).String())
	})
}

func transientSetupError(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrConnectionClosed) ||
		// A cluster without a meta leader (quorum lost, nodes restarting)
		// answers "JetStream system temporarily unavailable": time fixes it.
		errors.As(err, &apiErr) && (apiErr.ErrorCode == errCodeClusterNotAvailable ||
			// Too few peers for the replicas asked, because one is offline
			// (restarting, or not yet heard from): it comes back. Too few
			// in the cluster at all ("no suitable peers for placement"
			// alone, or for want of resources) is final.
			apiErr.ErrorCode == errCodeNoPeers && strings.Contains(apiErr.Description, "peer offline"))
}

// errCodeClusterNotAvailable is the server's JSClusterNotAvailErr;
// errCodeNoPeers its JSClusterNoPeersErrF ("no suitable peers for
// placement", followed by the reasons: nats-server's
// server/jetstream_cluster.go, selectPeerError).
const (
	errCodeClusterNotAvailable jetstream.ErrorCode = 10008
	errCodeNoPeers             jetstream.ErrorCode = 10005
)

// setUp checks the stream, makes sure dead letters are kept, and creates or
// updates the durable consumer. policyGiven says whether
// COURIER_DELIVER_POLICY was set (keepDeliverPolicy).
func setUp(ctx context.Context, js jetstream.JetStream, cfg config.Config, policyGiven bool, log *slog.Logger) (jetstream.Stream, jetstream.Consumer, error) {
	if err := checkJetStream(ctx, js); err != nil {
		return nil, nil, err
	}
	stream, err := js.Stream(ctx, cfg.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, nil, streamNotFound(ctx, js, cfg.Stream)
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		return nil, nil, fmt.Errorf("JetStream is not enabled on the NATS server (or for this account): enable it, courier needs it")
	case err != nil:
		return nil, nil, fmt.Errorf("looking up stream %q: %w", cfg.Stream, err)
	}
	if err := checkReplySubjects(cfg, stream); err != nil {
		return nil, nil, err
	}
	if err := ensureDLQ(ctx, js, cfg, stream, log); err != nil {
		return nil, nil, err
	}
	if err := ensureSuccess(ctx, js, cfg, stream, log); err != nil {
		return nil, nil, err
	}
	if partitioned(cfg) {
		return stream, nil, nil // the partitions' consumers instead (ensurePartitions)
	}
	want := consumerConfig(cfg)
	filters, err := durableFilters(cfg, stream, log)
	if err != nil {
		return nil, nil, err
	}
	setFilters(&want, filters)
	if existing, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer); err == nil {
		have := existing.CachedInfo().Config
		if err := keepDeliverPolicy(&want, have, policyGiven, cfg.Stream); err != nil {
			return nil, nil, err
		}
		keepOperatorSettings(&want, have)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, want)
	if err != nil {
		if transientSetupError(err) {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("cannot create or update durable consumer %q on stream %q: %w (settings such as COURIER_DELIVER_POLICY are fixed when a durable is created: to change them, delete the consumer or choose a new COURIER_CONSUMER)", cfg.Consumer, cfg.Stream, err)
	}
	return stream, cons, nil
}

// streamNotFound is the error for a stream to consume that does not exist:
// what to do, and the streams there are, closest to its name first, with
// the one most likely meant (ORDER beside ORDERS).
func streamNotFound(ctx context.Context, js jetstream.JetStream, stream string) error {
	there := ""
	if names, err := streamNames(ctx, js); err == nil && len(names) == 0 {
		there = " (there is no stream on this server for this account)"
	} else if len(names) > 0 {
		byFold := make(map[string]string, len(names))
		folded := make([]string, 0, len(names))
		for _, n := range names {
			byFold[strings.ToLower(n)] = n
			folded = append(folded, strings.ToLower(n))
		}
		if near := editdist.Closest(strings.ToLower(stream), folded); near != "" {
			there = fmt.Sprintf(" (did you mean %q? the streams there are: %s)", byFold[near], strings.Join(closest(stream, names, 8), ", "))
		} else {
			there = fmt.Sprintf(" (the streams there are: %s)", strings.Join(closest(stream, names, 8), ", "))
		}
	}
	return fmt.Errorf("stream %q not found%s: courier does not create the stream it consumes; create it (e.g. `nats stream add %s`) or fix COURIER_STREAM", stream, there, stream)
}

// streamNames lists the streams of the account but those courier and
// key-value and object stores make.
func streamNames(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	var names []string
	lister := js.StreamNames(ctx)
	for name := range lister.Name() {
		if !strings.HasPrefix(name, "KV_") && !strings.HasPrefix(name, "OBJ_") && !strings.HasPrefix(name, "COURIER_") {
			names = append(names, name)
		}
	}
	return names, lister.Err()
}

// checkJetStream asks plainly whether JetStream is there: a server without
// it answers API requests with "no responders", which elsewhere means "not
// ready yet".
func checkJetStream(ctx context.Context, js jetstream.JetStream) error {
	_, err := js.AccountInfo(ctx)
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		return errors.New("JetStream is not enabled on the NATS server: enable it (`jetstream: enabled` in the server configuration, or `nats-server -js`); courier needs it")
	case errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return errors.New("JetStream is not enabled for this NATS account: give the account JetStream limits; courier needs it")
	}
	return err
}

// consumerDescription marks the durable consumers courier creates; `courier
// cleanup` removes only a consumer that carries it (or with --force).
const consumerDescription = "courier sidecar"

// consumerConfig is the sidecar's durable consumer.
func consumerConfig(cfg config.Config) jetstream.ConsumerConfig {
	cc := jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		Description:   consumerDescription,
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxDeliver:    cfg.MaxDeliver,
		AckWait:       cfg.AckWait,
		MaxAckPending: cfg.MaxAckPending,
		// No BackOff (it would add to every NAK delay) and no
		// InactiveThreshold (the server would delete the durable while
		// courier is down).
	}
	if cfg.DeliverPolicy == "new" {
		cc.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	if cfg.OrderKey != "" {
		// One replica at a time receives the durable's messages, so that a
		// key is handled by one courier: the pin moves to another replica
		// once the pinned one has not pulled for PinnedTTL (it died).
		cc.PriorityPolicy = jetstream.PriorityPolicyPinned
		cc.PriorityGroups = []string{orderGroup}
		cc.PinnedTTL = orderPinnedTTL(cfg)
	}
	setFilters(&cc, cfg.Subjects)
	return cc
}

// setFilters sets a consumer's filter subjects: none (the whole stream),
// one (FilterSubject) or several (FilterSubjects).
func setFilters(cc *jetstream.ConsumerConfig, filters []string) {
	cc.FilterSubject, cc.FilterSubjects = "", nil
	switch len(filters) {
	case 0:
	case 1:
		cc.FilterSubject = filters[0]
	default:
		cc.FilterSubjects = filters
	}
}

// durableFilters is what the durable consumes of stream: COURIER_SUBJECTS
// (none: the whole stream) but the schedules of delayed messages, which
// the stream holds on COURIER_SCHEDULE_PREFIX (schedule.Leave). A durable
// handed a schedule would deliver the message when it is published, and on
// a work-queue or interest stream its ack would delete the schedule.
func durableFilters(cfg config.Config, stream jetstream.Stream, log *slog.Logger) ([]string, error) {
	sc := stream.CachedInfo().Config
	filters, changed, err := schedule.Leave(sc, cfg.Subjects, cfg.SchedulePrefix)
	switch {
	case errors.Is(err, schedule.ErrCannotLeave):
		log.Warn("the durable cannot leave out the schedules of delayed messages", "stream", cfg.Stream, "consumer", cfg.Consumer, "why", err.Error())
	case err != nil:
		return nil, fmt.Errorf("durable consumer %q on stream %q: %w", cfg.Consumer, cfg.Stream, err)
	}
	if changed {
		log.Info("the durable leaves out the schedules of delayed messages", "stream", cfg.Stream, "consumer", cfg.Consumer,
			"schedules", schedule.Subjects(cfg.SchedulePrefix, cfg.Stream), "filters", strings.Join(filters, ","))
	}
	return filters, nil
}

// keepDeliverPolicy keeps the deliver policy of an existing durable, which
// JetStream cannot change: where it starts was decided when it was created.
// Without COURIER_DELIVER_POLICY (policyGiven false) courier takes the
// durable's own, whatever created it; with it set to another policy, it
// says so, naming both. That is no invalid configuration (exit 2): the
// setting is valid, and the server's durable is what it conflicts with, as
// a missing stream does (exit 1), which is what the error becomes.
func keepDeliverPolicy(want *jetstream.ConsumerConfig, have jetstream.ConsumerConfig, policyGiven bool, stream string) error {
	if have.DeliverPolicy == want.DeliverPolicy {
		return nil
	}
	if !policyGiven {
		want.DeliverPolicy, want.OptStartSeq, want.OptStartTime = have.DeliverPolicy, have.OptStartSeq, have.OptStartTime
		return nil
	}
	return fmt.Errorf("COURIER_DELIVER_POLICY=%s, but durable consumer %q on stream %q was created with deliver policy %s, which JetStream cannot change: unset COURIER_DELIVER_POLICY to keep the durable's, or remove the durable (`courier cleanup`) or choose another COURIER_CONSUMER to start anew",
		want.DeliverPolicy, have.Durable, stream, have.DeliverPolicy)
}

// keepOperatorSettings carries over onto want the settings of an existing
// durable that courier does not own, so that updating it at start never
// undoes what an operator set: a pause (courier pause), pull request limits,
// waiting-pull limit, replicas, description and metadata. courier owns the
// rest: ack policy, deliver policy (at creation), MaxDeliver, AckWait,
// MaxAckPending, filter subjects, and no BackOff or InactiveThreshold.
func keepOperatorSettings(want *jetstream.ConsumerConfig, have jetstream.ConsumerConfig) {
	if have.PauseUntil != nil && have.PauseUntil.After(time.Now()) {
		want.PauseUntil = have.PauseUntil
	}
	want.MaxRequestBatch = have.MaxRequestBatch
	want.MaxRequestMaxBytes = have.MaxRequestMaxBytes
	want.MaxRequestExpires = have.MaxRequestExpires
	want.MaxWaiting = have.MaxWaiting
	want.Replicas = have.Replicas
	want.MemoryStorage = have.MemoryStorage
	if want.Description == "" {
		want.Description = have.Description
	}
	if len(have.Metadata) > 0 {
		want.Metadata = have.Metadata
	}
}

// checkReplySubjects refuses a reply subject the consumed stream captures
// (config, which does not know the stream, refuses one a filter subject
// overlaps): the stream would store each request, its acknowledgement could
// answer the caller before the app does, and unless a filter leaves it out
// the delivery loop would post the request to the app a second time.
func checkReplySubjects(cfg config.Config, stream jetstream.Stream) error {
	for _, r := range cfg.ReplySubjects {
		for _, s := range stream.CachedInfo().Config.Subjects {
			if subject.Overlap(r, s) {
				return fmt.Errorf("reply subject %q overlaps subject %q of stream %q, which courier consumes: the stream would store each request, its acknowledgement could answer the caller, and the app could get the request twice; set COURIER_REPLY_SUBJECTS to subjects outside the stream", r, s, cfg.Stream)
			}
		}
	}
	return nil
}

// ensureSuccess makes sure a stream keeps the success records, when
// COURIER_SUCCESS_SUBJECT is set, with the dead-letter stream's rules.
func ensureSuccess(ctx context.Context, js jetstream.JetStream, cfg config.Config, stream jetstream.Stream, log *slog.Logger) error {
	if cfg.SuccessSubject == "" {
		return nil
	}
	if len(cfg.Subjects) == 0 {
		for _, s := range stream.CachedInfo().Config.Subjects {
			if subject.Matches(s, cfg.SuccessSubject) {
				return fmt.Errorf("success subject %q is captured by stream %q, which courier consumes: courier would consume its own success records; set COURIER_SUCCESS_SUBJECT to a subject outside the stream", cfg.SuccessSubject, cfg.Stream)
			}
		}
	}
	info, created, err := success.EnsureStream(ctx, js, cfg.SuccessSubject, cfg.StreamReplicas, dlq.CheckStream)
	if err != nil {
		if transientSetupError(err) {
			return err
		}
		return fmt.Errorf("success records cannot be kept: %w", err)
	}
	if created {
		log.Info("created success-record stream", "stream", info.Config.Name, "subject", cfg.SuccessSubject,
			"replicas", info.Config.Replicas)
	}
	return nil
}

// ensureDLQ makes sure a stream keeps what is published to the DLQ subject,
// and that it is not the stream courier consumes (it would consume its own
// dead letters).
func ensureDLQ(ctx context.Context, js jetstream.JetStream, cfg config.Config, stream jetstream.Stream, log *slog.Logger) error {
	src := stream.CachedInfo().Config
	if len(cfg.Subjects) == 0 {
		for _, s := range src.Subjects {
			if subject.Matches(s, cfg.DLQSubject) {
				return fmt.Errorf("dead-letter subject %q is captured by stream %q, which courier consumes: courier would consume its own dead letters; set COURIER_DLQ_SUBJECT to a subject outside the stream, or COURIER_SUBJECTS to filter it out", cfg.DLQSubject, cfg.Stream)
			}
		}
	}
	info, created, err := dlq.EnsureStream(ctx, js, cfg.DLQSubject, cfg.StreamReplicas)
	if err != nil {
		if transientSetupError(err) {
			return err
		}
		return fmt.Errorf("dead letters cannot be kept: %w", err)
	}
	if info.Config.Name == cfg.Stream && len(cfg.Subjects) == 0 {
		return fmt.Errorf("dead-letter subject %q is captured by stream %q, which courier consumes; set COURIER_DLQ_SUBJECT to a subject outside it", cfg.DLQSubject, cfg.Stream)
	}
	if created {
		log.Info("created dead-letter stream", "stream", info.Config.Name, "subject", cfg.DLQSubject,
			"replicas", info.Config.Replicas)
	} else {
		warnings, _ := dlq.CheckStream(info.Config)
		for _, w := range warnings {
			log.Warn("dead-letter stream may not keep every dead letter", "stream", info.Config.Name, "warning", w)
		}
	}
	return nil
}

// orderGroup is the priority group of a durable with order per key.
const orderGroup = "courier"

// priorityGroup is the group the delivery loop's pulls name: with order
// per key only.
func priorityGroup(cfg config.Config) string {
	if cfg.OrderKey == "" {
		return ""
	}
	return orderGroup
}

// orderPinnedTTL is how long the pinned courier may go without pulling
// before another replica takes the pin: it pulls every second while it
// delivers, so a quarter of the ack wait (at least 5s) tells a dead one.
func orderPinnedTTL(cfg config.Config) time.Duration {
	return max(cfg.AckWait/4, 5*time.Second)
}
