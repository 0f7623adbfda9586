package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/natstest"
)

// letter returns a dead letter whose original carries headers that would act
// on the DLQ stream if copied verbatim.
func letter() dlq.Letter {
	return dlq.Letter{
		Subject: "orders.created",
		Data:    []byte("{\"id\":42}\x00binary\r\n"),
		Header: nats.Header{
			"Content-Type":                {"application/json"},
			"X-Trace":                     {"a", "b"},
			"Nats-Msg-Id":                 {"order-42"},
			"Nats-Expected-Last-Sequence": {"999"},
			"Nats-Expected-Stream":        {"ORDERS"},
			"Nats-TTL":                    {"1s"},
			"Nats-Rollup":                 {"all"},
			"nats-msg-id":                 {"lower-case"},
			"Courier-Reason":              {"theirs"},
		},
		Stream:        "ORDERS",
		StreamCreated: time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC),
		Sequence:      7,
		Published:     time.Date(2025, 2, 3, 4, 5, 6, 7, time.FixedZone("X", 3600)),
		Consumer:      "courier",
		Reason:        dlq.ReasonRejected,
		Status:        422,
		Error:         "unprocessable",
		Attempts:      3,
		FailedAt:      time.Date(2025, 2, 3, 4, 5, 7, 123456789, time.UTC),
	}
}

func TestEnvelope(t *testing.T) {
	l := letter()
	before := maps.Clone(l.Header)
	h := dlq.Envelope(l)

	want := map[string][]string{
		"Content-Type":                 {"application/json"},
		"X-Trace":                      {"a", "b"},
		"Courier-Original-Nats-Msg-Id": {"order-42"},
		"Courier-Original-Nats-Expected-Last-Sequence": {"999"},
		"Courier-Original-Nats-Expected-Stream":        {"ORDERS"},
		"Courier-Original-Nats-TTL":                    {"1s"},
		"Courier-Original-Nats-Rollup":                 {"all"},
		"Courier-Original-nats-msg-id":                 {"lower-case"},
		"Courier-Original-Courier-Reason":              {"theirs"},
		dlq.HeaderReason:                               {"rejected"},
		dlq.HeaderStatus:                               {"422"},
		dlq.HeaderError:                                {"unprocessable"},
		dlq.HeaderAttempts:                             {"3"},
		dlq.HeaderSubject:                              {"orders.created"},
		dlq.HeaderStream:                               {"ORDERS"},
		dlq.HeaderStreamCreated:                        {"2025-01-02T03:04:05.000000006Z"},
		dlq.HeaderSequence:                             {"7"},
		dlq.HeaderConsumer:                             {"courier"},
		dlq.HeaderFailedAt:                             {"2025-02-03T04:05:07.123456789Z"},
		dlq.HeaderPublished:                            {"2025-02-03T03:05:06.000000007Z"},
		"Nats-Msg-Id":                                  {dlq.MsgID(l)},
	}
	if len(h) != len(want) {
		t.Errorf("envelope has %d headers, want %d: %v", len(h), len(want), slices.Sorted(maps.Keys(h)))
	}
	for name, values := range want {
		if !slices.Equal(h[name], values) {
			t.Errorf("%s = %q, want %q", name, h[name], values)
		}
	}
	if !maps.EqualFunc(l.Header, before, slices.Equal) {
		t.Errorf("Envelope modified the letter's headers: %v", l.Header)
	}
	if got := dlq.Original(h); !maps.EqualFunc(got, l.Header, slices.Equal) {
		t.Errorf("Original(Envelope(l)) = %v, want %v", got, l.Header)
	}
}

// The dead letter of a message a rewind delivered again names the rewind.
func TestEnvelopeOfAReplay(t *testing.T) {
	l := letter()
	l.Replay = "20261201T101500Z-3f2a"
	if got := dlq.Envelope(l).Get(dlq.HeaderReplay); got != l.Replay {
		t.Errorf("%s = %q, want %q", dlq.HeaderReplay, got, l.Replay)
	}
}

