package reply

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/internal/appurl"
)

// Options tunes a Service. Subjects and URL are required; every other zero
// value means the default stated on the field.
type Options struct {
	// Subjects are answered, one micro endpoint each (wildcards allowed).
	Subjects []string
	// URL is where each request is POSTed.
	URL string
	// Name is the micro service name, as `nats micro ls` shows it. Default
	// "courier".
	Name string
	// QueueGroup is the endpoints' queue group: every courier of one group
	// shares the requests, each answered once. The sidecar passes the
	// consumer name (COURIER_CONSUMER). Default Name.
	QueueGroup string
	// Version is reported by the service. A leading "v" is dropped; a value
	// that is not SemVer (a development build's "dev") is reported as 0.0.0
	// with the value given under the metadata key "courier_version".
	// Default "0.0.0".
	Version string
	// MaxConcurrent bounds requests to the app in flight at once, over all
	// subjects. Requests beyond it wait (see MaxWaiting).
	// The limit is the service's own, not shared with the asynchronous
	// delivery loop: a request's caller is waiting, so it must not queue
	// behind messages that can wait. The sidecar passes COURIER_MAX_INFLIGHT.
	// Default 8.
	MaxConcurrent int
	// MaxWaiting bounds the requests that wait in courier for a slot, in
	// the order they came, when MaxConcurrent are in flight; their data
	// together is bounded too (maxWaitingBytes). A request beyond either is
	// answered 503 "busy" at once, so that its caller can try again, on
	// another member of the queue group if there is one. The sidecar passes
	// COURIER_REPLY_MAX_WAITING. Default 64 × MaxConcurrent.
	MaxWaiting int
	// Timeout bounds one request, from connecting to the app to the last
	// byte of its answer; past it the caller gets a 504 error reply. It
	// also bounds the wait for a slot: a request that waited longer is
	// answered 503 busy and not sent to the app. The sidecar passes
	// COURIER_HTTP_TIMEOUT. Default 30s.
	Timeout time.Duration
	// ShutdownGrace is how long Stop lets requests in flight finish; those
	// still running then are cancelled and answered 503. Negative means
	// none: they are cancelled at once (the sidecar passes that for
	// COURIER_SHUTDOWN_GRACE=0). Default 25s.
	ShutdownGrace time.Duration
	// Client sends the requests. It must follow no redirect and resend
	// nothing of its own. Default apphttp.NewClient sized to MaxConcurrent:
	// a pool of its own, so requests never wait for a connection held by
	// the delivery loop.
	Client *http.Client
	// Logger receives logs, narrowed with component=reply; default discards.
	// Successful requests are logged at debug only.
	Logger *slog.Logger
	// Registerer receives the metrics; default a private registry.
	Registerer prometheus.Registerer
	// Stamp, when set, completes each request to the app once its headers
	// are final, with its body, just before it is sent (a Standard Webhooks
	// signature and a bearer token: appauth). It must be safe for
	// concurrent use; nil adds nothing.
	Stamp func(h http.Header, body []byte)
}

func (o *Options) defaults() error {
	if len(o.Subjects) == 0 || o.URL == "" {
		return errors.New("reply: Subjects and URL are required")
	}
	if _, err := appurl.Parse(o.URL); err != nil {
		return fmt.Errorf("reply: URL %q: %w", redact(o.URL), err)
	}
	seen := make(map[string]bool, len(o.Subjects))
	for _, s := range o.Subjects {
		if !validSubject(s) {
			return fmt.Errorf("reply: %q is not a valid subject", s)
		}
		if seen[s] {
			return fmt.Errorf("reply: subject %q given twice", s)
		}
		seen[s] = true
	}
	if o.Name == "" {
		o.Name = "courier"
	}
	if o.QueueGroup == "" {
		o.QueueGroup = o.Name
	}
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = 8
	}
	if o.MaxWaiting <= 0 {
		o.MaxWaiting = 64 * o.MaxConcurrent
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	switch {
	case o.ShutdownGrace < 0:
		o.ShutdownGrace = 0
	case o.ShutdownGrace == 0:
		o.ShutdownGrace = 25 * time.Second
	}
	if o.Client == nil {
		o.Client = apphttp.NewClient(apphttp.ClientOptions{MaxConns: o.MaxConcurrent})
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	return nil
}

// redact hides a password in a URL for the logs.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// validSubject reports whether s is a NATS subject or wildcard pattern a
// service can subscribe to: dot-separated non-empty tokens without
// whitespace, '*' only as a whole token, '>' only as the whole last token.
func validSubject(s string) bool {
	if s == "" {
		return false
	}
	tokens := strings.Split(s, ".")
	for i, t := range tokens {
		if t == "" || strings.ContainsAny(t, " \t\r\n") {
			return false
		}
		if strings.ContainsAny(t, "*>") && t != "*" && t != ">" {
			return false
		}
		if t == ">" && i != len(tokens)-1 {
			return false
		}
	}
	return true
}

// endpointNames derives a micro endpoint name (letters, digits, '-', '_')
// from each subject, unique within the service.
func endpointNames(subjects []string) []string {
	names := make([]string, len(subjects))
	used := make(map[string]bool, len(subjects))
	for i, subj := range subjects {
		base := strings.Map(func(r rune) rune {
			switch {
			case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
				return r
			}
			return '_'
		}, subj)
		name := base
		for n := 2; used[name]; n++ {
			name = fmt.Sprintf("%s_%d", base, n)
		}
		used[name] = true
		names[i] = name
	}
	return names
}

// semVer is SemVer 2.0's suggested pattern, the one micro validates with.
var semVer = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// microVersion returns the version micro accepts for v, and metadata keeping
// a v it cannot.
func microVersion(v string) (string, map[string]string) {
	if v == "" {
		return "0.0.0", nil
	}
	if s := strings.TrimPrefix(v, "v"); semVer.MatchString(s) {
		return s, nil
	}
	return "0.0.0", map[string]string{"courier_version": v}
}

// maxWaitingBytes bounds the data of the requests waiting for a slot: the
// client's own default limit on a subscription's buffer, which courier's
// waiting replaces.
const maxWaitingBytes = nats.DefaultSubPendingBytesLimit
