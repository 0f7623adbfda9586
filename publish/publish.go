// Package publish is courier's HTTP publish API: an app publishes to
// JetStream with plain HTTP, `POST /v1/publish/<subject>`, the body as the
// message data and the request's headers as its headers, and gets its answer
// only once a stream has acknowledged the message (200 with the stream, the
// sequence and whether it was a duplicate), or a status saying why not: 401
// without the bearer token, 403 a subject outside Options.Subjects or a
// request a browser page made (route.go), 400 an invalid subject or a header
// NATS cannot carry, 404 no stream captures it, 413 too large, 412 a
// Nats-Expected-* header did not hold, 503 with Retry-After when no
// acknowledgement came within Options.Timeout (courier retried meanwhile:
// NATS unreachable, no quorum, a leader election) or when too many publishes
// are in progress. Every answer is JSON, {"error": "..."} when refused, an
// unknown path and another method included (404, 405 with Allow); no path
// is redirected.
//
// Idempotency-Key becomes the message's Nats-Msg-Id, so a publish the app
// retries is stored once within the stream's duplicate window; a request
// without one gets a Nats-Msg-Id of courier's own, so that courier's retries
// of that one request never store it twice.
//
// POST BatchPath publishes a batch of messages in one request, each entry
// answered on its own (batch.go).
//
// A publish (or a batch entry) with Courier-Delay or Courier-Deliver-At is
// delivered later, by JetStream's message schedules: it is answered 202
// with the schedule's id, which DELETE SchedulesPath + id cancels
// (delayed.go, cancel.go).
package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/connlimit"
	"github.com/courierhq/courier/internal/retry"
	"github.com/courierhq/courier/internal/subject"
	"github.com/courierhq/courier/schedule"
)

// PathPrefix is where the API is served: POST PathPrefix + subject.
const PathPrefix = "/v1/publish/"

// attemptTimeout bounds one publish attempt within a request's time: an
// acknowledgement takes milliseconds, so one this late went to a server that
// is gone or has no quorum, and the next attempt (same Nats-Msg-Id, so
// stored once) may reach one that answers.
const attemptTimeout = 3 * time.Second

// retryPolicy spaces the attempts within one request's time: soon at
// first (a leader election takes a moment), at most a second apart.
var retryPolicy = retry.Policy{Initial: 50 * time.Millisecond, Max: time.Second, Multiplier: 2}

// Server is the publish API. Create it with Listen, call Start once (it
// serves from then on), Connect once the NATS connection is made, and
// Shutdown to stop it; its methods are safe for concurrent use. Until
// Connect, a publish waits for the connection within its time, then is
// answered 503: an app that starts before courier has reached NATS gets a
// Retry-After, not a refused connection.
type Server struct {
	// nc and js are set once, by Connect, before connected is closed.
	nc *nats.Conn
	js jetstream.JetStream
	// async publishes a batch's first attempts, each acknowledgement
	// given up on after attemptTimeout (so none is awaited for ever).
	async     jetstream.JetStream
	connected chan struct{}
	connect   sync.Once

	o   Options
	log *slog.Logger
	// sched is what delayed publishes know of streams (delayed.go).
	sched *schedStreams
	m     *metrics
	hdr   answerHeaders
	// pubOpts are every attempt's: one attempt each, courier's retry
	// loop spacing them (made once, not per attempt).
	pubOpts []jetstream.PublishOpt
	slots   chan struct{} // a token per publish in progress
	turn    chan struct{} // held by the one batch waiting for slots
	batches chan struct{} // a token per batch request in progress

	// crossOrigin refuses a browser's cross-site request (admit).
	crossOrigin *http.CrossOriginProtection
	// listenIP or listenName is the listen address's host (hostAllowed).
	listenIP   netip.Addr
	listenName string

	ln  net.Listener
	srv *http.Server
	// base is every request's context; cancelled when Shutdown gives up
	// waiting, so that publishes still retrying answer 503 at once.
	base       context.Context
	cancelBase context.CancelFunc
	start      sync.Once
	done       chan error
}