func TestEnvelopeOmitsEmpty(t *testing.T) {
	h := dlq.Envelope(dlq.Letter{Stream: "S", Consumer: "c", Sequence: 1})
	for _, name := range []string{dlq.HeaderStatus, dlq.HeaderError, dlq.HeaderFailedAt, dlq.HeaderPublished,
		dlq.HeaderStreamCreated, dlq.HeaderSubjectBase64, dlq.HeaderBody, dlq.HeaderBodySize, dlq.HeaderHeaders, dlq.HeaderReplay} {
		if v, ok := h[name]; ok {
			t.Errorf("%s = %q, want it absent", name, v)
		}
	}
	if got := h.Get(dlq.HeaderReason); got != "unknown" {
		t.Errorf("%s = %q, want unknown", dlq.HeaderReason, got)
	}
}

func TestEnvelopeError(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"plain", "boom", "boom"},
		{"newlines", "line one\r\nline two\n", "line one  line two"},
		{"control", "a\x00b\tc\x7fd", "a b c d"},
		{"invalid utf8", "bad\xffbyte", "bad\uFFFDbyte"},
		{"bidirectional override", "ok \u202ekcatta", "ok  kcatta"},
		{"exactly the limit", strings.Repeat("x", dlq.MaxErrorLen), strings.Repeat("x", dlq.MaxErrorLen)},
		{"long ascii", strings.Repeat("x", 5000), strings.Repeat("x", dlq.MaxErrorLen-3) + "..."},
		// "é" is 2 bytes, "€" 3: the cut must fall between runes.
		{"long two-byte", strings.Repeat("é", 1000), strings.Repeat("é", (dlq.MaxErrorLen-3)/2) + "..."},
		{"long three-byte", strings.Repeat("€", 1000), strings.Repeat("€", (dlq.MaxErrorLen-3)/3) + "..."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := dlq.Envelope(dlq.Letter{Error: tt.in}).Get(dlq.HeaderError)
			if got != tt.want {
				t.Errorf("Courier-Error = %q (%d bytes), want %q (%d bytes)", got, len(got), tt.want, len(tt.want))
			}
			if len(got) > dlq.MaxErrorLen || !utf8.ValidString(got) || strings.ContainsFunc(got, func(r rune) bool { return !unicode.IsPrint(r) }) {
				t.Errorf("Courier-Error is not a bounded, valid header value: %q", got)
			}
		})
	}
}

func TestMsgID(t *testing.T) {
	base := letter()
	id := dlq.MsgID(base)
	if want := "courier-dlq:courier:ORDERS:" + fmt.Sprint(base.StreamCreated.UnixNano()) + ":7"; id != want {
		t.Errorf("MsgID = %q, want %q", id, want)
	}
	same := base
	same.Reason, same.Attempts, same.FailedAt, same.Error = dlq.ReasonMaxDeliveries, 9, time.Now(), "other"
	if got := dlq.MsgID(same); got != id {
		t.Errorf("MsgID of the same original, failed differently = %q, want %q", got, id)
	}
	for name, change := range map[string]func(*dlq.Letter){
		"consumer":       func(l *dlq.Letter) { l.Consumer = "other" },
		"stream":         func(l *dlq.Letter) { l.Stream = "OTHER" },
		"stream created": func(l *dlq.Letter) { l.StreamCreated = l.StreamCreated.Add(time.Second) },
		"sequence":       func(l *dlq.Letter) { l.Sequence++ },
	} {
		l := base
		change(&l)
		if dlq.MsgID(l) == id {
			t.Errorf("MsgID ignores the %s", name)
		}
	}
}

func TestStreamName(t *testing.T) {
	if got, want := dlq.StreamName("dlq.orders-v2.*.>"), "COURIER_DLQ_ORDERS-V2____"; got != want {
		t.Errorf("StreamName = %q, want %q", got, want)
	}
	long := strings.Repeat("segment.", 20)
	a, b := dlq.StreamName(long+"a"), dlq.StreamName(long+"b")
	if len(a) > 64 || len(b) > 64 || a == b {
		t.Errorf("StreamName of long subjects = %q, %q: want distinct names of at most 64 characters", a, b)
	}
}

