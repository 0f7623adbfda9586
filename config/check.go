package config

import (
	"net"
	"strings"
	"time"

	"github.com/courierhq/courier/internal/appurl"
	"github.com/courierhq/courier/internal/orderkey"
	"github.com/courierhq/courier/internal/subject"
)

// check runs every check of cfg, a group of variables each; the checks of
// the NATS connection are in check_nats.go, what they report through in
// checker.go.
func (c *checker) check(cfg *Config) {
	c.checkNATS(cfg)
	c.checkConsumer(cfg)
	c.checkApp(cfg)
	c.checkRetries(cfg)
	c.checkDLQ(cfg)
	c.checkDedup(cfg)
	c.checkBreaker(cfg)
	c.checkBatch(cfg)
	c.checkOrder(cfg)
	c.checkSuccess(cfg)
	c.checkReplies(cfg)
	c.checkStandards(cfg)
	c.checkPublish(cfg)
	c.checkSchedulePrefix(cfg)
	c.checkOperations(cfg)
	c.checkTracing(cfg)
}

func (c *checker) checkConsumer(cfg *Config) {
	if cfg.Stream == "" {
		switch {
		case c.scope == scopeSubscription:
			c.note("COURIER_STREAM", "COURIER_STREAM is required: the name of the stream this subscription consumes (it must exist; courier does not create it)")
		case len(cfg.ReplySubjects) == 0:
			c.note("COURIER_STREAM", "COURIER_STREAM is required: the name of the stream to consume (it must exist; courier does not create it); only a courier that just serves COURIER_REPLY_SUBJECTS goes without")
		}
	} else if msg := checkName(cfg.Stream); msg != "" {
		c.add("COURIER_STREAM", "%s", msg)
	}
	if msg := checkName(cfg.Consumer); msg != "" {
		c.add("COURIER_CONSUMER", "%s", msg)
	}

	var filters []string
	for _, s := range cfg.Subjects {
		if msg := checkSubject(s); msg != "" {
			c.add("COURIER_SUBJECTS", "%q %s", s, msg)
			continue
		}
		filters = append(filters, s)
	}
	for i, a := range filters {
		for _, b := range filters[i+1:] {
			if subjectsCollide(a, b) {
				c.add("COURIER_SUBJECTS", "filter subjects %q and %q overlap, which JetStream refuses for one consumer", a, b)
			}
		}
	}

	if cfg.DeliverPolicy != "all" && cfg.DeliverPolicy != "new" {
		c.add("COURIER_DELIVER_POLICY", "expected all or new")
	}
	if c.ok("COURIER_MAX_DELIVER") && cfg.MaxDeliver < 1 {
		c.add("COURIER_MAX_DELIVER", "must be at least 1 (the first delivery counts)")
	}
	if c.ok("COURIER_ACK_WAIT") && cfg.AckWait < time.Second {
		c.add("COURIER_ACK_WAIT", "must be at least 1s: JetStream's ack wait is not meant for less")
	}
	if !c.ok("COURIER_MAX_ACK_PENDING") {
		return
	}
	if c.ok(inflightVar) && cfg.MaxInflight >= 1 {
		if cfg.MaxAckPending < cfg.MaxInflight {
			c.add("COURIER_MAX_ACK_PENDING",
				"must be at least COURIER_MAX_INFLIGHT (%s), and should be far larger: messages waiting out a backoff count toward it, so a small limit stalls fresh messages",
				cfg.inflightString())
		}
	} else if cfg.MaxAckPending < 1 {
		c.add("COURIER_MAX_ACK_PENDING", "must be at least 1, and far larger than COURIER_MAX_INFLIGHT")
	}
}

func (c *checker) checkApp(cfg *Config) {
	switch {
	case cfg.AppURL == "" && (c.scope == scopeSubscription || cfg.Stream != "" || len(cfg.ReplySubjects) == 0):
		c.note("COURIER_APP_URL", "COURIER_APP_URL is required: the URL each message is POSTed to, such as http://127.0.0.1:8080/messages")
	case cfg.AppURL != "":
		c.checkHTTPURL("COURIER_APP_URL", cfg.AppURL)
	}
	if cfg.AppHealthURL != "" {
		c.checkHTTPURL("COURIER_APP_HEALTH_URL", cfg.AppHealthURL)
	}
	if c.ok("COURIER_HTTP_TIMEOUT") && cfg.HTTPTimeout <= 0 {
		c.add("COURIER_HTTP_TIMEOUT", "must be more than 0")
	}
	c.checkRoutes(cfg)
}

