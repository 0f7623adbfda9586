package main

import (
	"log/slog"
	"net/http"

	"github.com/courierhq/courier/appauth"
	"github.com/courierhq/courier/cloudevents"
	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/schedule"
)

// openAppAuth opens the files of COURIER_SIGNING_SECRETS_FILE and
// COURIER_APP_TOKEN_FILE and watches them until Close. config.Load checked
// that they can be read; a content that cannot be used (a bad secret line,
// an empty token) is a configuration error too: exit 2, nothing consumed.
func openAppAuth(cfg config.Config, log *slog.Logger) (*appauth.Auth, error) {
	a, err := appauth.Open(appauth.Options{SecretsFile: cfg.SigningSecretsFile, TokenFile: cfg.AppTokenFile, Logger: log})
	if err != nil {
		return nil, invalidConfig(err, nil) // the configuration loaded: its warnings were logged
	}
	return a, nil
}

// deliveryStamp is the delivery loop's proxy.Options.Stamp: the CloudEvents
// attributes (COURIER_CLOUDEVENTS=binary), then the signature and the
// token; nil, costing nothing, when none is configured.
func deliveryStamp(cfg config.Config, a *appauth.Auth) func(http.Header, []byte) {
	ce := cfg.CloudEvents == config.CloudEventsBinary
	switch {
	case ce && a.Active():
		return func(h http.Header, body []byte) {
			cloudevents.Binary(h)
			a.Stamp(h, body)
		}
	case ce:
		return func(h http.Header, _ []byte) { cloudevents.Binary(h) }
	case a.Active():
		return a.Stamp
	}
	return nil
}

// observeLateness is stamp (nil: none) after counting, on l, how late
// the delayed messages a request carries reach the app
// (courier_schedule_deliveries_total).
func observeLateness(stamp func(http.Header, []byte), l *schedule.Lateness) func(http.Header, []byte) {
	if stamp == nil {
		return l.Observe
	}
	return func(h http.Header, body []byte) {
		l.Observe(h, body)
		stamp(h, body)
	}
}

// requestStamp is the request/reply service's reply.Options.Stamp: the
// signature and the token (a request is an invocation, not a stream's
// event: no CloudEvents attributes); nil when neither is configured.
func requestStamp(a *appauth.Auth) func(http.Header, []byte) {
	if !a.Active() {
		return nil
	}
	return a.Stamp
}