func TestCheckStream(t *testing.T) {
	good := dlq.StreamConfig("dlq.x", 1)
	tests := []struct {
		name    string
		change  func(*jetstream.StreamConfig)
		refused string // in the error; empty: accepted
		warning string // in the warnings; empty: none
	}{
		{name: "created config"},
		{name: "interest", change: func(c *jetstream.StreamConfig) { c.Retention = jetstream.InterestPolicy }, refused: "interest retention"},
		{name: "memory", change: func(c *jetstream.StreamConfig) { c.Storage = jetstream.MemoryStorage }, refused: "memory storage"},
		{name: "no ack", change: func(c *jetstream.StreamConfig) { c.NoAck = true }, refused: "no_ack"},
		{name: "sealed", change: func(c *jetstream.StreamConfig) { c.Sealed = true }, refused: "sealed"},
		{name: "work queue", change: func(c *jetstream.StreamConfig) { c.Retention = jetstream.WorkQueuePolicy }, warning: "work-queue"},
		{name: "max age", change: func(c *jetstream.StreamConfig) { c.MaxAge = time.Hour }, warning: "max_age 1h0m0s"},
		{name: "max msgs", change: func(c *jetstream.StreamConfig) { c.MaxMsgs = 10 }, warning: "max_msgs 10"},
		{name: "max bytes", change: func(c *jetstream.StreamConfig) { c.MaxBytes = 1 << 20 }, warning: "max_bytes 1048576"},
		{name: "max msgs per subject", change: func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = 5 }, warning: "max_msgs_per_subject 5"},
		{name: "discard new", change: func(c *jetstream.StreamConfig) { c.MaxMsgs, c.Discard = 10, jetstream.DiscardNew }, warning: "discard new"},
		{name: "max msg size", change: func(c *jetstream.StreamConfig) { c.MaxMsgSize = 1024 }, warning: "max_msg_size 1024"},
		{name: "short duplicates", change: func(c *jetstream.StreamConfig) { c.Duplicates = 30 * time.Second }, warning: "duplicate window of 30s"},
		{name: "deny delete", change: func(c *jetstream.StreamConfig) { c.DenyDelete = true }, warning: "deny_delete"},
		{name: "deny purge", change: func(c *jetstream.StreamConfig) { c.DenyPurge = true }, warning: "deny_purge"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			if tt.change != nil {
				tt.change(&cfg)
			}
			warnings, err := dlq.CheckStream(cfg)
			switch {
			case tt.refused == "" && err != nil:
				t.Errorf("CheckStream: %v", err)
			case tt.refused != "" && (!errors.Is(err, dlq.ErrUnsuitableStream) || !strings.Contains(err.Error(), tt.refused) || !strings.Contains(err.Error(), cfg.Name)):
				t.Errorf("CheckStream error = %v, want ErrUnsuitableStream naming %q and %q", err, cfg.Name, tt.refused)
			}
			if tt.warning == "" {
				if len(warnings) > 0 {
					t.Errorf("warnings = %q, want none", warnings)
				}
				return
			}
			if len(warnings) != 1 || !strings.Contains(warnings[0], tt.warning) || !strings.Contains(warnings[0], cfg.Name) {
				t.Errorf("warnings = %q, want one naming %q and %q", warnings, cfg.Name, tt.warning)
			}
		})
	}
}

// ctx returns a context that ends with the test, or after d.
func ctx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return c
}

// createStream creates a stream for a test to find, failing the test if it
// cannot.
func createStream(t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) {
	t.Helper()
	if _, err := js.CreateStream(ctx(t, 5*time.Second), cfg); err != nil {
		t.Fatalf("create stream %s: %v", cfg.Name, err)
	}
}