func (c *checker) checkHTTPURL(name, v string) {
	if _, err := appurl.Parse(v); err != nil {
		c.add(name, "%s", err.Error())
	}
}

func (c *checker) checkRetries(cfg *Config) {
	initialOK := c.ok("COURIER_BACKOFF_INITIAL") && cfg.BackoffInitial > 0
	if c.ok("COURIER_BACKOFF_INITIAL") && !initialOK {
		c.add("COURIER_BACKOFF_INITIAL", "must be more than 0")
	}
	if c.ok("COURIER_BACKOFF_MAX") {
		switch {
		case initialOK && cfg.BackoffMax < cfg.BackoffInitial:
			c.add("COURIER_BACKOFF_MAX", "must be at least COURIER_BACKOFF_INITIAL (%s)", formatDuration(cfg.BackoffInitial))
		case cfg.BackoffMax <= 0:
			c.add("COURIER_BACKOFF_MAX", "must be more than 0")
		}
	}
	if c.ok("COURIER_BACKOFF_MULTIPLIER") && cfg.BackoffMultiplier < 1 {
		c.add("COURIER_BACKOFF_MULTIPLIER", "must be at least 1 (1 keeps the delay constant)")
	}
	if c.ok("COURIER_RETRY_AFTER_MAX") && cfg.RetryAfterMax <= 0 {
		c.add("COURIER_RETRY_AFTER_MAX", "must be more than 0")
	}
	if c.ok("COURIER_MAX_AGE") && cfg.MaxAge < 0 {
		c.add("COURIER_MAX_AGE", "must not be negative (0 means no limit)")
	}
}

// checkPublishSubject checks a subject courier publishes to with a
// JetStream acknowledgement (dead letters, success records): literal, not
// reserved, and not consumed by courier itself. It reports whether the
// subject is valid.
func (c *checker) checkPublishSubject(cfg *Config, name, subject, what string) bool {
	if msg := checkSubject(subject); msg != "" {
		c.add(name, "%s", msg)
		return false
	}
	if !isLiteral(subject) {
		c.add(name, "must be a literal subject, without '*' or '>': %s are published to it", what)
		return false
	}
	if p := reservedPrefix(subject); p != "" {
		c.add(name, "subjects starting with %s are reserved by NATS", p)
		return false
	}
	for _, f := range cfg.Subjects {
		if checkSubject(f) == "" && natsSubjectMatches(f, subject) {
			c.add(name, "matched by the filter subject %q of COURIER_SUBJECTS, so courier would consume its own %s: choose a subject outside the consumed ones", f, what)
		}
	}
	return true
}

func (c *checker) checkDLQ(cfg *Config) {
	const name = "COURIER_DLQ_SUBJECT"
	if cfg.DLQSubject == "" {
		if cfg.Stream == "" || checkName(cfg.Stream) != "" || checkName(cfg.Consumer) != "" {
			return // the default cannot be made; the names' problems say why
		}
		cfg.DLQSubject = "dlq." + cfg.Stream + "." + cfg.Consumer
		c.derived[name] = cfg.DLQSubject
	}
	c.checkPublishSubject(cfg, name, cfg.DLQSubject, "dead letters")
}

