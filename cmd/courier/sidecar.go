package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel"

	"github.com/courierhq/courier/admin"
	"github.com/courierhq/courier/appauth"
	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/consumerstats"
	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/orderkey"
	"github.com/courierhq/courier/ordermark"
	"github.com/courierhq/courier/proxy"
	"github.com/courierhq/courier/publish"
	"github.com/courierhq/courier/reply"
	"github.com/courierhq/courier/success"
	"github.com/courierhq/courier/tracing"
)

// runSidecar runs courier beside its app until ctx ends (SIGTERM, SIGINT),
// then shuts down in order and returns nil, or returns the first failure
// that retrying cannot fix.
func runSidecar(ctx context.Context, environ []string, stderr io.Writer) error {
	cfg, err := loadConfig(environ)
	if err != nil {
		return err
	}
	env := config.Environ(environ)
	s := &sidecar{cfg: cfg, log: newLogger(cfg, stderr), reg: prometheus.NewRegistry(), health: newHealth()}
	s.paths = newPaths(s, cfg)
	for _, w := range config.Warnings(cfg, env) {
		s.log.Warn(w.Text, "variable", w.Variable)
	}
	// The signing secrets and the token, watched while courier runs.
	if s.auth, err = openAppAuth(cfg, s.log); err != nil {
		return err
	}
	defer s.auth.Close()
	err = s.run(ctx)
	s.close()
	// The last line, after every component has stopped.
	switch {
	case err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()):
		s.log.Info("courier stopped during start-up")
		return nil // stopped while waiting for NATS or JetStream
	case err == nil:
		s.log.Info("courier stopped", "released", s.released())
	}
	return err
}

// sidecar is one run of courier. Start-up is a sequence of steps, each
// setting up one component and returning what undoes it; close undoes them
// in the one order shutdown needs, whichever step start-up reached.
type sidecar struct {
	cfg    config.Config
	log    *slog.Logger
	reg    *prometheus.Registry
	health *health

	nc    *nats.Conn
	js    jetstream.JetStream
	local *dedup.Store  // the embedded store (the shared store's cache); nil: dedup off
	store proxy.Deduper // local, or the shared store taking it over
	// paths are the subscriptions' delivery paths (paths.go).
	paths   []*path
	tracing *tracing.Provider // nil: tracing off
	auth    *appauth.Auth     // signing secrets and token (inactive without their files)

	replies   *reply.Service  // nil unless COURIER_REPLY_SUBJECTS is set
	publisher *publish.Server // nil unless COURIER_PUBLISH_ADDR is set

	// connLost stops run when the NATS connection closes for good.
	connLost context.CancelCauseFunc

	// What undoes each step; nil until the step ran.
	stopReplies, closeStore, stopPublish, drainConn, stopTracing, stopAdmin func()
}

// run starts every component, then delivers until ctx ends. It returns
// once the delivery loop has stopped fetching and settled every message it
// held (acked, or NAK'd for redelivery); close does the rest. A NATS
// connection the client gives up for good (connClosed) stops courier as the
// stop signal does, and is then run's error.
func (s *sidecar) run(parent context.Context) error {
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	s.connLost = cancel
	err := s.runSteps(ctx)
	if cause := context.Cause(ctx); parent.Err() == nil && errors.Is(cause, errConnClosed) {
		return cause
	}
	return err
}

