package publish

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/schedule"
)

// schedulesStream is stream ORDERS as delayed publishes need it: orders.>
// and the schedules' subjects, allow_msg_schedules on.
func schedulesStream(adjust ...func(*jetstream.StreamConfig)) jetstream.StreamConfig {
	cfg := jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>", "_sched.ORDERS.>"}, AllowMsgSchedules: true}
	for _, f := range adjust {
		f(&cfg)
	}
	return cfg
}

// arrival is a message delivered to orders.> and when it came.
type arrival struct {
	msg jetstream.Msg
	at  time.Time
}

// arrivals consumes orders.> of stream ORDERS (the schedules left out, as
// courier's durables do) and records what arrives.
type arrivals struct {
	mu  sync.Mutex
	got []arrival
}

func watchOrders(t *testing.T, js jetstream.JetStream) *arrivals {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "watch", FilterSubject: "orders.>", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	a := &arrivals{}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now()
		_ = m.Ack()
		a.mu.Lock()
		a.got = append(a.got, arrival{m, now})
		a.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return a
}

func (a *arrivals) all() []arrival {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]arrival(nil), a.got...)
}

// TestDelayedPublish: a publish with Courier-Delay is answered 202 with
// its schedule and time, and delivered to its subject at that time (not
// before, within a second after) with its body, its headers and its
// Idempotency-Key; sent again, it is a duplicate of the same schedule and
// delivered once.
func TestDelayedPublish(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, schedulesStream())
	a := startAPI(t, srv.ClientURL(), Options{})
	got := watchOrders(t, js)

	sent := time.Now()
	ans := a.post("orders.created", `{"id":1}`, "Courier-Delay", "2s", "Idempotency-Key", "order-1",
		"X-Tenant", "acme", "Content-Type", "application/json")
	if ans.status != http.StatusAccepted || ans.Stream != "ORDERS" || ans.Seq == 0 || ans.Duplicate {
		t.Fatalf("answer %+v, want 202 ORDERS, a sequence, not duplicate", ans)
	}
	at, err := time.Parse(time.RFC3339Nano, ans.DeliverAt)
	if err != nil || at.Sub(sent) < 2*time.Second || at.Sub(sent) > 3*time.Second {
		t.Fatalf("deliver_at %q, want 2s after %s", ans.DeliverAt, sent)
	}
	id, err := schedule.ParseID(ans.Schedule)
	if err != nil || id.Stream != "ORDERS" {
		t.Fatalf("schedule %q: %v", ans.Schedule, err)
	}
	again := a.post("orders.created", `{"id":1}`, "Courier-Delay", "2s", "Idempotency-Key", "order-1")
	if again.status != http.StatusAccepted || !again.Duplicate || again.Schedule != ans.Schedule || again.Seq != ans.Seq || again.DeliverAt != ans.DeliverAt {
		t.Fatalf("sent again: %+v, want the first's schedule %+v as a duplicate", again, ans)
	}

	poll.Until(t, 5*time.Second, "the delayed message delivered", func() bool { return len(got.all()) > 0 })
	m := got.all()[0]
	if m.at.Before(at) || m.at.Sub(at) > 2*time.Second {
		t.Errorf("delivered at %s, asked for %s", m.at.Format(time.RFC3339Nano), ans.DeliverAt)
	}
	h := m.msg.Headers()
	if string(m.msg.Data()) != `{"id":1}` || m.msg.Subject() != "orders.created" || h.Get("Idempotency-Key") != "order-1" ||
		h.Get("X-Tenant") != "acme" || h.Get("Content-Type") != "application/json" || h.Get("Courier-Deliver-At") != ans.DeliverAt {
		t.Errorf("delivered %q on %s with %v", m.msg.Data(), m.msg.Subject(), h)
	}
	if h.Get("Courier-Delay") != "" {
		t.Errorf("Courier-Delay kept: %v", h)
	}
	time.Sleep(500 * time.Millisecond) // a second delivery would come now
	if n := len(got.all()); n != 1 {
		t.Errorf("delivered %d times", n)
	}
	if a.count(outcomeScheduled) != 1 || a.count(outcomeDuplicate) != 1 {
		t.Errorf("scheduled %v, duplicate %v; want 1 each", a.count(outcomeScheduled), a.count(outcomeDuplicate))
	}
}