func (c *checker) checkDedup(cfg *Config) {
	if c.ok("COURIER_STREAM_REPLICAS") && (cfg.StreamReplicas < 1 || cfg.StreamReplicas > 5) {
		c.add("COURIER_STREAM_REPLICAS", "must be between 1 and 5")
	}
	if !isToken(cfg.IdempotencyHeader) {
		c.add("COURIER_IDEMPOTENCY_HEADER", "not a valid HTTP header name: letters, digits and !#$%%&'*+-.^_`|~ only")
	}
	if c.ok("COURIER_DEDUP_TTL") {
		switch {
		case cfg.DedupTTL < 0:
			c.add("COURIER_DEDUP_TTL", "must not be negative (0 turns dedup off)")
		case cfg.DedupTTL > 0 && cfg.DedupTTL < time.Second:
			c.add("COURIER_DEDUP_TTL", "must be at least 1s, as the store keeps time in whole seconds (0 turns dedup off)")
		}
	}
	switch cfg.DedupStore {
	case DedupBadger, DedupShared:
	case "kv":
		// The name before shared; Warnings says so.
		cfg.DedupStore = DedupShared
	default:
		c.add("COURIER_DEDUP_STORE", "must be badger (embedded, this courier's keys) or shared (a key-value bucket shared by every courier of the durable)")
	}
	if !validBucket(cfg.DedupBucket) {
		c.add("COURIER_DEDUP_BUCKET", "not a valid key-value bucket name: letters, digits, - and _ only")
	}
}

func (c *checker) checkBreaker(cfg *Config) {
	if c.ok("COURIER_BREAKER_FAILURES") && cfg.BreakerFailures < 0 {
		c.add("COURIER_BREAKER_FAILURES", "must not be negative (0 turns the breaker off)")
	}
	if c.ok("COURIER_BREAKER_PROBE") && cfg.BreakerProbe <= 0 {
		c.add("COURIER_BREAKER_PROBE", "must be more than 0")
	}
	if c.ok("COURIER_BREAKER_PROBE_MAX") && cfg.BreakerProbeMax <= 0 {
		c.add("COURIER_BREAKER_PROBE_MAX", "must be more than 0")
	}
	if c.ok("COURIER_MAX_RATE") && cfg.MaxRate < 0 {
		c.add("COURIER_MAX_RATE", "must not be negative (0 means no limit)")
	}
}

// maxBatch bounds COURIER_BATCH_MAX: each entry is a message held in
// progress while its batch runs, MaxInflight×BatchMax of them at most.
const maxBatch = 1000

// minBatchWait is the least COURIER_BATCH_WAIT: a batch that does not wait
// at all goes with its first entry alone.
const minBatchWait = time.Microsecond

// maxBatchPlaces bounds MaxInflight×BatchMax, the messages batches may hold
// at once: courier's fetch queue has room for that many from the start.
const maxBatchPlaces = 100000

// maxPartitions bounds COURIER_ORDER_PARTITIONS: each partition is a
// durable consumer (a replicated group of its own on a cluster).
const maxPartitions = 128

func (c *checker) checkOrder(cfg *Config) {
	const parts = "COURIER_ORDER_PARTITIONS"
	if cfg.OrderKey != "" {
		if _, err := orderkey.Parse(cfg.OrderKey); err != nil {
			c.add("COURIER_ORDER_KEY", "%s", err.Error())
			return
		}
	}
	p := cfg.OrderPartitions
	switch {
	case !c.ok(parts) || p == 0:
		return
	case p < 2 || p > maxPartitions:
		c.add(parts, "must be 0 (one replica at a time delivers the durable) or from 2 to %d", maxPartitions)
		return
	case cfg.OrderKey == "":
		c.add(parts, "needs COURIER_ORDER_KEY=subject:N: partitions split the durable by ordering key")
		return
	}
	token, ok := orderkey.SubjectToken(cfg.OrderKey)
	if !ok {
		c.add(parts, "needs COURIER_ORDER_KEY=subject:N, not %s: the server computes a partition from subject tokens only, never from a header; with a header key leave it at 0 (one replica at a time delivers, the others stand by)", cfg.OrderKey)
		return
	}
	if len(cfg.Subjects) > 0 && c.ok("COURIER_SUBJECTS") {
		if _, err := subject.PartitionTransforms(cfg.Subjects, token, p); err != nil {
			c.add(parts, "COURIER_SUBJECTS cannot be partitioned by COURIER_ORDER_KEY=%s: %v", cfg.OrderKey, err)
		}
	}
}