// runSteps is run's sequence of start-up steps, then the delivery loop.
func (s *sidecar) runSteps(ctx context.Context) (err error) {
	// The admin server first, so that probes answer (not ready) while
	// courier waits for NATS.
	if s.stopAdmin, err = s.startAdmin(); err != nil {
		return err
	}
	// Tracing, before anything delivers: spans from the first attempt.
	if s.stopTracing, err = s.startTracing(ctx); err != nil {
		return err
	}
	// The publish API (package publish), before NATS: a publish waits for the
	// connection within its time; close keeps the API up through the
	// grace period.
	if s.cfg.ServesPublishes() {
		if s.stopPublish, err = s.startPublish(ctx); err != nil {
			return err
		}
	}
	// The embedded store before anything touches the server: a second
	// courier on a locked store stops here, having changed nothing.
	if len(s.paths) > 0 {
		s.health.at("opening the dedup store")
		if s.closeStore, err = s.openStore(); err != nil {
			return err
		}
	}
	// NATS, retried while unreachable.
	s.health.at("connecting to NATS")
	if s.drainConn, err = s.connect(ctx); err != nil {
		return err
	}
	s.connectPublish()
	// Request/reply (README, "Results out"): answered from now on, beside the
	// delivery loop, with its own slots and HTTP connections; on the stop
	// signal it drains at the same time as the delivery loop.
	if s.cfg.ServesReplies() {
		s.health.at("registering the request/reply service")
		if s.stopReplies, err = s.startReplies(ctx); err != nil {
			return err
		}
	}
	if len(s.paths) == 0 {
		s.logSchedules(ctx)
		s.health.running(s.nc, replyLoop{s.replies})
		s.log.Info("serving requests only (no COURIER_STREAM)", "subjects", s.cfg.ReplySubjects, "url", s.cfg.Redacted().ReplyURL)
		<-ctx.Done()
		s.logStop(ctx, "no more requests taken; those in progress get the grace period")
		return nil
	}
	// The shared store's bucket lives on the server.
	if s.local != nil && s.cfg.DedupStore == config.DedupShared {
		s.health.at("opening the shared dedup bucket")
		closeShared, err := s.openSharedStore(ctx)
		if err != nil {
			return err
		}
		s.closeStore = closeShared // closes the embedded store too
	}
	// Each subscription's path: its stream, dead-letter stream and durable,
	// its delivery loop, and its max-deliveries catch.
	for _, p := range s.paths {
		if err := p.start(ctx); err != nil {
			return err
		}
	}
	s.logSchedules(ctx)
	return s.deliver(ctx)
}

// start sets up the path on the server and makes its delivery loop.
func (p *path) start(ctx context.Context) (err error) {
	what := func(step string) string {
		if p.name != "" {
			return "subscription " + p.name + ": " + step
		}
		return step
	}
	if p.dd, err = p.dedupView(); err != nil {
		return err
	}
	// The stream, the dead-letter stream and the durable consumer.
	p.health.at(what("setting up the stream, dead-letter stream and consumer"))
	if err = p.setUp(ctx); err != nil {
		return err
	}
	// The delivery loop, made (not run) before the catch, which asks it
	// which originals of reference dead letters it left in the stream and
	// which messages it is still delivering.
	runner, err := p.newRunner()
	if err != nil {
		return err
	}
	p.runner.Store(runner)
	// The max-deliveries catch: dead-letters what JetStream gave up on
	// outside courier's sight, from its captured advisories.
	p.health.at(what("setting up the max-deliveries catch"))
	caught, origin := p.giveupStream()
	p.stopGiveup, err = startGiveup(ctx, p.js, p.cfg, caught, origin, p.log, p.reg, func() {
		p.deadLetters.WithLabelValues(dlq.ReasonMaxDeliveries).Inc()
	}, runner, p.dd)
	return err
}

// close undoes start-up, whatever step it reached, in the order a SIGTERM
// needs (README, "Operating it"). By now the delivery loop has stopped
// fetching and finished or NAK'd what it held. Then: the request/reply
// service has answered every request it took, the max-deliveries catch stops (finishing the
// advisory in hand), the dedup store closes, the publish API stops once the grace period
// since the stop signal is over (publish.go), the NATS connection drains (so
// every ack and NAK reaches the server), the spans not exported yet are
// flushed (every attempt's span has ended with the delivery loop; acks come
// first), and the admin server stops last, so that probes answer to the
// end. runSidecar then logs "courier stopped", the last line.
func (s *sidecar) close() {
	s.health.at("shutting down")
	for _, undo := range []func(){s.stopReplies, s.stopGiveups, s.stopMemberships, s.closeStore, s.stopPublish, s.drainConn, s.stopTracing, s.stopAdmin} {
		if undo != nil {
			undo()
		}
	}
}

func (s *sidecar) startAdmin() (func(), error) {
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(s.reg)

	adm, err := admin.ListenWith(s.cfg.AdminAddr, s.health.Alive, s.health.Ready, s.reg, s.log, admin.Options{State: s.state})
	if err != nil {
		return nil, err
	}
	adm.Start()
	s.log.Info("courier starting", "version", readBuild().version, "stream", s.cfg.Stream, "consumer", s.cfg.Consumer,
		"app", s.cfg.Redacted().AppURL, "admin", adm.Addr())
	logFeatures(s.log, s.cfg)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = adm.Shutdown(ctx)
	}, nil
}