// Listen binds addr (host:port; the sidecar makes ":7416" 127.0.0.1:7416)
// and prepares the API. Without a token, a request must name courier in
// its Host by a loopback name, addr's host or the IP it reached (admit). It registers the metrics on opts.Registerer;
// nothing is served before Start.
func Listen(addr string, opts Options) (*Server, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("publish API cannot listen on COURIER_PUBLISH_ADDR %q: %w", addr, err)
	}
	base, cancel := context.WithCancel(context.Background())
	s := &Server{
		connected: make(chan struct{}),
		o:         opts, m: m, sched: newSchedStreams(),
		hdr:         newAnswerHeaders(opts.RetryAfter),
		pubOpts:     []jetstream.PublishOpt{jetstream.WithRetryAttempts(0)},
		log:         opts.Logger.With("component", "publish"),
		slots:       make(chan struct{}, opts.MaxConcurrent),
		turn:        make(chan struct{}, 1),
		batches:     make(chan struct{}, maxBatches),
		crossOrigin: http.NewCrossOriginProtection(),
		ln:          ln, base: base, cancelBase: cancel,
		done: make(chan error, 1),
	}
	// The listen address's host, a Host that names this courier (hostAllowed).
	if host, _, err := net.SplitHostPort(addr); err == nil {
		if ip, err := netip.ParseAddr(host); err == nil {
			s.listenIP = ip.Unmap()
		} else {
			s.listenName = host
		}
	}
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(s.route),
		ReadHeaderTimeout: opts.ReadHeaderTimeout,
		// The body must arrive within the publish's own time.
		ReadTimeout:    opts.Timeout,
		WriteTimeout:   opts.Timeout + 5*time.Second,
		IdleTimeout:    opts.IdleTimeout,
		MaxHeaderBytes: maxHeaderBytes,
		ConnState:      connlimit.New(opts.MaxConns).ConnState,
		BaseContext:    func(net.Listener) context.Context { return base },
		ErrorLog:       slog.NewLogLogger(opts.Logger.Handler(), slog.LevelDebug),
	}
	return s, nil
}

// loopbackOnly reports whether the API listens on a loopback address
// alone.
func (s *Server) loopbackOnly() bool {
	if s.listenName != "" {
		return strings.EqualFold(s.listenName, "localhost")
	}
	return s.listenIP.IsLoopback()
}

// Connect hands the server the NATS connection and its JetStream to
// publish on; they stay the caller's to drain and close after Shutdown.
// Publishes waiting for it go on at once. Only the first call counts.
func (s *Server) Connect(nc *nats.Conn, js jetstream.JetStream) {
	s.connect.Do(func() {
		s.nc, s.js = nc, js
		async, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(attemptTimeout))
		if err != nil { // only bad options fail, and these are fixed
			panic(fmt.Sprintf("publish: %v", err))
		}
		s.async = async
		close(s.connected)
	})
}

// Addr is the address actually bound (useful with port 0).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Start serves in a goroutine owned by the server; Shutdown stops and waits
// for it. A second call does nothing.
func (s *Server) Start() {
	s.start.Do(func() {
		go func() {
			err := s.srv.Serve(s.ln)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			s.done <- err
		}()
		s.log.Info("publish API listening", "addr", s.Addr(), "subjects", strings.Join(s.o.Subjects, ","),
			"timeout", s.o.Timeout.String(), "max_concurrent", s.o.MaxConcurrent)
		if !s.loopbackOnly() && (s.o.Token == nil || s.o.Token() == "") {
			s.log.Warn("publish API listens beyond loopback without a token: only clients on this host (in this pod) are admitted; set COURIER_APP_TOKEN_FILE to admit others", "addr", s.Addr())
		}
	})
}

// Shutdown stops accepting requests and waits, until ctx ends, for those
// in progress to be answered (each within Options.Timeout); when ctx ends
// first, the publishes still retrying are answered 503 and the connections
// closed. It returns ctx's error in that case. Call it once, after Start.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		s.cancelBase()
		_ = s.srv.Close()
	}
	s.cancelBase()
	s.start.Do(func() { // never started: nothing to wait for
		_ = s.ln.Close()
		s.done <- nil
	})
	if serr := <-s.done; err == nil {
		err = serr
	}
	return err
}