func (c *checker) checkBatch(cfg *Config) {
	if c.ok("COURIER_BATCH_MAX") && (cfg.BatchMax < 1 || cfg.BatchMax > maxBatch) {
		c.add("COURIER_BATCH_MAX", "must be from 1 (one message per request) to %d", maxBatch)
	} else if c.ok("COURIER_BATCH_MAX", inflightVar) && cfg.BatchMax > 1 && cfg.MaxInflight*cfg.BatchMax > maxBatchPlaces {
		c.add("COURIER_BATCH_MAX",
			"times COURIER_MAX_INFLIGHT (%s) is %d messages in batches at once, more than the %d courier holds: lower one of them",
			cfg.inflightString(), cfg.MaxInflight*cfg.BatchMax, maxBatchPlaces)
	}
	if c.ok("COURIER_BATCH_WAIT") && (cfg.BatchWait < minBatchWait || cfg.BatchWait > time.Minute) {
		c.add("COURIER_BATCH_WAIT", "must be from 1µs to 1m: a batch waits that long after its first entry for more (0 would send every entry in a request of its own)")
	}
	if c.ok("COURIER_BATCH_BYTES") && cfg.BatchBytes < 1024 {
		c.add("COURIER_BATCH_BYTES", "must be at least 1024")
	}
}

func (c *checker) checkSuccess(cfg *Config) {
	const name = "COURIER_SUCCESS_SUBJECT"
	if cfg.SuccessSubject == "" {
		return
	}
	if !c.checkPublishSubject(cfg, name, cfg.SuccessSubject, "success records") {
		return
	}
	if cfg.SuccessSubject == cfg.DLQSubject {
		c.add(name, "is also COURIER_DLQ_SUBJECT: success records and dead letters need subjects of their own")
	}
	if cfg.Stream == "" {
		c.add(name, "is set but COURIER_STREAM is not: success records are published for consumed messages only")
	}
}

func (c *checker) checkReplies(cfg *Config) {
	const name = "COURIER_REPLY_SUBJECTS"
	var valid []string
	for _, s := range cfg.ReplySubjects {
		if msg := checkSubject(s); msg != "" {
			c.add(name, "%q %s", s, msg)
			continue
		}
		if reserved := reservedPrefix(s); reserved != "" {
			c.add(name, "%q: subjects starting with %s are reserved by NATS", s, reserved)
			continue
		}
		valid = append(valid, s)
	}
	for i, a := range valid {
		for _, b := range valid[i+1:] {
			if subjectsCollide(a, b) {
				c.add(name, "%q and %q overlap: a request matching both would reach the app twice", a, b)
			}
		}
		for _, f := range cfg.Subjects {
			if checkSubject(f) == "" && subjectsCollide(a, f) {
				c.cross(name, "%q overlaps the filter subject %q of COURIER_SUBJECTS: the stream would store such a request too, and its acknowledgement could answer the caller before the app does", a, f)
			}
		}
		// A JetStream publish is a request: courier would answer its own
		// dead letters and success records.
		for _, p := range []struct{ name, subject string }{
			{"COURIER_DLQ_SUBJECT", cfg.DLQSubject}, {"COURIER_SUCCESS_SUBJECT", cfg.SuccessSubject},
		} {
			if p.subject != "" && natsSubjectMatches(a, p.subject) {
				c.cross(name, "%q matches %s (%q): courier would answer its own publishes there", a, p.name, p.subject)
			}
		}
	}

	if cfg.ReplyURL != "" {
		c.checkHTTPURL("COURIER_REPLY_URL", cfg.ReplyURL)
	} else if len(cfg.ReplySubjects) > 0 && cfg.AppURL == "" {
		c.note("COURIER_REPLY_URL", "COURIER_REPLY_URL (or COURIER_APP_URL) is required with COURIER_REPLY_SUBJECTS: the URL requests are POSTed to")
	}
	if cfg.ReplyMaxWaiting < 0 {
		c.add("COURIER_REPLY_MAX_WAITING", "must be at least 1 (or unset: 64 × COURIER_MAX_INFLIGHT)")
	}
	if cfg.ReplyURL == "" && len(cfg.ReplySubjects) > 0 && cfg.AppURL != "" {
		cfg.ReplyURL = cfg.AppURL
		c.derived["COURIER_REPLY_URL"] = redactHTTPURL(cfg.AppURL)
	}
}

