package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/ordermark"
	"github.com/courierhq/courier/partition"
)

// cleanupRun runs `courier cleanup args...` in h's environment.
func (h *harness) cleanupRun(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append([]string{"cleanup"}, args...), h.env(""), &stdout, &stderr)
	code := exitCode(err, &stderr)
	return stdout.String() + stderr.String(), code
}

func (h *harness) streamExists(name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := h.js.Stream(ctx, name)
	return err == nil
}

// cleanup removes what courier created for its consumer, keeps dead letters
// unless forced, asks for --yes off a terminal, and never removes the stream
// it consumes.
func TestCleanup(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusUnprocessableEntity) })
	h.publish("orders.created", "hopeless", nil)
	c := start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "the dead letter", func() bool { return len(h.deadLetters(dlqSubject)) == 1 && h.settled("courier") })
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	advisories := giveup.StreamName("ORDERS", "courier")
	dlqStream, err := h.js.StreamNameBySubject(context.Background(), dlqSubject)
	if err != nil || !h.streamExists(advisories) {
		t.Fatalf("courier's streams: dlq %q (%v), advisories there %v", dlqStream, err, h.streamExists(advisories))
	}

	// Without --yes, off a terminal: the plan, exit 2, nothing changed.
	out, code := h.cleanupRun(t)
	if code != 2 || !strings.Contains(out, "--yes") {
		t.Errorf("without --yes: exit %d\n%s", code, out)
	}
	for _, want := range []string{
		`remove  consumer "courier" on stream "ORDERS"`,
		`remove  stream "` + advisories + `"`,
		`keep    stream "` + dlqStream + `"`, "holds dead letters",
		`keep    stream "ORDERS"`, "never removed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("plan lacks %q:\n%s", want, out)
		}
	}
	if out, code := h.cleanupRun(t, "--dry-run"); code != 0 || !strings.Contains(out, "dry run: would remove 3") {
		t.Errorf("--dry-run: exit %d\n%s", code, out)
	}
	if h.consumerInfo("courier") == nil || !h.streamExists(advisories) {
		t.Fatal("removed something without --yes")
	}

	out, code = h.cleanupRun(t, "--yes")
	if code != 0 {
		t.Fatalf("--yes: exit %d\n%s", code, out)
	}
	if h.consumerInfo("courier") != nil || h.streamExists(advisories) {
		t.Errorf("--yes left the consumer or the advisory stream:\n%s", out)
	}
	if !h.streamExists(dlqStream) || !h.streamExists("ORDERS") {
		t.Fatalf("--yes removed the dead letters or the consumed stream:\n%s", out)
	}

	out, code = h.cleanupRun(t, "--yes", "--force")
	if code != 0 || h.streamExists(dlqStream) {
		t.Errorf("--yes --force: exit %d, dead-letter stream there %v\n%s", code, h.streamExists(dlqStream), out)
	}
	if !h.streamExists("ORDERS") || h.streamMsgs() != 1 {
		t.Error("the consumed stream or its message is gone")
	}
	if out, code := h.cleanupRun(t, "--yes"); code != 0 || !strings.Contains(out, "nothing to remove") {
		t.Errorf("again: exit %d\n%s", code, out)
	}
}

// A consumer courier did not create, or one a courier is pulling from, is
// kept unless forced.
func TestCleanupKeepsWhatIsNotIdle(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable: "courier", AckPolicy: jetstream.AckExplicitPolicy, Description: "billing's own",
	}); err != nil {
		t.Fatal(err)
	}
	out, code := h.cleanupRun(t, "--yes")
	if code != 0 || !strings.Contains(out, "not created by courier") || h.consumerInfo("courier") == nil {
		t.Errorf("someone else's consumer: exit %d\n%s", code, out)
	}
	if err := h.js.DeleteConsumer(ctx, "ORDERS", "courier"); err != nil {
		t.Fatal(err)
	}

	a := newApp(t, nil)
	start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "courier pulling", func() bool {
		info := h.consumerInfo("courier")
		return info != nil && info.NumWaiting > 0
	})
	var last string
	poll.Until(t, 10*time.Second, "cleanup seeing the live courier", func() bool {
		last, _ = h.cleanupRun(t, "--dry-run")
		return strings.Contains(last, "a courier seems to be consuming it")
	})
	if h.consumerInfo("courier") == nil {
		t.Errorf("the live courier's consumer was removed:\n%s", last)
	}
}

