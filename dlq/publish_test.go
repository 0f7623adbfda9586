package dlq_test

import (
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
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

func TestReasons(t *testing.T) {
	want := []string{"rejected", "exhausted", "expired", "max-deliveries", "app-unavailable", "not-attempted", "unknown"}
	got := dlq.Reasons()
	if !slices.Equal(got, want) {
		t.Errorf("Reasons() = %q, want %q", got, want)
	}
	got[0] = "changed"
	if dlq.Reasons()[0] != "rejected" {
		t.Error("Reasons() shares its slice between calls")
	}
}

// An original's subject need not be valid UTF-8 nor printable (control
// characters, a bidirectional override): Courier-Subject shows it readably, and Subject recovers it
// exactly (issue #17.7).
func TestEnvelopeKeepsExactSubject(t *testing.T) {
	for _, subject := range []string{"orders.created", "orders.caf\xe9", "orders.a\x01b", "orders.\u202eredro", "orders.café"} {
		l := letter()
		l.Subject = subject
		h := dlq.Envelope(l)
		if got := dlq.Subject(h); got != subject {
			t.Errorf("Subject(Envelope(%q)) = %q", subject, got)
		}
		readable := h.Get(dlq.HeaderSubject)
		if !utf8.ValidString(readable) || strings.ContainsFunc(readable, func(r rune) bool { return !unicode.IsPrint(r) }) {
			t.Errorf("%s = %q, want a readable value", dlq.HeaderSubject, readable)
		}
		if _, ok := h[dlq.HeaderSubjectBase64]; ok != (readable != subject) {
			t.Errorf("%q: %s present = %v, want it only when %s (%q) differs", subject, dlq.HeaderSubjectBase64, ok, dlq.HeaderSubject, readable)
		}
	}
}

func TestDerivedKey(t *testing.T) {
	created := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	if got, want := dlq.DerivedKey("ORDERS", created, 7), "ORDERS:"+strconv.FormatInt(created.UnixNano(), 10)+":7"; got != want {
		t.Errorf("DerivedKey = %q, want %q", got, want)
	}
}

func TestDeadLetterOutcomes(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	const subject = "dlq.ORDERS.courier"
	ensure(t, js, subject)
	p := dlq.NewPublisher(js, subject)

	if err := p.DeadLetter(ctx(t, 5*time.Second), letter()); err != nil || !dlq.Stored(err) {
		t.Fatalf("first DeadLetter = %v, want nil", err)
	}
	err := p.DeadLetter(ctx(t, 5*time.Second), letter())
	if !errors.Is(err, dlq.ErrDuplicate) || errors.Is(err, dlq.ErrBodyOmitted) || !dlq.Stored(err) {
		t.Errorf("second DeadLetter = %v, want ErrDuplicate, stored", err)
	}
	if dlq.Stored(errors.New("boom")) || dlq.Stored(dlq.ErrRefused) {
		t.Error("Stored is true for a failure")
	}
}

// smallServer is a server whose max_payload is 8 KiB, with a dead-letter
// stream on subject.
func smallServer(t *testing.T, subject string) (jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	s := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = 8192 }})
	_, js := natstest.Connect(t, s)
	info := ensure(t, js, subject)
	stream, err := js.Stream(ctx(t, 5*time.Second), info.Config.Name)
	if err != nil {
		t.Fatal(err)
	}
	return js, stream
}

