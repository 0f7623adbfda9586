// Package appauth lets the app tell that a request came from courier. With
// COURIER_SIGNING_SECRETS_FILE every request to the app is signed as the
// Standard Webhooks specification says (webhook-id, webhook-timestamp and
// webhook-signature: HMAC-SHA256 of "<id>.<timestamp>.<body>" with each
// secret of the file; spec/standard-webhooks.md in
// github.com/standard-webhooks/standard-webhooks), so that its reference
// verifiers accept it; with COURIER_APP_TOKEN_FILE it carries
// "Authorization: Bearer <token>" (as Dapr's APP_API_TOKEN does).
//
// Both files are watched (watch.go): re-read when they change, so that a
// secret or the token is rotated without a restart, and one that becomes
// unreadable or invalid keeps the last good value and says so once. The
// formats are in secrets.go and token.go. No secret or token is ever put in
// a log line or an error (docs/behaviour.md#signed-requests-and-a-token).
package appauth

import (
	"crypto/rand"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Headers of a signed request (Standard Webhooks' names, which HTTP reads in
// any case).
const (
	HeaderID        = "Webhook-Id"
	HeaderTimestamp = "Webhook-Timestamp"
	HeaderSignature = "Webhook-Signature"
)

// Variables named in messages: they are what an operator sets.
const (
	varSecrets = "COURIER_SIGNING_SECRETS_FILE"
	varToken   = "COURIER_APP_TOKEN_FILE"
)

// Options configures Open. Every zero value means the default stated.
type Options struct {
	// SecretsFile holds the Standard Webhooks secrets, one "whsec_<base64>"
	// a line (ParseSecrets); "" means requests are not signed.
	SecretsFile string
	// TokenFile holds the bearer token (ParseToken); "" means no token.
	TokenFile string
	// Interval is how often the files are read again to notice a change.
	// Default 1s: a Kubernetes Secret volume takes up to a minute to show
	// an update anyway, and reading two small files a second costs nothing.
	Interval time.Duration
	// Logger receives a line when a file changes, and one when it becomes
	// unusable (and one when it is usable again); default discards.
	Logger *slog.Logger
	// Now is the clock of webhook-timestamp; default time.Now.
	Now func() time.Time
}

// Auth signs requests to the app and holds the token, from files it
// watches. Create it with Open; its methods are safe for concurrent use.
// Whoever opened it must call Close, which stops the watching.
type Auth struct {
	secrets *watched[*keyring] // nil: no signing
	token   *watched[string]   // nil: no token
	now     func() time.Time

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// Open reads the files of o and starts watching them. A file that is
// missing, unreadable or invalid now is an error naming its variable and
// what is wrong (never the file's content): a configuration error. With
// neither file, the Auth does nothing (Active is false).
func Open(o Options) (*Auth, error) {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	log := o.Logger.With("component", "appauth")
	a := &Auth{now: o.Now, stop: make(chan struct{}), done: make(chan struct{})}
	var errs []error
	if o.SecretsFile != "" {
		w, err := watch(varSecrets, o.SecretsFile, "secrets", parseKeyring, func(k *keyring) []any {
			return []any{"secrets", len(k.macs)}
		}, log)
		a.secrets = w
		errs = append(errs, err)
	}
	if o.TokenFile != "" {
		w, err := watch(varToken, o.TokenFile, "token", ParseToken, nil, log)
		a.token = w
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if !a.Active() {
		close(a.done)
		return a, nil
	}
	go a.run(o.Interval)
	return a, nil
}

// Active reports whether requests are signed or carry a token: false when
// Open was given neither file, and Stamp then changes nothing.
func (a *Auth) Active() bool { return a.secrets != nil || a.token != nil }

// Stamp completes h, the headers of a request about to be sent with body
// (exactly the bytes sent): the Standard Webhooks headers, signed at this
// moment with every secret listed now, and the bearer token. webhook-id is
// the request's Idempotency-Key (a delivery's dedup key), or, for a request
// without one (a health probe, a request/reply call), a random "msg_" id.
// It replaces any webhook-* or Authorization header h already had.
//
// The key is chosen by publishers and may hold a '.', which Standard
// Webhooks would rather ids did not (the signed string joins id, timestamp
// and body with dots); a publisher able to exploit that could as well
// publish the body it wanted delivered.
func (a *Auth) Stamp(h http.Header, body []byte) {
	if a.secrets != nil {
		id := h.Get("Idempotency-Key")
		if id == "" {
			id = "msg_" + rand.Text()
		}
		ts := a.now().Unix()
		h[HeaderID] = []string{id}
		h[HeaderTimestamp] = []string{strconv.FormatInt(ts, 10)}
		h[HeaderSignature] = []string{(*a.secrets.value.Load()).sign(id, ts, body)}
	}
	if a.token != nil {
		h["Authorization"] = []string{"Bearer " + *a.token.value.Load()}
	}
}

// Token returns the token listed in COURIER_APP_TOKEN_FILE now (its last
// good value), or "" when no token file is configured. For the callers of
// courier's publish API, who must present it.
func (a *Auth) Token() string {
	if a == nil || a.token == nil {
		return ""
	}
	return *a.token.value.Load()
}

// run reads the files again every interval until Close.
func (a *Auth) run(interval time.Duration) {
	defer close(a.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
			if a.secrets != nil {
				a.secrets.poll()
			}
			if a.token != nil {
				a.token.poll()
			}
		}
	}
}

// Close stops watching the files and waits for it to end. It is
// idempotent; after it the last good values stay in use.
func (a *Auth) Close() {
	if a == nil {
		return
	}
	a.closeOnce.Do(func() {
		close(a.stop)
		<-a.done
	})
}
