package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/internal/retry"
)

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

// connect dials NATS, retrying with backoff while the server is unreachable
// and stopping at once on what retrying cannot fix (credentials, TLS). It
// returns ctx's error if ctx ends first.
func connect(ctx context.Context, cfg config.Config, log *slog.Logger) (*nats.Conn, error) {
	opts, err := natsOptions(cfg, log)
	if err != nil {
		return nil, err
	}
	var nc *nats.Conn
	err = retry.Do(ctx, retry.Policy{}, func(context.Context) error {
		c, err := nats.Connect(cfg.NATSURL, opts...)
		if err != nil {
			if fatal := fatalConnectError(err); fatal != nil {
				return retry.Permanent(fatal)
			}
			return err
		}
		nc = c
		return nil
	}, func(err error, wait time.Duration) {
		log.Warn("NATS unreachable; retrying", "url", cfg.Redacted().NATSURL, "error", err, "in", wait.Round(time.Millisecond).String())
	})
	if err != nil {
		if nc != nil {
			nc.Close()
		}
		return nil, err
	}
	log.Info("connected to NATS", "server", nc.ConnectedUrlRedacted())
	return nc, nil
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

// errConnClosed: the NATS client gave the connection up for good, which it
// does (reconnecting without limit otherwise) once the server has refused
// the credentials twice in a row.
var errConnClosed = errors.New("the NATS connection closed for good")

// connClosedError explains a connection closed for good, from the client's
// last error.
func connClosedError(last error) error {
	if fatal := fatalConnectError(last); fatal != nil {
		return fmt.Errorf("%w: %w", errConnClosed, fatal)
	}
	if last != nil {
		return fmt.Errorf("%w (%w): restart courier", errConnClosed, last)
	}
	return fmt.Errorf("%w: restart courier", errConnClosed)
}

// drain flushes pending acks and NAKs and closes the connection, waiting at
// most drainTimeout.
func drain(nc *nats.Conn) error {
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil {
		nc.Close()
		return err
	}
	t := time.NewTimer(drainTimeout)
	defer t.Stop()
	select {
	case <-closed:
	case <-t.C:
		nc.Close()
	}
	return nil
}

// drainTimeout bounds drain: acks and NAKs are small and already written.
const drainTimeout = 5 * time.Second

// dialCommand connects a command (dlq, pause, status...) to NATS once, named
// for what it is, a failure retrying cannot fix said plainly.
func dialCommand(cfg config.Config, opts []nats.Option, name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(cfg.NATSURL, append(opts, nats.Name(name+" "+cfg.Stream+"/"+cfg.Consumer))...)
	if err != nil {
		if fatal := fatalConnectError(err); fatal != nil {
			return nil, nil, fatal
		}
		return nil, nil, fmt.Errorf("cannot connect to NATS at %s: %w", cfg.Redacted().NATSURL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}
