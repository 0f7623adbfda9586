package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lmittmann/tint"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/courierhq/courier/admin"
	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/proxy"
)

// loadConfig parses the environment; problems are printed one per line and
// mean exit status 2.
func loadConfig(environ []string) (config.Config, error) {
	cfg, err := config.Load(config.Environ(environ))
	if err != nil {
		return cfg, &exitError{code: 2, err: fmt.Errorf("invalid configuration:\n%w", indent(err))}
	}
	return cfg, nil
}

func indent(err error) error {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = "  " + l
	}
	return errors.New(strings.Join(lines, "\n"))
}

func runConfig(environ []string, stdout io.Writer) error {
	cfg, err := config.Load(config.Environ(environ))
	vars := config.Describe(cfg)
	if werr := config.WriteTable(stdout, vars); werr != nil {
		return werr
	}
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("invalid configuration:\n%w", indent(err))}
	}
	return nil
}

// newLogger picks tint text on a terminal and JSON otherwise, unless
// COURIER_LOG_FORMAT says.
func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	format := cfg.LogFormat
	if format == "" {
		format = "json"
		if isTerminal(w) {
			format = "text"
		}
	}
	if format == "text" {
		return slog.New(tint.NewTextHandler(w, &tint.Options{Level: level, TimeFormat: "15:04:05.000", NoColor: !isTerminal(w)}))
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// readiness combines the conditions of /readyz; it is swapped in as the
// sidecar gets further through start-up.
type readiness struct {
	check atomic.Pointer[func() error]
}

func (r *readiness) set(f func() error) { r.check.Store(&f) }
func (r *readiness) Ready() error {
	if f := r.check.Load(); f != nil {
		return (*f)()
	}
	return errors.New("starting")
}

func runSidecar(ctx context.Context, environ []string, stderr io.Writer) error {
	cfg, err := loadConfig(environ)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(reg)

	// Admin server first, so probes answer (not ready) while courier
	// waits for NATS.
	ready := &readiness{}
	ready.set(func() error { return errors.New("connecting to NATS") })
	var loopAlive atomic.Pointer[func() error]
	live := func() error {
		if f := loadCheck(&loopAlive); f != nil {
			return f()
		}
		return nil
	}
	adm, err := admin.Listen(cfg.AdminAddr, live, ready.Ready, reg, log)
	if err != nil {
		return err
	}
	adm.Start()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = adm.Shutdown(sctx)
	}()
	log.Info("courier starting", "version", version, "stream", cfg.Stream, "consumer", cfg.Consumer,
		"app", cfg.Redacted().AppURL, "admin", adm.Addr())
	for _, name := range config.UnknownVars(config.Environ(environ)) {
		// Most likely a typo of a real variable, whose default is in effect.
		log.Warn("unknown variable ignored (see `courier config` for the real ones)", "variable", name)
	}

	// NATS: keep trying while the server is unreachable; stop on what
	// retrying cannot fix (credentials, TLS).
	nc, err := connect(ctx, cfg, log)
	if err != nil {
		return err
	}
	if nc == nil {
		return nil // stopped while waiting for NATS
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}

	// Stream, dead-letter stream and consumer; retried while NATS is
	// unreachable, fatal when the answer is final.
	var (
		stream jetstream.Stream
		cons   jetstream.Consumer
	)
	err = retrySetup(ctx, log, func(ctx context.Context) error {
		var err error
		stream, cons, err = setup(ctx, js, cfg, log)
		return err
	})
	if err != nil || ctx.Err() != nil {
		return err
	}
	reg.MustRegister(dlq.NewDepthCollector(js, cfg.DLQSubject, dlq.DepthOptions{})) // courier_dead_letters

	// One count of dead letters by reason, whoever stores them.
	deadLetterCount := proxy.NewDeadLetterCounter()
	reg.MustRegister(deadLetterCount)

	// Max-deliveries catch: dead-letters what JetStream gave up on outside
	// courier's sight, from its captured advisories. The deferred stop
	// covers early returns; the shutdown order below stops it first.
	stopGiveup, err := startGiveup(ctx, js, cfg, stream, log, reg, func() {
		deadLetterCount.WithLabelValues(dlq.ReasonMaxDeliveries).Inc()
	})
	if err != nil {
		return err
	}
	defer stopGiveup()

	// Dedup store.
	var dd proxy.Deduper
	var store interface{ Close() error } // nil, or the store to close at shutdown
	switch {
	case cfg.DedupEnabled() && (cfg.DedupStore == "kv" || cfg.DedupStore == "shared"):
		// Shared by every courier of the durable through a bucket, with the
		// embedded store as this courier's cache. The bucket is created like
		// the other streams courier makes, retried while JetStream does not
		// answer.
		local, err := dedup.Open(cfg.DedupDir, dedup.Options{
			TTL: cfg.DedupTTL, Scope: cfg.Stream + "/" + cfg.Consumer, Logger: log, Registerer: reg,
		})
		if err != nil {
			return err
		}
		var shared *dedup.Shared
		err = retrySetup(ctx, log, func(ctx context.Context) error {
			var err error
			shared, err = dedup.OpenShared(ctx, js, local, dedup.SharedOptions{
				Bucket: cfg.DedupBucket, Replicas: cfg.StreamReplicas, TTL: cfg.DedupTTL,
				// A claim outlives an attempt, and lapses about an ack wait
				// after its courier died.
				ClaimTTL: (max(cfg.AckWait, cfg.HTTPTimeout) + time.Second - 1).Truncate(time.Second),
				Scope:    cfg.Stream + "/" + cfg.Consumer,
				Logger:   log, Registerer: reg,
			})
			return err
		})
		if err != nil || shared == nil {
			_ = local.Close()
			return err
		}
		dd, store = shared, shared
		log.Info("dedup keys in a shared key-value bucket", "bucket", cfg.DedupBucket, "ttl", cfg.DedupTTL.String())
	case cfg.DedupEnabled():
		local, err := dedup.Open(cfg.DedupDir, dedup.Options{
			TTL: cfg.DedupTTL, Scope: cfg.Stream + "/" + cfg.Consumer, Logger: log, Registerer: reg,
		})
		if err != nil {
			return err
		}
		dd, store = local, local
	default:
		log.Info("dedup off (COURIER_DEDUP_TTL=0): every delivery reaches the app")
	}

	runner, err := proxy.New(cons, &deadLetters{p: dlq.NewPublisher(js, cfg.DLQSubject)}, dd, proxy.Options{
		AppURL:            cfg.AppURL,
		AppHealthURL:      cfg.AppHealthURL,
		Stream:            cfg.Stream,
		Consumer:          cfg.Consumer,
		StreamCreated:     stream.CachedInfo().Created,
		MaxDeliver:        cfg.MaxDeliver,
		AckWait:           cfg.AckWait,
		MaxInflight:       cfg.MaxInflight,
		HTTPTimeout:       cfg.HTTPTimeout,
		BackoffInitial:    cfg.BackoffInitial,
		BackoffMax:        cfg.BackoffMax,
		BackoffMultiplier: cfg.BackoffMultiplier,
		RetryAfterMax:     cfg.RetryAfterMax,
		Retryable:         cfg.RetryStatuses.Contains,
		MaxAge:            cfg.MaxAge,
		IdempotencyHeader: cfg.IdempotencyHeader,
		ShutdownGrace:     cfg.ShutdownGrace,
		Logger:            log,
		Registerer:        reg,
		DeadLetterCounter: deadLetterCount,
		MaxPayload:        nc.MaxPayload(),
	})
	if err != nil {
		if store != nil {
			_ = store.Close()
		}
		return err
	}
	alive := runner.Alive
	loopAlive.Store(&alive)
	ready.set(func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("not connected to NATS (%s)", nc.Status())
		}
		return runner.Ready()
	})
	log.Info("consuming", "stream", cfg.Stream, "consumer", cfg.Consumer, "dlq", cfg.DLQSubject,
		"max_inflight", cfg.MaxInflight, "max_deliver", cfg.MaxDeliver)

	// Shutdown order, once ctx ends: the runner stops fetching, NAKs what
	// it has not started, lets in-flight requests finish within the grace
	// period and acks them, NAKs the rest; then the max-deliveries catch
	// stops (finishing the advisory in hand); then the store is closed;
	// then the connection drained so every ack and NAK reaches the server.
	runErr := runner.Run(ctx)
	stopGiveup()
	ready.set(func() error { return errors.New("shutting down") })
	if store != nil {
		if err := store.Close(); err != nil {
			log.Error("closing dedup store", "error", err)
		}
	}
	if err := drain(nc); err != nil {
		log.Warn("draining NATS connection", "error", err)
	}
	if runErr != nil {
		return runErr
	}
	log.Info("courier stopped")
	return nil
}