// result is what a request is answered.
type result struct {
	status  int
	outcome string
	msg     string // why, for a refusal
	ack     *jetstream.PubAck
	dup     bool // the ack's duplicate flag, as the app should read it
	// sched is the schedule a delayed publish stored (202); nil for others.
	sched *scheduled
	// code is the JetStream API error a refusal answers; maybeStored
	// says that an attempt of this request may have been stored.
	code        jetstream.ErrorCode
	maybeStored bool
}

func fail(err error) result {
	var ref *refusal
	if errors.As(err, &ref) {
		return result{status: ref.status, outcome: ref.outcome, msg: ref.msg, code: ref.code}
	}
	return result{status: http.StatusServiceUnavailable, outcome: outcomeUnavailable, msg: err.Error()}
}

func (s *Server) servePublish(w http.ResponseWriter, r *http.Request, subj string) {
	start := time.Now()
	res := s.handle(r, subj, start.Add(s.o.Timeout))
	s.answer(w, res)
	s.m.observe(res.outcome, time.Since(start).Seconds())
	if !s.log.Enabled(r.Context(), slog.LevelDebug) {
		return // spare building the line's attributes
	}
	if res.ack != nil {
		s.log.Debug("published", "subject", subj, "stream", res.ack.Stream, "seq", res.ack.Sequence, "duplicate", res.dup)
	} else {
		s.log.Debug("publish refused", "subject", subj, "status", res.status, "outcome", res.outcome, "reason", res.msg)
	}
}

// handle decides a request, in the order its checks cost: who may publish
// (admit), the subject, a slot, the body, the headers, then the publish,
// which must be acknowledged by deadline (the request's arrival and
// Options.Timeout).
func (s *Server) handle(r *http.Request, subj string, deadline time.Time) result {
	if res := s.admit(r); res != nil {
		return *res
	}
	if subj == "" {
		return fail(refuse(http.StatusBadRequest, outcomeInvalid, "no subject: publish with POST %s<subject>", PathPrefix))
	}
	if err := s.allowed(subj); err != nil {
		return fail(err)
	}
	if !s.acquire(1, nil) {
		return *s.busy()
	}
	defer s.release(1)

	if err := s.waitConnected(r.Context(), deadline); err != nil {
		return s.timedOut(r.Context(), err)
	}
	maxPayload := s.nc.MaxPayload()
	data, err := readBody(r, maxPayload)
	if err != nil {
		return fail(err)
	}
	h, generated, err := messageHeaders(r.Header)
	if err != nil {
		return fail(err)
	}
	at, delayed, err := takeDelay(h, time.Now())
	if err != nil {
		return fail(err)
	}
	m := &nats.Msg{Subject: subj, Header: h, Data: data}
	sp := s.startSpan(r.Context(), r.Header, m)
	var res result
	if delayed {
		res = s.publishDelayed(r.Context(), deadline, m, generated, at, maxPayload)
	} else {
		res = s.publishMsg(r.Context(), deadline, m, generated, maxPayload)
	}
	sp.end(res)
	return res
}

// waitConnected waits until Connect has been called, the deadline passes
// or the caller goes away; after Connect it returns at once, with no timer.
func (s *Server) waitConnected(reqCtx context.Context, deadline time.Time) error {
	select {
	case <-s.connected:
		return nil
	default:
	}
	ctx, cancel := context.WithDeadline(reqCtx, deadline)
	defer cancel()
	select {
	case <-s.connected:
		return nil
	case <-ctx.Done():
		return errNotConnected
	}
}

// allowed checks the subject: a valid literal (400), outside NATS's own
// subjects and matched by one of Options.Subjects (403).
func (s *Server) allowed(subj string) error {
	if !plainLiteral(subj) {
		if err := subject.CheckLiteral(subj); err != nil {
			return refuse(http.StatusBadRequest, outcomeInvalid, "%s", err.Error())
		}
	}
	// NATS's own subjects (its API, key-value and object stores, system
	// account, inboxes) are never published to through courier, whatever
	// Options.Subjects allows.
	if p := subject.Reserved(subj); p != "" {
		return refuse(http.StatusForbidden, outcomeForbidden, "subject %q: subjects starting with %s are reserved by NATS", subj, p)
	}
	// Where delayed messages wait: a message stored there directly would
	// pose as one.
	if subject.Matches(s.o.SchedulePrefix+".>", subj) {
		return refuse(http.StatusForbidden, outcomeForbidden, "subject %q: subjects starting with %s. are where delayed messages wait (COURIER_SCHEDULE_PREFIX); publish to the message's own subject with %s or %s",
			subj, s.o.SchedulePrefix, schedule.HeaderDelay, schedule.HeaderDeliverAt)
	}
	for _, f := range s.o.Subjects {
		if subject.Matches(f, subj) {
			return nil
		}
	}
	return refuse(http.StatusForbidden, outcomeForbidden, "subject %q is not among the subjects the app may publish to (COURIER_PUBLISH_SUBJECTS)", subj)
}