// TestDelayedPublishAt: Courier-Deliver-At in the past delivers at once; a
// key given as Nats-Msg-Id alone reaches the app as Idempotency-Key.
func TestDelayedPublishAt(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, schedulesStream())
	a := startAPI(t, srv.ClientURL(), Options{})
	got := watchOrders(t, js)

	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	sent := time.Now()
	ans := a.post("orders.paid", "paid", "Courier-Deliver-At", past, "Nats-Msg-Id", "pay-7")
	if ans.status != http.StatusAccepted || ans.DeliverAt != past {
		t.Fatalf("answer %+v, want 202 at %s", ans, past)
	}
	poll.Until(t, 5*time.Second, "the message delivered", func() bool { return len(got.all()) > 0 })
	m := got.all()[0]
	if d := m.at.Sub(sent); d > 2*time.Second {
		t.Errorf("a time in the past delivered %s after the publish, not at once", d)
	}
	if k := m.msg.Headers().Get("Idempotency-Key"); k != "pay-7" {
		t.Errorf("Idempotency-Key %q, want pay-7", k)
	}
}

// TestDelayedPublishRefused: what a delayed publish cannot be is refused
// before anything is stored: 400 for a malformed or ambiguous delay, one
// beyond the stream's max age or with an expectation the server would
// check against the schedule; 403 for the schedules' own subjects; 409
// naming the command for a stream that cannot hold schedules, until it
// is fixed.
func TestDelayedPublishRefused(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, schedulesStream(func(c *jetstream.StreamConfig) { c.MaxAge = time.Hour }))
	createStream(t, js, jetstream.StreamConfig{Name: "PAYMENTS", Subjects: []string{"payments.>"}})
	a := startAPI(t, srv.ClientURL(), Options{Subjects: []string{"orders.>", "payments.>", "_sched.>"}})

	tests := []struct {
		name    string
		subject string
		headers []string
		status  int
		want    string
	}{
		{"malformed delay", "orders.a", []string{"Courier-Delay", "soon"}, 400, "neither a duration"},
		{"negative delay", "orders.a", []string{"Courier-Delay", "-5s"}, 400, "negative"},
		{"malformed time", "orders.a", []string{"Courier-Deliver-At", "tomorrow"}, 400, "not an RFC 3339 time"},
		{"both", "orders.a", []string{"Courier-Delay", "5s", "Courier-Deliver-At", "2030-01-01T00:00:00Z"}, 400, "give one of them"},
		{"beyond max age", "orders.a", []string{"Courier-Delay", "2h"}, 400, "beyond stream ORDERS's max age (1h0m0s)"},
		{"expectation", "orders.a", []string{"Courier-Delay", "5s", "Nats-Expected-Last-Sequence", "3"}, 400, "Nats-Expected-Last-Sequence"},
		{"schedule subject", "_sched.ORDERS.x", []string{}, 403, "where delayed messages wait"},
		{"no schedules", "payments.a", []string{"Courier-Delay", "90"}, 409,
			"stream PAYMENTS cannot hold delayed messages: allow_msg_schedules is off, and it does not capture _sched.PAYMENTS.>, where courier keeps its schedules (COURIER_SCHEDULE_PREFIX=_sched); fix it with `nats stream edit PAYMENTS --allow-schedules --subjects='payments.>,_sched.PAYMENTS.>'`"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ans := a.post(tt.subject, "x", tt.headers...)
			if ans.status != tt.status || !strings.Contains(ans.Error, tt.want) {
				t.Errorf("answer %d %q, want %d containing %q", ans.status, ans.Error, tt.status, tt.want)
			}
		})
	}
	// The command is written to be copied as it is: payments.>, not
	// payments.\u003e (JSON's escape of HTML characters).
	req, err := http.NewRequest(http.MethodPost, a.url+PathPrefix+"payments.a", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Courier-Delay", "90")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(raw), "--subjects='payments.>,_sched.PAYMENTS.>'") {
		t.Errorf("the answer's command is not as it is to be copied: %s", raw)
	}
	if n := msgCount(t, js, "ORDERS") + msgCount(t, js, "PAYMENTS"); n != 0 {
		t.Errorf("%d messages stored by refused publishes", n)
	}

	// Fixed as the answer said, the stream takes delayed publishes at once.
	natstest.Try(t, "fix PAYMENTS", func(ctx context.Context) error {
		_, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "PAYMENTS", Subjects: []string{"payments.>", "_sched.PAYMENTS.>"}, AllowMsgSchedules: true})
		return err
	})
	if ans := a.post("payments.a", "x", "Courier-Delay", "90"); ans.status != http.StatusAccepted {
		t.Errorf("after the fix: %d %q, want 202", ans.status, ans.Error)
	}
}