// Beside a running courier, cleanup keeps what it uses, not only its
// consumer (or its partitions' work stream): the dead-letter stream it
// stores dead letters in and the stream of advisories it turns into dead
// letters, though both are empty; --force lifts that, as for the consumer.
func TestCleanupKeepsWhatALiveCourierUses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []string
		kept  string // what holds the durable
	}{
		{"a consumer", nil, `consumer "courier" on stream "ORDERS"`},
		{"partitions", []string{"COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=2"}, `stream "` + partition.StreamName("ORDERS", "courier") + `"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			a := newApp(t, nil)
			c := start(t, h.env(a.URL, tc.extra...))
			var out string
			poll.Until(t, 20*time.Second, "cleanup seeing the running courier", func() bool {
				out, _ = h.cleanupRun(t, "--dry-run")
				return strings.Contains(out, "keep    "+tc.kept) && strings.Contains(out, "a courier seems to be")
			})
			advisories := giveup.StreamName("ORDERS", "courier")
			if tc.extra != nil {
				advisories = giveup.StreamName(partition.StreamName("ORDERS", "courier"), giveup.AllConsumers)
			}
			dlqStream, err := h.js.StreamNameBySubject(context.Background(), dlqSubject)
			if err != nil || !h.streamExists(advisories) {
				t.Fatalf("courier's streams: dlq %q (%v), advisories there %v", dlqStream, err, h.streamExists(advisories))
			}

			out, code := h.cleanupRun(t, "--yes")
			if code != 0 {
				t.Fatalf("--yes beside a running courier: exit %d\n%s", code, out)
			}
			for _, want := range []string{"keep    " + tc.kept, `keep    stream "` + dlqStream + `"`,
				`a courier seems to be running on consumer "courier"`, "stores its dead letters there: stop it first, or --force",
				"nothing to remove"} {
				if !strings.Contains(out, want) {
					t.Errorf("cleanup beside a running courier lacks %q:\n%s", want, out)
				}
			}
			if tc.extra == nil && !strings.Contains(out, `keep    stream "`+advisories+`"`) {
				t.Errorf("cleanup beside a running courier does not keep its advisory stream:\n%s", out)
			}
			if !h.streamExists(advisories) || !h.streamExists(dlqStream) {
				t.Fatalf("cleanup removed what a running courier uses:\n%s", out)
			}

			out, code = h.cleanupRun(t, "--dry-run", "--force")
			for _, want := range []string{"remove  " + tc.kept, `remove  stream "` + advisories + `"`, `remove  stream "` + dlqStream + `"`} {
				if code != 0 || !strings.Contains(out, want) {
					t.Errorf("--dry-run --force: exit %d, lacks %q:\n%s", code, want, out)
				}
			}

			// Stopped, the empty streams go without --force.
			if err := c.stop(); err != nil {
				t.Fatal(err)
			}
			out, code = h.cleanupRun(t, "--yes")
			if code != 0 || h.streamExists(advisories) || h.streamExists(dlqStream) || !h.streamExists("ORDERS") {
				t.Errorf("--yes once courier stopped: exit %d\n%s", code, out)
			}
		})
	}
}

func TestCleanupUsage(t *testing.T) {
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"cleanup", "--help"}, nil, &stdout, io.Discard); err != nil || !strings.Contains(stdout.String(), "never removed") && !strings.Contains(stdout.String(), "Never removed") {
		t.Errorf("cleanup --help: %v\n%s", err, stdout.String())
	}
	err := run(context.Background(), []string{"cleanup", "extra"}, nil, io.Discard, io.Discard)
	if code := exitCode(err, io.Discard); code != 2 {
		t.Errorf("cleanup extra: exit %d", code)
	}
	err = run(context.Background(), []string{"cleanup", "--yes"}, []string{"COURIER_REPLY_SUBJECTS=q", "COURIER_APP_URL=http://h/"}, io.Discard, io.Discard)
	if code := exitCode(err, io.Discard); code != 2 {
		t.Errorf("cleanup without a stream: exit %d", code)
	}
}

// The bucket of order per key's marks is removed with the consumer, and
// kept while the consumer is (a courier pulls from it); one of that name
// courier did not create is kept.
func TestCleanupOrderMarks(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	h.publish("orders.created", "x", map[string]string{"Order": "o-1"})
	c := start(t, h.env(a.URL, "COURIER_ORDER_KEY=header:Order"))
	poll.Until(t, 10*time.Second, "the message delivered, courier pulling", func() bool {
		info := h.consumerInfo("courier")
		return h.settled("courier") && info != nil && info.NumWaiting > 0
	})
	bucket := ordermark.BucketName("ORDERS", "courier")
	out, code := h.cleanupRun(t, "--dry-run")
	if code != 0 || !strings.Contains(out, `keep    key-value bucket "`+bucket+`"`) || !strings.Contains(out, "the consumer is kept") {
		t.Errorf("while a courier consumes: exit %d\n%s", code, out)
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}

	out, code = h.cleanupRun(t, "--dry-run")
	if code != 0 || !strings.Contains(out, `remove  key-value bucket "`+bucket+`" (order per key's marks, 0 keys)`) {
		t.Errorf("--dry-run: exit %d\n%s", code, out)
	}
	out, code = h.cleanupRun(t, "--yes")
	if code != 0 || !strings.Contains(out, `removed key-value bucket "`+bucket+`"`) {
		t.Errorf("--yes: exit %d\n%s", code, out)
	}
	ctx := context.Background()
	if _, err := h.js.KeyValue(ctx, bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("the bucket after cleanup: %v, want it gone", err)
	}

	if _, err := h.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Description: "billing's own"}); err != nil {
		t.Fatal(err)
	}
	out, code = h.cleanupRun(t, "--yes", "--force")
	if code != 0 || !regexp.MustCompile(`keep +key-value bucket "`+bucket+`"`).MatchString(out) || !strings.Contains(out, "not created by courier") {
		t.Errorf("someone else's bucket: exit %d\n%s", code, out)
	}
	if _, err := h.js.KeyValue(ctx, bucket); err != nil {
		t.Errorf("someone else's bucket removed: %v", err)
	}
}