// plainLiteral reports, in one pass and without allocating, whether subj
// is a literal subject of printable ASCII: tokens of '!' to '~' but for the
// wildcards, none empty. subject.CheckLiteral accepts every such subject;
// the others (UTF-8 tokens among them) it decides itself.
func plainLiteral(subj string) bool {
	if subj == "" || subj[0] == '.' || subj[len(subj)-1] == '.' {
		return false
	}
	for i := 0; i < len(subj); i++ {
		switch c := subj[i]; {
		case c <= ' ' || c > '~', c == '*', c == '>':
			return false
		case c == '.' && subj[i-1] == '.':
			return false
		}
	}
	return true
}

// answer writes the result as JSON: {"stream","seq","duplicate"} on
// success, {"error"} otherwise, with Retry-After on a 503 and the scheme on
// a 401. net/http sends it with its Content-Length in one write, as it
// fits in the connection's buffer and nothing flushes it early.
func (s *Server) answer(w http.ResponseWriter, res result) {
	h := w.Header()
	h["Content-Type"] = s.hdr.contentType
	h["Cache-Control"] = s.hdr.cacheControl
	if res.status == http.StatusOK {
		w.WriteHeader(res.status)
		_, _ = w.Write(appendAck(make([]byte, 0, 96), res.ack, res.dup))
		return
	}
	if res.sched != nil {
		w.WriteHeader(res.status)
		_ = json.NewEncoder(w).Encode(scheduledAnswer(res))
		return
	}
	switch res.status {
	case http.StatusServiceUnavailable:
		h["Retry-After"] = s.hdr.retryAfter
	case http.StatusUnauthorized:
		h["Www-Authenticate"] = s.hdr.wwwAuthenticate
	}
	w.WriteHeader(res.status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // a command the answer names is copied as it is: orders.> not orders.\u003e
	_ = enc.Encode(errorBody{res.msg})
}

// answerHeaders are the values answer sets, made once per Server: net/http
// copies the handler's headers when it writes them (response.WriteHeader
// clones them), so sharing the slices is safe.
type answerHeaders struct {
	contentType, cacheControl, retryAfter, wwwAuthenticate []string
}

func newAnswerHeaders(retryAfter time.Duration) answerHeaders {
	return answerHeaders{
		contentType:     []string{"application/json"},
		cacheControl:    []string{"no-store"},
		retryAfter:      []string{strconv.Itoa(int((retryAfter + time.Second - 1) / time.Second))},
		wwwAuthenticate: []string{`Bearer realm="courier"`},
	}
}

// appendAck appends the success answer as encoding/json's Encoder writes
// it, newline included, without reflection: the stream name is copied as
// it is when it needs no escaping (JetStream's names rarely do), else
// encoded by encoding/json.
func appendAck(b []byte, ack *jetstream.PubAck, dup bool) []byte {
	b = append(b, `{"stream":`...)
	if jsonPlain(ack.Stream) {
		b = append(b, '"')
		b = append(b, ack.Stream...)
		b = append(b, '"')
	} else {
		name, _ := json.Marshal(ack.Stream)
		b = append(b, name...)
	}
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, ack.Sequence, 10)
	b = append(b, `,"duplicate":`...)
	b = strconv.AppendBool(b, dup)
	return append(b, "}\n"...)
}

// jsonPlain reports whether encoding/json writes s as it is between quotes:
// printable ASCII but for the quote, the backslash and the three it escapes
// for HTML (<, >, &).
func jsonPlain(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

type errorBody struct {
	Error string `json:"error"`
}