// tracingFlushTimeout bounds the flush of spans at shutdown: a collector
// that is down must not hold a pod past its grace period, which leaves
// about 5s beyond COURIER_SHUTDOWN_GRACE for all of shutdown.
const tracingFlushTimeout = 2 * time.Second

// startTracing sets up the tracer provider when an OTLP endpoint is set
// (README, "Tracing"); the delivery loop then makes a span of each attempt.
func (s *sidecar) startTracing(ctx context.Context) (func(), error) {
	cfg := s.cfg
	if !cfg.TracingEnabled() {
		if cfg.OTELSDKDisabled && (cfg.OTLPEndpoint != "" || cfg.OTLPTracesEndpoint != "") {
			s.log.Info("tracing off: OTEL_SDK_DISABLED=true")
		}
		return nil, nil
	}
	v, _, _ := buildInfo()
	p, err := tracing.New(ctx, tracing.Config{
		Endpoint:           cfg.TracesEndpoint(),
		Protocol:           cfg.TracesProtocol(),
		Insecure:           cfg.TracesInsecure(),
		Headers:            cfg.TracesHeaders(),
		ServiceName:        cfg.TracesServiceName(),
		ServiceVersion:     v,
		ResourceAttributes: cfg.ResourceAttributes(),
		Sampler:            cfg.OTELTracesSampler,
		SamplerRatio:       cfg.TracesSamplerRatio(),
	})
	if err != nil {
		return nil, err
	}
	// OpenTelemetry reports failed exports through its one, process-wide
	// handler: into courier's log rather than the standard log package.
	otel.SetErrorHandler(tracing.ErrorHandler(s.log, time.Minute))
	s.tracing = p
	s.log.Info("tracing on: a span per delivery attempt", "endpoint", cfg.Redacted().TracesEndpoint(),
		"protocol", cfg.TracesProtocol(), "sampler", cfg.OTELTracesSampler, "service", cfg.TracesServiceName())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			s.log.Warn("spans not exported at shutdown", "error", err)
		}
	}, nil
}

func (s *sidecar) connect(ctx context.Context) (func(), error) {
	nc, err := connect(ctx, s.cfg, s.log)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	s.nc, s.js = nc, js
	// nats.go closes the connection for good when the server refuses the
	// credentials twice in a row (changed, revoked or expired while
	// courier runs): nothing would reconnect it, so courier stops and says
	// why, rather than live on unready with /healthz passing. drain
	// replaces this handler: its own close is no failure.
	nc.SetClosedHandler(func(c *nats.Conn) { s.connLost(connClosedError(c.LastError())) })
	if nc.IsClosed() {
		s.connLost(connClosedError(nc.LastError()))
	}
	return func() {
		if err := drain(nc); err != nil {
			s.log.Warn("draining NATS connection", "error", err)
		}
	}, nil
}

// setUp checks the stream and creates what courier needs on the server,
// retried while the server does not answer.
func (p *path) setUp(ctx context.Context) error {
	err := retrySetup(ctx, p.log, "stream, dead-letter stream and consumer", func(ctx context.Context) error {
		var err error
		p.stream, p.cons, err = setUp(ctx, p.js, p.cfg, p.deliverPolicyGiven, p.log)
		return err
	})
	if err != nil {
		return err
	}
	if p.cfg.OrderKey != "" {
		// Order per key: the bucket of the keys' first unsettled messages.
		open := ordermark.Open
		if partitioned(p.cfg) {
			open = ordermark.OpenPartitions
		}
		err := retrySetup(ctx, p.log, "order marks bucket", func(ctx context.Context) error {
			var err error
			p.marks, err = open(ctx, p.js, p.cfg.Stream, p.cfg.Consumer, p.cfg.StreamReplicas)
			return err
		})
		if err != nil {
			return err
		}
	}
	if p.cfg.OrderKey != "" && !partitioned(p.cfg) {
		p.joinPinHolders(ctx)
	}
	consumers := []jetstream.Consumer{p.cons}
	if partitioned(p.cfg) {
		if err := p.setUpPartitions(ctx); err != nil {
			return err
		}
		consumers = p.parts.Consumers
	}
	// After the partitions: a rewind's copy point is confirmed against
	// their work stream.
	p.watchRewinds(ctx)
	depth, err := dlq.NewDepthCollector(p.js, p.cfg.DLQSubject, dlq.DepthOptions{})
	if err != nil {
		return err
	}
	p.reg.MustRegister(depth) // courier_dead_letters_stored
	for _, c := range consumers {
		p.reg.MustRegister(consumerstats.New(c, consumerstats.Options{})) // courier_consumer_*
	}
	return nil
}