// TestDelayedPublishReceivers: a delayed publish is refused (409) while
// one of courier's durables on the stream, or any durable of a work-queue
// stream, would be handed the schedules themselves.
func TestDelayedPublishReceivers(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, schedulesStream())
	createStream(t, js, jetstream.StreamConfig{Name: "JOBS", Subjects: []string{"jobs.>", "_sched.JOBS.>"}, AllowMsgSchedules: true,
		Retention: jetstream.WorkQueuePolicy})
	natstest.Try(t, "consumers", func(ctx context.Context) error {
		if _, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "courier", Description: "courier sidecar"}); err != nil {
			return err
		}
		_, err := js.CreateOrUpdateConsumer(ctx, "JOBS", jetstream.ConsumerConfig{Durable: "worker"})
		return err
	})
	a := startAPI(t, srv.ClientURL(), Options{Subjects: []string{"orders.>", "jobs.>"}, DurableDescription: "courier sidecar"})
	for subj, want := range map[string]string{
		"orders.a": `courier's durable "courier" on stream ORDERS takes in _sched.ORDERS.>`,
		"jobs.a":   `consumer "worker" of stream JOBS (WorkQueue retention) takes in _sched.JOBS.>`,
	} {
		if ans := a.post(subj, "x", "Courier-Delay", "1m"); ans.status != http.StatusConflict || !strings.Contains(ans.Error, want) {
			t.Errorf("%s: %d %q, want 409 containing %q", subj, ans.status, ans.Error, want)
		}
	}
	// Once the durable leaves them out (courier restarted), it is taken.
	natstest.Try(t, "narrow the durable", func(ctx context.Context) error {
		_, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "courier", Description: "courier sidecar", FilterSubject: "orders.>"})
		return err
	})
	if ans := a.post("orders.a", "x", "Courier-Delay", "1m"); ans.status != http.StatusAccepted {
		t.Errorf("after the durable was narrowed: %d %q", ans.status, ans.Error)
	}
}

// TestCancelSchedule: DELETE /v1/schedules/<id> cancels a waiting
// schedule (204, then 404) and it is never delivered; one whose time has
// come is not cancelled (409); other methods get 405 with Allow.
func TestCancelSchedule(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, schedulesStream())
	a := startAPI(t, srv.ClientURL(), Options{})
	got := watchOrders(t, js)

	ans := a.post("orders.created", "never", "Courier-Delay", "2s", "Idempotency-Key", "c-1")
	if ans.status != http.StatusAccepted {
		t.Fatalf("answer %+v", ans)
	}
	if st, _ := a.do(http.MethodDelete, SchedulesPath+ans.Schedule); st != http.StatusNoContent {
		t.Fatalf("cancel: %d, want 204", st)
	}
	if st, body := a.do(http.MethodDelete, SchedulesPath+ans.Schedule); st != http.StatusNotFound || !strings.Contains(body, "no such schedule waiting") {
		t.Errorf("cancel again: %d %s, want 404", st, body)
	}
	// The publish sent again within the duplicate window is the one
	// cancelled: a duplicate, with no time, for nothing waits.
	if again := a.post("orders.created", "never", "Courier-Delay", "2s", "Idempotency-Key", "c-1"); again.status != http.StatusAccepted ||
		!again.Duplicate || again.DeliverAt != "" {
		t.Errorf("the cancelled publish sent again: %+v, want 202, a duplicate, no deliver_at", again)
	}
	if st, body := a.do(http.MethodDelete, SchedulesPath+"nonsense"); st != http.StatusBadRequest {
		t.Errorf("cancel of no id: %d %s, want 400", st, body)
	}
	if st, _ := a.do(http.MethodGet, SchedulesPath+ans.Schedule); st != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", st)
	}
	// A schedule to a subject this API may not publish to is not its to
	// cancel.
	other := startAPI(t, srv.ClientURL(), Options{Subjects: []string{"orders.other.>"}})
	mine := a.post("orders.created", "mine", "Courier-Delay", "1h")
	if st, body := other.do(http.MethodDelete, SchedulesPath+mine.Schedule); st != http.StatusForbidden {
		t.Errorf("cancel of another's subject: %d %s, want 403", st, body)
	}
	due := a.post("orders.created", "due", "Courier-Delay", "500ms")
	if st, body := a.do(http.MethodDelete, SchedulesPath+due.Schedule); st != http.StatusConflict || !strings.Contains(body, "too late to cancel") {
		t.Errorf("cancel of one due: %d %s, want 409", st, body)
	}
	time.Sleep(3 * time.Second) // past the cancelled one's time
	for _, m := range got.all() {
		if string(m.msg.Data()) == "never" {
			t.Errorf("the cancelled message was delivered at %s", m.at)
		}
	}
	if n := len(got.all()); n != 1 {
		t.Errorf("%d delivered, want the one due", n)
	}
	if v := value(a.srv.m.cancelled); v != 1 {
		t.Errorf("cancelled counted %v, want 1", v)
	}
}

