package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
)

// fakeMsg is a JetStream message whose settlement is recorded.
type fakeMsg struct {
	jetstream.Msg
	seq     uint64
	subject string
	mu      sync.Mutex
	settled string
}

func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Stream: "S", Consumer: "c", NumDelivered: 1,
		Sequence: jetstream.SequencePair{Stream: m.seq, Consumer: m.seq}, Timestamp: time.Now()}, nil
}
func (m *fakeMsg) Data() []byte         { return []byte("x") }
func (m *fakeMsg) Reply() string        { return "$JS.ACK.S.c.1.1.1.0.0" }
func (m *fakeMsg) Headers() nats.Header { return nats.Header{} }
func (m *fakeMsg) Subject() string {
	if m.subject != "" {
		return m.subject
	}
	return "s.x"
}
func (m *fakeMsg) set(s string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.settled != "" {
		return jetstream.ErrMsgAlreadyAckd
	}
	m.settled = s
	return nil
}
func (m *fakeMsg) Ack() error                       { return m.set("ack") }
func (m *fakeMsg) Nak() error                       { return m.set("nak") }
func (m *fakeMsg) NakWithDelay(time.Duration) error { return m.set("nak") }
func (m *fakeMsg) Term() error                      { return m.set("term") }
func (m *fakeMsg) TermWithReason(string) error      { return m.set("term") }
func (m *fakeMsg) InProgress() error                { return nil }
func (m *fakeMsg) state() string                    { m.mu.Lock(); defer m.mu.Unlock(); return m.settled }

type fakeBatch struct {
	ch  chan jetstream.Msg
	err error
}

func (b *fakeBatch) Messages() <-chan jetstream.Msg { return b.ch }
func (b *fakeBatch) Error() error                   { return b.err }

// fakeConsumer hands out the batches the test sends; the consumer is
// reported deleted once gone is set.
type fakeConsumer struct {
	jetstream.Consumer
	batches chan *fakeBatch
}

func (c *fakeConsumer) Fetch(int, ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, ok := <-c.batches
	if !ok {
		return nil, jetstream.ErrConsumerDeleted
	}
	return b, nil
}

func (c *fakeConsumer) CachedInfo() *jetstream.ConsumerInfo { return &jetstream.ConsumerInfo{} }

func (c *fakeConsumer) Info(context.Context) (*jetstream.ConsumerInfo, error) {
	return nil, jetstream.ErrConsumerNotFound
}

type nopDL struct{}

func (nopDL) DeadLetter(context.Context, dlq.Letter) error { return nil }

func refusedURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr + "/"
}

// The consumer is deleted while the app is down and a worker holds a queued
// message waiting for the app: Run must still return (with the error), not
// wait for an app that may never come back.
func TestConsumerDeletedDuringOutageRunReturns(t *testing.T) {
	fc := &fakeConsumer{batches: make(chan *fakeBatch)}
	r, err := New(fc, nopDL{}, nil, Options{
		AppURL: refusedURL(t), Stream: "S", Consumer: "c", MaxInflight: 2,
		ShutdownGrace: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()

	b := &fakeBatch{ch: make(chan jetstream.Msg)}
	fc.batches <- b
	m1, m2 := &fakeMsg{seq: 1}, &fakeMsg{seq: 2}
	b.ch <- m1 // refused: the gate closes, m1 is held
	poll.Until(t, 15*time.Second, "the app marked unavailable", func() bool { return !r.hold.open() })
	b.ch <- m2 // taken by the second worker while the app is down
	poll.Until(t, 15*time.Second, "both messages held", func() bool { return r.hold.parked.Load() == 2 })
	b.err = jetstream.ErrConsumerDeleted
	close(b.ch)

	select {
	case err := <-done:
		if !errors.Is(err, ErrConsumerGone) {
			t.Fatalf("Run returned %v after the consumer was deleted, want ErrConsumerGone", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after the consumer was deleted during an app outage")
	}
	for _, m := range []*fakeMsg{m1, m2} {
		if m.state() != "nak" {
			t.Errorf("message %d settled %q, want nak", m.seq, m.state())
		}
	}
}

// A pull that ends with a status that ends pulls normally (on a cluster, 409
// Batch Completed can come before the pull's last messages) is not a failure:
// courier stays bound and pulls again at once.
func TestPullEndingStatusesKeepConsumerBound(t *testing.T) {
	for _, end := range []error{
		jetstream.ErrBatchCompleted, jetstream.ErrMaxBytesExceeded, jetstream.ErrNoMessages,
		nats.ErrTimeout, jetstream.ErrConsumerLeadershipChanged, jetstream.ErrServerShutdown,
	} {
		t.Run(end.Error(), func(t *testing.T) {
			fc := &fakeConsumer{batches: make(chan *fakeBatch)}
			app := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			t.Cleanup(app.Close)
			var logs testlog.Buffer
			r, err := New(fc, nopDL{}, nil, Options{AppURL: app.URL, Stream: "S", Consumer: "c", MaxInflight: 1,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			for i := range 3 {
				b := &fakeBatch{ch: make(chan jetstream.Msg, 1), err: end}
				m := &fakeMsg{seq: uint64(i + 1)}
				b.ch <- m
				close(b.ch)
				select {
				case fc.batches <- b:
				case <-time.After(15 * time.Second):
					t.Fatalf("pull %d never came", i+1)
				}
				poll.Until(t, 15*time.Second, "the message acked", func() bool { return m.state() == "ack" })
				if err := r.Ready(); err != nil {
					t.Errorf("after a pull ended with %q: not ready: %v", end, err)
				}
			}
			cancel()
			close(fc.batches)
			<-done
			// A pull that failed is retried after a wait, and only then,
			// with this line: told by the log, not by a clock.
			if strings.Contains(logs.String(), "cannot fetch") {
				t.Errorf("a pull ending with %q was retried as a failure (backed off):\n%s", end, logs.String())
			}
		})
	}
}