// newRunner makes the delivery loop; it does no I/O.
func (p *path) newRunner() (*proxy.Runner, error) {
	cfg := p.cfg
	return proxy.New(p.cons, dlq.NewPublisher(p.js, cfg.DLQSubject), p.dd, proxy.Options{
		AppURL:            cfg.AppURL,
		AppHealthURL:      cfg.AppHealthURL,
		Stream:            cfg.Stream,
		Consumer:          cfg.Consumer,
		StreamCreated:     p.stream.CachedInfo().Created,
		MaxDeliver:        cfg.MaxDeliver,
		AckWait:           cfg.AckWait,
		MaxInflight:       cfg.MaxInflight,
		InflightAuto:      cfg.InflightAuto,
		Routes:            routesOf(cfg),
		BatchMax:          cfg.BatchMax,
		BatchWait:         cfg.BatchWait,
		BatchBytes:        cfg.BatchBytes,
		OrderKey:          orderKey(cfg),
		OrderMarks:        p.orderMarks(),
		Rewinds:           p.rewindsView(),
		PriorityGroup:     priorityGroup(cfg),
		Partitions:        p.runnerPartitions(),
		Handover:          p.durableHandover(),
		Membership:        p.membership(),
		HTTPTimeout:       cfg.HTTPTimeout,
		BackoffInitial:    cfg.BackoffInitial,
		BackoffMax:        cfg.BackoffMax,
		BackoffMultiplier: cfg.BackoffMultiplier,
		RetryAfterMax:     cfg.RetryAfterMax,
		Retryable:         cfg.RetryStatuses.Contains,
		MaxAge:            cfg.MaxAge,
		IdempotencyHeader: cfg.IdempotencyHeader,
		ShutdownGrace:     cfg.ShutdownGrace,
		Logger:            p.log,
		Registerer:        p.reg,
		DeadLetterCounter: p.deadLetters,
		MaxPayload:        p.nc.MaxPayload(),
		BreakerFailures:   cfg.BreakerFailures,
		BreakerProbe:      cfg.BreakerProbe,
		BreakerProbeMax:   cfg.BreakerProbeMax,
		MaxRate:           cfg.MaxRate,
		Connected:         p.nc.IsConnected,
		Reconnects:        func() uint64 { return p.nc.Stats().Reconnects },
		TermKeepsMessage:  p.stream.CachedInfo().Config.Retention == jetstream.LimitsPolicy,
		Success:           p.successPublisher(),
		Tracer:            p.tracing.Tracer(),     // nil: tracing off
		Propagator:        p.tracing.Propagator(), // W3C Trace Context
		Stamp:             observeLateness(deliveryStamp(cfg, p.auth), p.late),
		// A pause, or an ack wait another courier changed, is noticed
		// within half an ack wait (at most 5s).
		InfoInterval: min(5*time.Second, max(cfg.AckWait/2, 100*time.Millisecond)),
	})
}

// deliver runs every subscription's delivery loop until ctx ends, and
// returns once each has stopped fetching and settled what it held. A loop
// that fails for good (its consumer deleted) stops the others, and courier
// exits with its error.
func (s *sidecar) deliver(ctx context.Context) error {
	var l loop = pathsLoop(s.paths)
	if s.replies != nil {
		l = both{l, replyLoop{s.replies}}
	}
	s.health.running(s.nc, l)

	// Say when the stop signal arrives, not only once the grace period
	// is over; when courier is stopped otherwise (its caller, the NATS
	// connection closed for good), say that instead.
	signalled := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		defer close(signalled)
		s.logStop(ctx, "no more fetching; in-flight requests get the grace period, the rest are NAK'd for redelivery")
	})
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	errs := make([]error, len(s.paths))
	var wg sync.WaitGroup
	for i, p := range s.paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = p.run(runCtx); errs[i] != nil {
				stop(errs[i])
			}
		}()
	}
	wg.Wait()
	if !stopWatch() {
		<-signalled
	}
	s.health.at("shutting down")
	return errors.Join(errs...)
}

// run runs the subscription's delivery loop until ctx ends.
func (p *path) run(ctx context.Context) error {
	cfg := p.cfg
	p.log.Info("consuming", "stream", cfg.Stream, "consumer", cfg.Consumer, "dlq", cfg.DLQSubject,
		"max_inflight", inflightText(cfg), "max_deliver", cfg.MaxDeliver)
	err := p.runner.Load().Run(ctx)
	if err != nil && p.name != "" {
		err = fmt.Errorf("subscription %s: %w", p.name, err)
	}
	return err
}