// Every message can be dead-lettered: one close to the server's max_payload
// does not fit with its envelope, and is stored as a reference dead letter
// (issue #17.2).
func TestDeadLetterTooLarge(t *testing.T) {
	const subject = "dlq.ORDERS.courier"
	js, stream := smallServer(t, subject)
	p := dlq.NewPublisher(js, subject)

	tests := []struct {
		name      string
		body      int
		headers   int // bytes of one original header's value
		errLen    int
		omitted   bool // the body
		noHeaders bool // the original's headers too
		errCut    bool // Courier-Error cut to ShortErrorLen
	}{
		{name: "fits", body: 4000, errLen: 1000},
		{name: "fits once the error is shorter", body: 7000, errLen: 1000, errCut: true},
		{name: "body too large", body: 8000, errLen: 1000, omitted: true, errCut: true},
		{name: "headers too large too", body: 100, headers: 7900, omitted: true, noHeaders: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := letter()
			l.Sequence = uint64(100 + i)
			l.Data = []byte(strings.Repeat("b", tt.body))
			l.Error = strings.Repeat("e", tt.errLen)
			if tt.headers > 0 {
				l.Header = nats.Header{"X-Big": {strings.Repeat("h", tt.headers)}}
			}
			err := p.DeadLetter(ctx(t, 5*time.Second), l)
			if tt.omitted != errors.Is(err, dlq.ErrBodyOmitted) || !dlq.Stored(err) {
				t.Fatalf("DeadLetter = %v, want stored with the body omitted: %v", err, tt.omitted)
			}
			m, gerr := stream.GetLastMsgForSubject(ctx(t, 5*time.Second), subject)
			if gerr != nil {
				t.Fatal(gerr)
			}
			if m.Header.Get("Nats-Msg-Id") != dlq.MsgID(l) {
				t.Fatalf("last dead letter is %q, want %q", m.Header.Get("Nats-Msg-Id"), dlq.MsgID(l))
			}
			if tt.omitted {
				if len(m.Data) != 0 || m.Header.Get(dlq.HeaderBody) != dlq.BodyOmittedTooLarge || m.Header.Get(dlq.HeaderBodySize) != strconv.Itoa(tt.body) {
					t.Errorf("reference dead letter: %d bytes of body, %s=%q %s=%q", len(m.Data),
						dlq.HeaderBody, m.Header.Get(dlq.HeaderBody), dlq.HeaderBodySize, m.Header.Get(dlq.HeaderBodySize))
				}
			} else if string(m.Data) != string(l.Data) || m.Header.Get(dlq.HeaderBody) != "" {
				t.Errorf("dead letter carries %d bytes of body (%s=%q), want the %d of the original", len(m.Data), dlq.HeaderBody, m.Header.Get(dlq.HeaderBody), tt.body)
			}
			wantErr := len(l.Error)
			if tt.errCut {
				wantErr = dlq.ShortErrorLen
			}
			if got := len(m.Header.Get(dlq.HeaderError)); got != wantErr {
				t.Errorf("%s is %d bytes, want %d", dlq.HeaderError, got, wantErr)
			}
			orig := dlq.Original(m.Header)
			if tt.noHeaders {
				if len(orig) != 0 || m.Header.Get(dlq.HeaderHeaders) != dlq.BodyOmittedTooLarge {
					t.Errorf("original headers %v, %s=%q; want them omitted and said so", slices.Collect(maps.Keys(orig)), dlq.HeaderHeaders, m.Header.Get(dlq.HeaderHeaders))
				}
			} else if !maps.EqualFunc(orig, l.Header, slices.Equal) {
				t.Errorf("original headers = %v, want %v", orig, l.Header)
			}
			for _, h := range []string{dlq.HeaderStream, dlq.HeaderSequence, dlq.HeaderReason, dlq.HeaderSubject} {
				if m.Header.Get(h) == "" {
					t.Errorf("%s missing", h)
				}
			}
		})
	}
}

// A dead-letter stream that refuses a dead letter says so with ErrRefused,
// wrapping the server's answer, rather than a bare error to retry blindly.
func TestDeadLetterRefused(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	const subject = "dlq.small"
	cfg := dlq.StreamConfig(subject, 1)
	cfg.MaxMsgSize = 512
	createStream(t, js, cfg)
	err := dlq.NewPublisher(js, subject).DeadLetter(ctx(t, 5*time.Second), letter())
	var apiErr *jetstream.APIError
	if !errors.Is(err, dlq.ErrRefused) || !errors.As(err, &apiErr) || dlq.Stored(err) {
		t.Errorf("DeadLetter to a stream with max_msg_size 512 = %v, want ErrRefused wrapping the API error", err)
	}
}

// A dead letter that fits, published again within the duplicate window of
// a first one stored as a reference (a longer error made that one too
// large), is reported stored without the body: what is stored is the
// reference, and the original must stay in its stream.
func TestDeadLetterDuplicateOfReference(t *testing.T) {
	const subject = "dlq.ORDERS.courier"
	js, _ := smallServer(t, subject)
	p := dlq.NewPublisher(js, subject)
	l := letter()
	l.Error = "short"
	size := len("NATS/1.0\r\n\r\n")
	for k, vs := range dlq.Envelope(l) {
		for _, v := range vs {
			size += len(k) + len(v) + 4
		}
	}
	l.Data = []byte(strings.Repeat("b", 8192-size-8)) // fits with the short error only
	long := l
	long.Error = strings.Repeat("e", 1000)
	if err := p.DeadLetter(ctx(t, 5*time.Second), long); !errors.Is(err, dlq.ErrBodyOmitted) {
		t.Fatalf("first DeadLetter = %v, want a reference", err)
	}
	err := p.DeadLetter(ctx(t, 5*time.Second), l)
	if !errors.Is(err, dlq.ErrDuplicate) || !errors.Is(err, dlq.ErrBodyOmitted) {
		t.Errorf("second DeadLetter = %v, want a duplicate of a reference dead letter (ErrDuplicate and ErrBodyOmitted)", err)
	}
}