func loadCheck(p *atomic.Pointer[func() error]) func() error {
	if f := p.Load(); f != nil {
		return *f
	}
	return nil
}

// drain flushes pending acks and closes the connection, waiting briefly.
func drain(nc *nats.Conn) error {
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil {
		nc.Close()
		return err
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		nc.Close()
	}
	return nil
}

// natsOptions maps the NATS_* variables to connection options.
func natsOptions(cfg config.Config, log *slog.Logger) ([]nats.Option, error) {
	if err := checkNATSFiles(cfg); err != nil {
		return nil, err
	}
	opts := []nats.Option{
		nats.Name("courier " + cfg.Stream + "/" + cfg.Consumer),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.ReconnectJitter(500*time.Millisecond, 2*time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS; reconnecting", "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("reconnected to NATS", "server", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("NATS error", "error", err)
		}),
	}
	switch {
	case cfg.NATSCreds != "":
		opts = append(opts, nats.UserCredentials(cfg.NATSCreds))
	case cfg.NATSNKey != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NATSNKey)
		if err != nil {
			return nil, fmt.Errorf("NATS_NKEY %s: %w", cfg.NATSNKey, err)
		}
		opts = append(opts, o)
	case cfg.NATSUser != "":
		opts = append(opts, nats.UserInfo(cfg.NATSUser, cfg.NATSPassword))
	case cfg.NATSToken != "":
		opts = append(opts, nats.Token(cfg.NATSToken))
	}
	if cfg.NATSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.NATSCA))
	}
	if cfg.NATSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.NATSCert, cfg.NATSKey))
	}
	return opts, nil
}