// TestDelayedBatch: a batch entry with Courier-Delay is scheduled (202,
// its schedule named) beside an entry stored at once (200); the batch is
// 200, every entry stored; a malformed delay refuses the whole batch.
func TestDelayedBatch(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, schedulesStream())
	a := startAPI(t, srv.ClientURL(), Options{})
	got := watchOrders(t, js)

	r := a.postBatch("/orders.b", `{"entries":[{"entryId":"now","data":"now"},{"entryId":"later","data":"later","idempotencyKey":"b-1","headers":{"Courier-Delay":["1s"]}}]}`)
	if r.status != http.StatusOK || len(r.Entries) != 2 || r.Entries[0].Status != 200 || r.Entries[1].Status != 202 ||
		r.Entries[1].Schedule == "" || r.Entries[1].DeliverAt == "" {
		t.Fatalf("batch answer %+v", r)
	}
	poll.Until(t, 5*time.Second, "both delivered", func() bool { return len(got.all()) == 2 })
	if first := got.all()[0]; string(first.msg.Data()) != `"now"` {
		t.Errorf("first delivered %q, want the entry stored at once", first.msg.Data())
	}
	bad := a.postBatch("/orders.b", `{"entries":[{"data":"x"},{"data":"y","headers":{"Courier-Delay":["later"]}}]}`)
	if bad.status != http.StatusBadRequest || !strings.Contains(bad.Error, "entry 1") {
		t.Errorf("malformed delay: %d %q, want 400 naming entry 1", bad.status, bad.Error)
	}
}

// do sends a request without a body to path and returns its status and
// body.
func (a *api) do(method, path string) (int, string) {
	a.t.Helper()
	req, err := http.NewRequest(method, a.url+path, nil)
	if err != nil {
		a.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// TestDelayedPublishInterest: on an interest stream, which drops a message
// no consumer takes in, courier creates the consumer that keeps the
// schedules (schedule.Holder), and the message is delivered at its time.
func TestDelayedPublishInterest(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, schedulesStream(func(c *jetstream.StreamConfig) { c.Retention = jetstream.InterestPolicy }))
	got := watchOrders(t, js)
	a := startAPI(t, srv.ClientURL(), Options{})

	ans := a.post("orders.created", "later", "Courier-Delay", "1s")
	if ans.status != http.StatusAccepted {
		t.Fatalf("answer %+v", ans)
	}
	at, _ := time.Parse(time.RFC3339Nano, ans.DeliverAt)
	poll.Until(t, 5*time.Second, "the delayed message delivered", func() bool { return len(got.all()) > 0 })
	if m := got.all()[0]; m.at.Before(at) || string(m.msg.Data()) != "later" {
		t.Errorf("delivered %q at %s, asked for %s", m.msg.Data(), m.at, ans.DeliverAt)
	}
	natstest.Try(t, "the holder", func(ctx context.Context) error {
		c, err := js.Consumer(ctx, "ORDERS", schedule.Holder)
		if err == nil && c.CachedInfo().Config.FilterSubject != "_sched.ORDERS.>" {
			t.Errorf("holder filters %q", c.CachedInfo().Config.FilterSubject)
		}
		return err
	})
}