// ensure runs EnsureStream and fails the test on error.
func ensure(t *testing.T, js jetstream.JetStream, subject string) *jetstream.StreamInfo {
	t.Helper()
	info, _, err := dlq.EnsureStream(ctx(t, 5*time.Second), js, subject, 1)
	if err != nil {
		t.Fatalf("EnsureStream(%q): %v", subject, err)
	}
	return info
}

// connectAs connects to s as user, swallowing the asynchronous errors (the
// permissions violations the tests provoke) that nats.go would print.
func connectAs(t *testing.T, s *server.Server, user string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(user, "pw"),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

func TestEnsureStreamCreates(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	const subject = "dlq.ORDERS.courier"

	info, created, err := dlq.EnsureStream(ctx(t, 5*time.Second), js, subject, 1)
	if err != nil || !created {
		t.Fatalf("EnsureStream = created %v, %v; want created", created, err)
	}
	c := info.Config
	if c.Name != dlq.StreamName(subject) || !slices.Equal(c.Subjects, []string{subject}) ||
		c.Storage != jetstream.FileStorage || c.Retention != jetstream.LimitsPolicy ||
		c.Replicas != 1 || c.Discard != jetstream.DiscardOld || c.Duplicates != dlq.DuplicateWindow ||
		!c.AllowDirect || c.MaxAge != 0 || c.MaxMsgs != -1 || c.MaxBytes != -1 || c.MaxMsgsPerSubject != -1 {
		t.Errorf("created stream config = %+v", c)
	}
	if warnings, err := dlq.CheckStream(c); err != nil || len(warnings) > 0 {
		t.Errorf("CheckStream(created) = %q, %v; want neither", warnings, err)
	}

	again, created, err := dlq.EnsureStream(ctx(t, 5*time.Second), js, subject, 1)
	if err != nil || created || again.Config.Name != c.Name {
		t.Errorf("EnsureStream again = %v, created %v, %v; want %s reused", again, created, err, c.Name)
	}
}

// Stream names are upper-cased: the dead letters of consumer courier on
// streams orders and ORDERS would go to one stream name. Each gets a
// stream of its own, capturing its own subject, and keeps it.
func TestEnsureStreamBesideNamesake(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	upper, _, err := dlq.EnsureStream(ctx(t, 5*time.Second), js, "dlq.ORDERS.courier", 1)
	if err != nil {
		t.Fatal(err)
	}
	lower, created, err := dlq.EnsureStream(ctx(t, 5*time.Second), js, "dlq.orders.courier", 1)
	if err != nil || !created {
		t.Fatalf("EnsureStream beside its namesake = created %v, %v; want a stream of its own", created, err)
	}
	if lower.Config.Name == upper.Config.Name || !slices.Equal(lower.Config.Subjects, []string{"dlq.orders.courier"}) ||
		!slices.Equal(upper.Config.Subjects, []string{"dlq.ORDERS.courier"}) || len(lower.Config.Name) > 64 {
		t.Errorf("streams %s %q and %s %q: want two, each capturing its own subject", upper.Config.Name, upper.Config.Subjects,
			lower.Config.Name, lower.Config.Subjects)
	}
	for subject, name := range map[string]string{"dlq.ORDERS.courier": upper.Config.Name, "dlq.orders.courier": lower.Config.Name} {
		again, created, err := dlq.EnsureStream(ctx(t, 5*time.Second), js, subject, 1)
		if err != nil || created || again.Config.Name != name {
			t.Errorf("EnsureStream(%s) again = created %v, %v; want %s found", subject, created, err, name)
		}
	}
}

func TestEnsureStreamUsesExisting(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	createStream(t, js, jetstream.StreamConfig{Name: "DEAD", Subjects: []string{"dlq.>"}, MaxAge: time.Hour})

	info, created, err := dlq.EnsureStream(ctx(t, 5*time.Second), js, "dlq.ORDERS.courier", 1)
	if err != nil || created || info.Config.Name != "DEAD" {
		t.Fatalf("EnsureStream = %v, created %v, %v; want DEAD, not created", info, created, err)
	}
	warnings, err := dlq.CheckStream(info.Config)
	if err != nil || len(warnings) != 1 || !strings.Contains(warnings[0], "max_age") {
		t.Errorf("CheckStream(DEAD) = %q, %v; want a max_age warning", warnings, err)
	}
}

func TestEnsureStreamRefuses(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	tests := []struct {
		cfg  jetstream.StreamConfig
		want string
	}{
		{jetstream.StreamConfig{Name: "INTEREST", Subjects: []string{"dlq.interest"}, Retention: jetstream.InterestPolicy}, "interest retention"},
		{jetstream.StreamConfig{Name: "MEMORY", Subjects: []string{"dlq.memory"}, Storage: jetstream.MemoryStorage}, "memory storage"},
		{jetstream.StreamConfig{Name: "NOACK", Subjects: []string{"dlq.noack"}, NoAck: true}, "no_ack"},
	}
	for _, tt := range tests {
		t.Run(tt.cfg.Name, func(t *testing.T) {
			createStream(t, js, tt.cfg)
			info, created, err := dlq.EnsureStream(ctx(t, 5*time.Second), js, tt.cfg.Subjects[0], 1)
			if !errors.Is(err, dlq.ErrUnsuitableStream) || info != nil || created {
				t.Fatalf("EnsureStream = %v, created %v, %v; want ErrUnsuitableStream", info, created, err)
			}
			if msg := err.Error(); !strings.Contains(msg, `"`+tt.cfg.Name+`"`) || !strings.Contains(msg, tt.want) {
				t.Errorf("error %q does not name stream %s and %q", msg, tt.cfg.Name, tt.want)
			}
		})
	}
}

func TestEnsureStreamRejectsWildcard(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	for _, subject := range []string{"", "dlq.*", "dlq.>", "dlq..x", "dlq x"} {
		if _, _, err := dlq.EnsureStream(ctx(t, 5*time.Second), js, subject, 1); err == nil {
			t.Errorf("EnsureStream(%q) succeeded", subject)
		}
	}
}

func TestEnsureStreamCannotCreate(t *testing.T) {
	const subject = "dlq.ORDERS.courier"
	tests := []struct {
		name      string
		configure func(*server.Options)
		want      string
	}{
		{
			name: "no permission",
			configure: func(o *server.Options) {
				o.Users = []*server.User{{Username: "app", Password: "pw", Permissions: &server.Permissions{
					Publish: &server.SubjectPermission{Allow: []string{"$JS.API.INFO", "$JS.API.STREAM.NAMES"}},
				}}}
			},
			want: "no permission",
		},
		{
			name: "jetstream disabled",
			configure: func(o *server.Options) {
				o.JetStream = false
				o.Users = []*server.User{{Username: "app", Password: "pw"}}
			},
			want: "JetStream is not enabled",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := natstest.Start(t, natstest.Options{Configure: tt.configure})
			_, js := connectAs(t, s, "app")
			// The server drops a denied request: it ends at the deadline.
			_, _, err := dlq.EnsureStream(ctx(t, time.Second), js, subject, 1)
			if !errors.Is(err, dlq.ErrCannotCreateStream) {
				t.Fatalf("EnsureStream: %v; want ErrCannotCreateStream", err)
			}
			for _, want := range []string{tt.want, "nats stream add " + dlq.StreamName(subject), "--storage=file", "--retention=limits", `"duplicate_window":600000000000`} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

func TestPublish(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	const subject = "dlq.ORDERS.courier"
	info := ensure(t, js, subject)
	stream, err := js.Stream(ctx(t, 5*time.Second), info.Config.Name)
	if err != nil {
		t.Fatal(err)
	}
	p := dlq.NewPublisher(js, subject)
	l := letter()

	// Left as they were, the Nats-* headers of the original would fail this
	// publish (expected stream and last sequence, TTL and rollup on a stream
	// that allows neither): renamed, it succeeds.
	ack, err := p.Publish(ctx(t, 5*time.Second), l)
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if ack.Duplicate || ack.Stream != info.Config.Name {
		t.Errorf("ack = %+v, want a first store in %s", ack, info.Config.Name)
	}
	stored, err := stream.GetMsg(ctx(t, 5*time.Second), ack.Sequence)
	if err != nil {
		t.Fatalf("GetMsg: %v", err)
	}
	if string(stored.Data) != string(l.Data) || stored.Subject != subject {
		t.Errorf("stored %q on %s, want %q on %s", stored.Data, stored.Subject, l.Data, subject)
	}
	for name, values := range dlq.Envelope(l) {
		if !slices.Equal(stored.Header.Values(name), values) {
			t.Errorf("stored %s = %q, want %q", name, stored.Header.Values(name), values)
		}
	}
	if got := dlq.Original(stored.Header); !maps.EqualFunc(got, l.Header, slices.Equal) {
		t.Errorf("Original(stored) = %v, want %v", got, l.Header)
	}

	// The same dead letter again, failed later: stored once.
	l.FailedAt = l.FailedAt.Add(time.Minute)
	again, err := p.Publish(ctx(t, 5*time.Second), l)
	if err != nil || !again.Duplicate || again.Sequence != ack.Sequence {
		t.Errorf("second Publish = %+v, %v; want a duplicate of sequence %d", again, err, ack.Sequence)
	}
	if info, err := stream.Info(ctx(t, 5*time.Second)); err != nil || info.State.Msgs != 1 {
		t.Errorf("stream holds %v messages (%v), want 1", info.State.Msgs, err)
	}
}

func TestPublishFillsFailedAt(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	const subject = "dlq.x"
	info := ensure(t, js, subject)
	l := letter()
	l.FailedAt = time.Time{}
	before := time.Now()
	ack, err := dlq.NewPublisher(js, subject).Publish(ctx(t, 5*time.Second), l)
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	stream, err := js.Stream(ctx(t, 5*time.Second), info.Config.Name)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetMsg(ctx(t, 5*time.Second), ack.Sequence)
	if err != nil {
		t.Fatalf("GetMsg: %v", err)
	}
	at, err := time.Parse(time.RFC3339Nano, msg.Header.Get(dlq.HeaderFailedAt))
	if err != nil || at.Before(before.Truncate(time.Second)) {
		t.Errorf("%s = %q (%v), want a time after %v", dlq.HeaderFailedAt, msg.Header.Get(dlq.HeaderFailedAt), err, before)
	}
}

func TestPublishConcurrent(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	const subject, n = "dlq.x", 16
	info := ensure(t, js, subject)
	p := dlq.NewPublisher(js, subject)

	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			l := letter()
			l.Sequence = uint64(i + 1)
			_, err := p.Publish(ctx(t, 5*time.Second), l)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Publish: %v", err)
		}
	}
	stream, err := js.Stream(ctx(t, 5*time.Second), info.Config.Name)
	if err != nil {
		t.Fatal(err)
	}
	if msgs := stream.CachedInfo().State.Msgs; msgs != n {
		t.Errorf("stream holds %d dead letters, want %d", msgs, n)
	}
}

func TestPublishNoStream(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	_, err := dlq.NewPublisher(js, "dlq.nowhere").Publish(ctx(t, 3*time.Second), letter())
	if !errors.Is(err, jetstream.ErrNoStreamResponse) || !strings.Contains(err.Error(), "dlq.nowhere") {
		t.Errorf("Publish = %v; want ErrNoStreamResponse naming the subject", err)
	}
}

func TestPublishPermissionDenied(t *testing.T) {
	s := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "admin", Password: "pw"},
			{Username: "app", Password: "pw", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Deny: []string{"dlq.>"}},
			}},
		}
	}})
	_, admin := connectAs(t, s, "admin")
	ensure(t, admin, "dlq.x")
	_, js := connectAs(t, s, "app")
	// The server drops a denied publish: it ends at the deadline.
	_, err := dlq.NewPublisher(js, "dlq.x").Publish(ctx(t, time.Second), letter())
	if !errors.Is(err, nats.ErrPermissionViolation) {
		t.Errorf("Publish = %v; want ErrPermissionViolation", err)
	}
}