// logStop says why courier is stopping (ctx has ended) and what happens
// now: "stop signal received" only when a signal came, "stopping" when
// courier's caller stopped it or the NATS connection closed for good.
func (s *sidecar) logStop(ctx context.Context, now string) {
	what := "stopping"
	if errors.As(context.Cause(ctx), new(stopSignal)) {
		what = "stop signal received"
	}
	s.log.Info(what+": "+now, "cause", context.Cause(ctx).Error(), "grace", s.cfg.ShutdownGrace.String())
}

// startReplies registers the request/reply service. It drains on the stop
// signal, and the returned stop (idempotent) waits until every request it
// took is answered: before the connection drains, which would replace the
// handler the service relies on.
func (s *sidecar) startReplies(ctx context.Context) (func(), error) {
	v, _, _ := buildInfo()
	grace := s.cfg.ShutdownGrace
	if grace == 0 {
		grace = -1 // none, as for the delivery loop (reply's zero is its default)
	}
	rs, err := reply.New(s.nc, reply.Options{
		Subjects: s.cfg.ReplySubjects, URL: s.cfg.ReplyURL, QueueGroup: s.cfg.Consumer, Version: v,
		MaxConcurrent: s.cfg.MaxInflight, MaxWaiting: s.cfg.EffectiveReplyMaxWaiting(), Timeout: s.cfg.HTTPTimeout, ShutdownGrace: grace,
		Logger: s.log, Registerer: s.reg, Stamp: requestStamp(s.auth),
	})
	if err != nil {
		return nil, err
	}
	if err := rs.Start(ctx); err != nil {
		rs.Stop()
		return nil, err
	}
	s.replies = rs
	stopOnSignal := context.AfterFunc(ctx, rs.Stop)
	// rs.Start has logged "answering requests", the URL redacted.
	return func() { stopOnSignal(); rs.Stop() }, nil
}

// replyLoop is the request/reply service as health sees it.
type replyLoop struct{ rs *reply.Service }

func (r replyLoop) Ready() error { return r.rs.Ready() }
func (r replyLoop) Alive() error { return nil }

// both is ready and alive when each of two loops is.
type both [2]loop

func (b both) Ready() error { return errors.Join(b[0].Ready(), b[1].Ready()) }
func (b both) Alive() error { return errors.Join(b[0].Alive(), b[1].Alive()) }

// successPublisher stores success records, when COURIER_SUCCESS_SUBJECT is
// set (the interface stays nil otherwise).
func (p *path) successPublisher() proxy.SuccessPublisher {
	if p.cfg.SuccessSubject == "" {
		return nil
	}
	return success.NewPublisher(p.js, p.cfg.SuccessSubject)
}

// registerBuildInfo exposes courier_build_info{version,commit,goversion} 1.
func registerBuildInfo(reg prometheus.Registerer) {
	v, c, g := buildInfo()
	bi := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "courier_build_info",
		Help:        "courier's version, commit and Go version; always 1.",
		ConstLabels: prometheus.Labels{"version": v, "commit": c, "goversion": g},
	})
	bi.Set(1)
	reg.MustRegister(bi)
}

// orderKey is COURIER_ORDER_KEY's key, nil when unset (config.Load checked
// it).
func orderKey(cfg config.Config) orderkey.Key {
	if cfg.OrderKey == "" {
		return nil
	}
	k, err := orderkey.Parse(cfg.OrderKey)
	if err != nil {
		return nil
	}
	return k
}

// inflightText says the in-flight limit as the logs and courier status show
// it: the number, or that it is automatic and its ceiling.
func inflightText(cfg config.Config) string {
	if cfg.InflightAuto {
		return fmt.Sprintf("automatic, at most %d", cfg.MaxInflight)
	}
	return strconv.Itoa(cfg.MaxInflight)
}

// routesOf is COURIER_ROUTES as the delivery loop takes them: each path on
// the app URL's origin.
func routesOf(cfg config.Config) []proxy.Route {
	out := make([]proxy.Route, 0, len(cfg.Routes))
	for _, rt := range cfg.Routes {
		out = append(out, proxy.Route{Pattern: rt.Pattern, URL: cfg.RouteURL(rt.Path)})
	}
	return out
}
