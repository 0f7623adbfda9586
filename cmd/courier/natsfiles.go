package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/nkeys"

	"github.com/courierhq/courier/config"
)

// checkNATSFiles reads the credential and TLS files named by NATS_CREDS,
// NATS_CA, NATS_CERT and NATS_KEY before the first dial. nats.go reads them
// only while connecting, and its errors for a malformed file are untyped, so
// they would read as "server unreachable" and be retried for ever; a file
// that cannot be used is a one-line exit instead. No message quotes the
// files' contents.
func checkNATSFiles(cfg config.Config) error {
	if cfg.NATSCreds != "" {
		b, err := os.ReadFile(cfg.NATSCreds)
		if err != nil {
			return fmt.Errorf("NATS_CREDS %s: %w", cfg.NATSCreds, err)
		}
		kp, err := nkeys.ParseDecoratedNKey(b)
		if err != nil {
			return fmt.Errorf("NATS_CREDS %s: not a credentials file (want a user JWT and its nkey seed, as `nsc generate creds` writes): %w", cfg.NATSCreds, err)
		}
		kp.Wipe()
	}
	if cfg.NATSCA != "" {
		b, err := os.ReadFile(cfg.NATSCA)
		if err != nil {
			return fmt.Errorf("NATS_CA %s: %w", cfg.NATSCA, err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return fmt.Errorf("NATS_CA %s: no PEM certificate in the file", cfg.NATSCA)
		}
	}
	if cfg.NATSCert != "" || cfg.NATSKey != "" {
		if _, err := tls.LoadX509KeyPair(cfg.NATSCert, cfg.NATSKey); err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				return fmt.Errorf("NATS_CERT/NATS_KEY: %w", err)
			}
			// crypto/tls's messages name what is wrong, never the key.
			return fmt.Errorf("NATS_CERT %s and NATS_KEY %s: not a usable certificate and private key: %w", cfg.NATSCert, cfg.NATSKey, err)
		}
	}
	return nil
}