// connect dials NATS, retrying with backoff while the server is unreachable.
// It returns nil, nil if ctx ends first.
func connect(ctx context.Context, cfg config.Config, log *slog.Logger) (*nats.Conn, error) {
	opts, err := natsOptions(cfg, log)
	if err != nil {
		return nil, err
	}
	wait := 250 * time.Millisecond
	for {
		nc, err := nats.Connect(cfg.NATSURL, opts...)
		if err == nil {
			log.Info("connected to NATS", "server", nc.ConnectedUrlRedacted())
			return nc, nil
		}
		if fatal := fatalConnectError(err); fatal != nil {
			return nil, fatal
		}
		log.Warn("NATS unreachable; retrying", "url", cfg.Redacted().NATSURL, "error", err, "in", wait.String())
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(wait):
		}
		wait = min(wait*2, 15*time.Second)
	}
}

// fatalConnectError returns a clear error for connection failures that
// retrying cannot fix, or nil.
func fatalConnectError(err error) error {
	var (
		unknownCA *x509.UnknownAuthorityError
		hostname  x509.HostnameError
		verify    *tls.CertificateVerificationError
	)
	switch {
	case errors.Is(err, nats.ErrAuthorization):
		return fmt.Errorf("NATS refused the credentials (authorization violation): check NATS_CREDS, NATS_NKEY, NATS_USER/NATS_PASSWORD or NATS_TOKEN: %w", err)
	case errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked), errors.Is(err, nats.ErrAccountAuthExpired):
		return fmt.Errorf("NATS credentials expired or revoked: issue new ones: %w", err)
	case errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &verify):
		return fmt.Errorf("TLS to NATS failed verification: check NATS_CA (and the server certificate's names): %w", err)
	case errors.Is(err, nats.ErrSecureConnRequired), errors.Is(err, nats.ErrSecureConnWanted):
		return fmt.Errorf("TLS mismatch with the NATS server: %w", err)
	case strings.Contains(err.Error(), "tls:") && !strings.Contains(err.Error(), "timeout"):
		// The TLS stack reports handshake refusals (bad client
		// certificate) only as text.
		return fmt.Errorf("TLS handshake with NATS failed: check NATS_CA, NATS_CERT and NATS_KEY: %w", err)
	}
	return nil
}

// retrySetup runs f until it succeeds, fails for good, or ctx ends. Errors
// that time can fix (NATS unreachable, timeouts) are retried with backoff.
func retrySetup(ctx context.Context, log *slog.Logger, f func(context.Context) error) error {
	wait := 250 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return nil
		}
		if !transientSetupError(err) {
			return err
		}
		log.Warn("JetStream not answering; retrying start-up", "error", err, "in", wait.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(wait*2, 15*time.Second)
	}
}

func transientSetupError(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrConnectionClosed)
}

// setup checks the stream, makes sure dead letters are kept, and creates or
// updates the durable consumer.
func setup(ctx context.Context, js jetstream.JetStream, cfg config.Config, log *slog.Logger) (jetstream.Stream, jetstream.Consumer, error) {
	// A server without JetStream answers API requests with "no
	// responders", which elsewhere means "not ready yet": ask plainly.
	if _, err := js.AccountInfo(ctx); err != nil {
		switch {
		case errors.Is(err, jetstream.ErrJetStreamNotEnabled):
			return nil, nil, errors.New("JetStream is not enabled on the NATS server: enable it (`jetstream: enabled` in the server configuration, or `nats-server -js`); courier needs it")
		case errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
			return nil, nil, errors.New("JetStream is not enabled for this NATS account: give the account JetStream limits; courier needs it")
		default:
			return nil, nil, err
		}
	}
	stream, err := js.Stream(ctx, cfg.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, nil, fmt.Errorf("stream %q not found: courier does not create the stream it consumes; create it (e.g. `nats stream add %s`) or fix COURIER_STREAM", cfg.Stream, cfg.Stream)
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		return nil, nil, fmt.Errorf("JetStream is not enabled on the NATS server (or for this account): enable it, courier needs it")
	case err != nil:
		return nil, nil, fmt.Errorf("looking up stream %q: %w", cfg.Stream, err)
	}

	if err := ensureDLQ(ctx, js, cfg, stream, log); err != nil {
		return nil, nil, err
	}

	cc := jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		Description:   "courier sidecar",
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
	switch len(cfg.Subjects) {
	case 0:
	case 1:
		cc.FilterSubject = cfg.Subjects[0]
	default:
		cc.FilterSubjects = cfg.Subjects
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, cc)
	if err != nil {
		if transientSetupError(err) {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("cannot create or update durable consumer %q on stream %q: %w (settings such as COURIER_DELIVER_POLICY are fixed when a durable is created: to change them, delete the consumer or choose a new COURIER_CONSUMER)", cfg.Consumer, cfg.Stream, err)
	}
	return stream, cons, nil
}