// checkSchedulePrefix checks where delayed publishes wait: literal tokens,
// outside what NATS reserves and what courier publishes to itself.
func (c *checker) checkSchedulePrefix(cfg *Config) {
	const name = "COURIER_SCHEDULE_PREFIX"
	p := cfg.SchedulePrefix
	switch {
	case p == "":
		c.add(name, "must not be empty (unset: _sched)")
		return
	case checkSubject(p) != "":
		c.add(name, "%s", checkSubject(p))
		return
	case !isLiteral(p):
		c.add(name, "must be literal subject tokens, such as _sched: '*' and '>' are wildcards")
		return
	case reservedPrefix(p+".") != "":
		c.add(name, "subjects starting with %s are reserved by NATS", reservedPrefix(p+"."))
		return
	}
	all := p + ".>"
	for _, own := range []struct{ name, subject string }{{"COURIER_DLQ_SUBJECT", cfg.DLQSubject}, {"COURIER_SUCCESS_SUBJECT", cfg.SuccessSubject}} {
		if own.subject != "" && natsSubjectMatches(all, own.subject) {
			c.add(name, "%s %q is under it: delayed messages wait there, and the durables courier sets up leave it out", own.name, own.subject)
		}
	}
}

// checkPublish checks the publish API's address and subjects.
func (c *checker) checkPublish(cfg *Config) {
	const addr, subjects = "COURIER_PUBLISH_ADDR", "COURIER_PUBLISH_SUBJECTS"
	if cfg.PublishAddr == "" {
		if len(cfg.PublishSubjects) > 0 {
			c.add(subjects, "is set but COURIER_PUBLISH_ADDR is not: the publish API is off; set COURIER_PUBLISH_ADDR (such as :7416) to turn it on")
		}
		return
	}
	_, port, err := net.SplitHostPort(cfg.PublishAddr)
	switch {
	case err != nil || port == "":
		c.add(addr, "not a listen address: expected :port (on %s) or host:port, such as :7416 or 0.0.0.0:7416", DefaultPublishHost)
	case port != "0":
		if _, adminPort, err := net.SplitHostPort(cfg.AdminAddr); err == nil && adminPort == port {
			c.add(addr, "the same port as COURIER_ADMIN_ADDR (%s): choose another, such as 7416", cfg.AdminAddr)
		}
	}
	if len(cfg.PublishSubjects) == 0 {
		c.note(subjects, subjects+" is required with COURIER_PUBLISH_ADDR: the subjects the app may publish to, NATS wildcards allowed, such as orders.>")
	}
	for _, s := range cfg.PublishSubjects {
		if msg := checkSubject(s); msg != "" {
			c.add(subjects, "%q %s", s, msg)
		} else if p := reservedPrefix(s); p != "" {
			c.add(subjects, "%q: subjects starting with %s are reserved by NATS", s, p)
		}
	}
}

// validBucket reports whether s is a JetStream key-value bucket name.
func validBucket(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

func (c *checker) checkOperations(cfg *Config) {
	if _, port, err := net.SplitHostPort(cfg.AdminAddr); err != nil || port == "" {
		c.add("COURIER_ADMIN_ADDR", "not a listen address: expected host:port, such as :7415 or 127.0.0.1:7415")
	}
	switch cfg.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		c.add("COURIER_LOG_LEVEL", "expected debug, info, warn or error")
	}
	switch cfg.LogFormat {
	case "", "text", "json":
	default:
		c.add("COURIER_LOG_FORMAT", "expected text or json (unset: text on a terminal, else json)")
	}
	if c.ok("COURIER_SHUTDOWN_GRACE") && cfg.ShutdownGrace < 0 {
		c.add("COURIER_SHUTDOWN_GRACE", "must not be negative")
	}
}

// isToken reports whether s is an HTTP token (RFC 9110), as a header name
// must be.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		b := s[i]
		switch {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0:
		default:
			return false
		}
	}
	return true
}
