package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/schedule"
)

// withSchedules makes the harness's stream hold delayed messages: it
// captures _sched.ORDERS.> beside orders.>, allow_msg_schedules on.
func withSchedules(c *jetstream.StreamConfig) {
	c.Subjects = append(c.Subjects, "_sched."+c.Name+".>")
	c.AllowMsgSchedules = true
}

// delayedAnswer is the publish API's answer to a delayed publish.
type delayedAnswer struct {
	status    int
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Schedule  string `json:"schedule"`
	DeliverAt string `json:"deliver_at"`
	Duplicate bool   `json:"duplicate"`
	Error     string `json:"error"`
}

// at is the answer's deliver_at.
func (d delayedAnswer) at(t *testing.T) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, d.DeliverAt)
	if err != nil {
		t.Fatalf("deliver_at %q: %v", d.DeliverAt, err)
	}
	return at
}

// postDelayed publishes body to subject through courier at addr with
// headers (name, value pairs), Courier-Delay or Courier-Deliver-At among
// them.
func postDelayed(t *testing.T, addr, subject, body string, headers ...string) delayedAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/publish/"+subject, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", subject, err)
	}
	defer resp.Body.Close()
	ans := delayedAnswer{status: resp.StatusCode}
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
		t.Fatalf("answer %d: %v", resp.StatusCode, err)
	}
	return ans
}

// bodies returns the app's requests whose body is body.
func (a *app) bodies(body string) []request {
	var out []request
	for _, r := range a.requests() {
		if r.Body == body {
			out = append(out, r)
		}
	}
	return out
}

// deliveredOnceAt waits for the app to get body, and checks that it came
// once, not before at and within two seconds after.
func deliveredOnceAt(t *testing.T, a *app, body string, at time.Time) request {
	t.Helper()
	poll.Until(t, time.Until(at)+10*time.Second, "the delayed message "+body+" delivered", func() bool { return len(a.bodies(body)) > 0 })
	time.Sleep(300 * time.Millisecond) // a second delivery would come now
	got := a.bodies(body)
	if len(got) != 1 {
		t.Errorf("%s delivered %d times, want once", body, len(got))
	}
	r := got[0]
	if r.At.Before(at) || r.At.Sub(at) > 2*time.Second {
		t.Errorf("%s delivered at %s, asked for %s", body, r.At.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano))
	}
	return r
}

// TestScheduleDelivered: a delayed publish through courier reaches the app
// at its time, once, with the body, the headers and the Idempotency-Key it
// was published with; the same publish sent again is the same schedule; a
// time in the past is delivered at once. The durable leaves the schedules
// out, the start-up log says where they wait, and the metrics count them.
func TestScheduleDelivered(t *testing.T) {
	h := newHarness(t, withSchedules)
	a := newApp(t, nil)
	c := start(t, h.env(a.URL, publishEnv...))
	addr := publishAddr(t, c)
	admin := adminAddr(t, c)
	poll.Until(t, 20*time.Second, "courier ready", func() bool { code, _ := get(t, "http://"+admin+"/readyz"); return code == http.StatusOK })

	ans := postDelayed(t, addr, "orders.created", `{"order":1}`, "Courier-Delay", "2s", "Idempotency-Key", "order-1",
		"X-Tenant", "acme", "Content-Type", "application/json")
	if ans.status != http.StatusAccepted || ans.Stream != "ORDERS" || ans.Schedule == "" {
		t.Fatalf("answer %+v, want 202 with a schedule", ans)
	}
	again := postDelayed(t, addr, "orders.created", `{"order":1}`, "Courier-Delay", "2s", "Idempotency-Key", "order-1")
	if again.status != http.StatusAccepted || !again.Duplicate || again.Schedule != ans.Schedule || again.DeliverAt != ans.DeliverAt {
		t.Errorf("sent again: %+v, want a duplicate of %+v", again, ans)
	}
	r := deliveredOnceAt(t, a, `{"order":1}`, ans.at(t))
	if r.Header.Get("Idempotency-Key") != "order-1" || r.Header.Get("X-Tenant") != "acme" ||
		r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Courier-Deliver-At") != ans.DeliverAt ||
		r.Header.Get("Courier-Subject") != "orders.created" {
		t.Errorf("the app got headers %v", r.Header)
	}

	past := postDelayed(t, addr, "orders.created", "past", "Courier-Deliver-At", "2020-01-01T00:00:00Z", "Idempotency-Key", "order-2")
	sent := time.Now()
	if past.status != http.StatusAccepted {
		t.Fatalf("a time in the past: %+v", past)
	}
	poll.Until(t, 5*time.Second, "a time in the past delivered", func() bool { return len(a.bodies("past")) == 1 })
	if d := a.bodies("past")[0].At.Sub(sent); d > 2*time.Second {
		t.Errorf("a time in the past delivered %s after its publish, not at once", d)
	}

	if info := h.consumerInfo("courier"); info == nil || info.Config.FilterSubject != "orders.>" {
		t.Errorf("the durable's filter: %+v, want orders.>", info)
	}
	if len(logLines(c, "delayed publishing on")) == 0 || len(logLines(c, "the durable leaves out the schedules")) == 0 {
		t.Errorf("start-up log does not say where schedules wait:\n%s", c.logs.String())
	}
	g := metrics(admin)
	poll.Until(t, 5*time.Second, "the deliveries counted", func() bool {
		v, _ := metricstest.Lookup(t, g, "courier_schedule_deliveries_total", "timing", "on_time")
		return v == 1
	})
	if v, _ := metricstest.Lookup(t, g, "courier_schedule_deliveries_total", "timing", "late"); v != 1 {
		t.Errorf("late deliveries %v, want 1 (the time in the past)", v)
	}
	if v := metricstest.Value(t, g, "courier_publish_requests_total", "outcome", "scheduled"); v != 2 {
		t.Errorf("scheduled %v, want 2", v)
	}
}

// TestScheduleNeverReachesApp: on a limits, a work-queue and an interest
// stream, the schedule itself never reaches the app (nothing before its
// time), and no ack removes it: it waits in the stream until its time, and
// the message then reaches the app once.
func TestScheduleNeverReachesApp(t *testing.T) {
	for _, ret := range []jetstream.RetentionPolicy{jetstream.LimitsPolicy, jetstream.WorkQueuePolicy, jetstream.InterestPolicy} {
		t.Run(ret.String(), func(t *testing.T) {
			h := newHarness(t, withSchedules, func(c *jetstream.StreamConfig) { c.Retention = ret })
			a := newApp(t, nil)
			c := start(t, h.env(a.URL, publishEnv...))
			addr := publishAddr(t, c)
			admin := adminAddr(t, c)
			poll.Until(t, 20*time.Second, "courier ready", func() bool { code, _ := get(t, "http://"+admin+"/readyz"); return code == http.StatusOK })

			ans := postDelayed(t, addr, "orders.created", "later", "Courier-Delay", "3s", "Idempotency-Key", "later-1")
			if ans.status != http.StatusAccepted {
				t.Fatalf("answer %+v", ans)
			}
			id, err := schedule.ParseID(ans.Schedule)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Until(ans.at(t).Add(-time.Second)))
			if n := a.count(); n != 0 {
				t.Fatalf("the app got %d requests before the time: %+v", n, a.requests())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := schedule.Lookup(ctx, h.js, schedule.DefaultPrefix, id); err != nil {
				t.Errorf("the schedule is gone before its time: %v", err)
			}
			deliveredOnceAt(t, a, "later", ans.at(t))
		})
	}
}

// TestScheduleThroughRestarts: a delayed message reaches the app at its
// time after courier and the NATS server both stopped and started again
// meanwhile (the server from its store).
func TestScheduleThroughRestarts(t *testing.T) {
	store := t.TempDir()
	srv := natstest.NewServer(t, natstest.Options{StoreDir: store})
	port := srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { natstest.Stop(srv) })
	nc, js := natstest.Connect(t, srv)
	natstest.Try(t, "stream", func(ctx context.Context) error {
		cfg := jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}
		withSchedules(&cfg)
		_, err := js.CreateStream(ctx, cfg)
		return err
	})
	h := &harness{t: t, srv: srv, nc: nc, js: js, stream: "ORDERS", dir: t.TempDir()}
	a := newApp(t, nil)
	c := start(t, h.env(a.URL, publishEnv...))
	addr := publishAddr(t, c)

	ans := postDelayed(t, addr, "orders.created", "survivor", "Courier-Delay", "6s", "Idempotency-Key", "survivor-1", "X-Trace", "kept")
	if ans.status != http.StatusAccepted {
		t.Fatalf("answer %+v", ans)
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
	natstest.Stop(srv)
	srv = natstest.NewServer(t, natstest.Options{Port: port, StoreDir: store})
	h.srv = srv
	c2 := start(t, h.env(a.URL, publishEnv...))
	_ = adminAddr(t, c2)
	r := deliveredOnceAt(t, a, "survivor", ans.at(t))
	if r.Header.Get("Idempotency-Key") != "survivor-1" || r.Header.Get("X-Trace") != "kept" {
		t.Errorf("after the restarts the app got headers %v", r.Header)
	}
}

// TestScheduleCancelled: `courier schedules ls` lists a waiting delayed
// message, `courier schedules cancel` removes it, and it never reaches the
// app; the publish API then answers its DELETE 404.
func TestScheduleCancelled(t *testing.T) {
	h := newHarness(t, withSchedules)
	a := newApp(t, nil)
	env := h.env(a.URL, publishEnv...)
	c := start(t, env)
	addr := publishAddr(t, c)

	ans := postDelayed(t, addr, "orders.created", "never", "Courier-Delay", "4s", "Idempotency-Key", "never-1")
	keep := postDelayed(t, addr, "orders.created", "kept", "Courier-Delay", "4s", "Idempotency-Key", "kept-1")
	if ans.status != http.StatusAccepted || keep.status != http.StatusAccepted {
		t.Fatalf("answers %+v %+v", ans, keep)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"schedules", "ls"}, env, &out, io.Discard); err != nil {
		t.Fatalf("schedules ls: %v", err)
	}
	for _, want := range []string{ans.Schedule, keep.Schedule, "orders.created", "never-1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("schedules ls:\n%s\nwant %s", out.String(), want)
		}
	}
	out.Reset()
	var stderr bytes.Buffer
	if err := run(context.Background(), []string{"schedules", "cancel", ans.Schedule}, env, &out, &stderr); err != nil {
		t.Fatalf("schedules cancel: %v\n%s", err, stderr.String())
	}
	if !strings.HasPrefix(out.String(), "cancelled "+ans.Schedule) {
		t.Errorf("schedules cancel said %q", out.String())
	}
	err := run(context.Background(), []string{"schedules", "cancel", ans.Schedule}, env, io.Discard, io.Discard)
	if code := exitCode(err, io.Discard); code != 1 {
		t.Errorf("cancel again: %v (exit %d), want exit 1", err, code)
	}
	req, _ := http.NewRequest(http.MethodDelete, "http://"+addr+"/v1/schedules/"+ans.Schedule, nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("DELETE after the cancel: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}
	deliveredOnceAt(t, a, "kept", keep.at(t))
	time.Sleep(500 * time.Millisecond)
	if n := len(a.bodies("never")); n != 0 {
		t.Errorf("the cancelled message reached the app %d times", n)
	}
}

// TestScheduleLogAfterTheDurableLeavesThemOut: the first start after the
// stream was made to capture the schedules finds the durable set up
// before, taking them in; the start updates its filter, and the start-up
// log says delayed publishing is on, not off for a reason the start has
// just mended.
func TestScheduleLogAfterTheDurableLeavesThemOut(t *testing.T) {
	h := newHarness(t, withSchedules)
	natstest.Try(t, "a durable of before", func(ctx context.Context) error {
		_, err := h.js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
			Durable: "courier", Description: consumerDescription, AckPolicy: jetstream.AckExplicitPolicy})
		return err
	})
	a := newApp(t, nil)
	c := start(t, h.env(a.URL, publishEnv...))
	poll.Until(t, 10*time.Second, "the start-up line", func() bool {
		return len(logLines(c, "delayed publishing on")) > 0 || len(logLines(c, "delayed publishing off")) > 0
	})
	if off := logLines(c, "delayed publishing off"); len(off) > 0 {
		t.Errorf("start-up log says delayed publishing is off once the durable left the schedules out: %v", off[0])
	}
	if info := h.consumerInfo("courier"); info == nil || info.Config.FilterSubject != "orders.>" {
		t.Errorf("the durable's filter: %+v, want orders.>", info)
	}
	ans := postDelayed(t, publishAddr(t, c), "orders.created", "x", "Courier-Delay", "1m")
	if ans.status != http.StatusAccepted {
		t.Errorf("a delayed publish: %+v, want 202", ans)
	}
}

// TestScheduleStreamWithout: a stream that cannot hold schedules refuses a
// delayed publish with 409 naming the command that fixes it, and the
// start-up log says delayed publishing is off for it and why.
func TestScheduleStreamWithout(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	c := start(t, h.env(a.URL, publishEnv...))
	addr := publishAddr(t, c)
	want := "nats stream edit ORDERS --allow-schedules --subjects='orders.>,_sched.ORDERS.>'"
	ans := postDelayed(t, addr, "orders.created", "x", "Courier-Delay", "1m")
	if ans.status != http.StatusConflict || !strings.Contains(ans.Error, want) {
		t.Errorf("answer %d %q, want 409 naming %s", ans.status, ans.Error, want)
	}
	poll.Until(t, 5*time.Second, "the start-up line", func() bool { return len(logLines(c, "delayed publishing off")) > 0 })
	if line := fmt.Sprint(logLines(c, "delayed publishing off")[0]); !strings.Contains(line, want) {
		t.Errorf("start-up line %s, want it naming %s", line, want)
	}
	if h.streamMsgs() != 0 {
		t.Errorf("%d messages stored", h.streamMsgs())
	}
}

// TestSchedulePartitions: a partitioned durable's work stream copies the
// delayed message, never its schedule: the app gets it once, at its time.
func TestSchedulePartitions(t *testing.T) {
	h := newHarness(t, withSchedules)
	a := newApp(t, nil)
	c := start(t, h.env(a.URL, append([]string{"COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=2"}, publishEnv...)...))
	addr := publishAddr(t, c)
	admin := adminAddr(t, c)
	poll.Until(t, 20*time.Second, "courier ready", func() bool { code, _ := get(t, "http://"+admin+"/readyz"); return code == http.StatusOK })

	ans := postDelayed(t, addr, "orders.k1", "partitioned", "Courier-Delay", "2s", "Idempotency-Key", "p-1")
	if ans.status != http.StatusAccepted {
		t.Fatalf("answer %+v", ans)
	}
	deliveredOnceAt(t, a, "partitioned", ans.at(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lister := h.js.ListStreams(ctx)
	for si := range lister.Info() {
		for _, src := range si.Config.Sources {
			for _, tr := range src.SubjectTransforms {
				if strings.HasPrefix(tr.Source, "_sched") || tr.Source == ">" {
					t.Errorf("work stream %s sources %q: the schedules too", si.Config.Name, tr.Source)
				}
			}
		}
	}
}

// TestScheduleStreamFixed: the command courier names fixes the stream; the
// durable courier set up before takes the schedules in, so a delayed
// publish is refused (409, naming it) until courier restarts, whose
// durable then leaves them out; the message is then delivered once, at
// its time.
func TestScheduleStreamFixed(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	env := h.env(a.URL, publishEnv...)
	c := start(t, env)
	addr := publishAddr(t, c)
	poll.Until(t, 20*time.Second, "the durable", func() bool { return h.consumerInfo("courier") != nil })
	if ans := postDelayed(t, addr, "orders.created", "x", "Courier-Delay", "1m"); ans.status != http.StatusConflict {
		t.Fatalf("before the fix: %+v, want 409", ans)
	}

	// What `nats stream edit ORDERS --allow-schedules --subjects='orders.>,_sched.ORDERS.>'` does.
	natstest.Try(t, "fix the stream", func(ctx context.Context) error {
		cfg := jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}
		withSchedules(&cfg)
		_, err := h.js.UpdateStream(ctx, cfg)
		return err
	})
	ans := postDelayed(t, addr, "orders.created", "x", "Courier-Delay", "1m")
	if ans.status != http.StatusConflict || !strings.Contains(ans.Error, `courier's durable "courier" on stream ORDERS takes in _sched.ORDERS.>`) {
		t.Fatalf("fixed, before courier's restart: %d %q, want 409 naming the durable", ans.status, ans.Error)
	}
	if h.streamMsgs() != 0 {
		t.Fatalf("%d messages stored", h.streamMsgs())
	}

	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
	c = start(t, env)
	addr = publishAddr(t, c)
	poll.Until(t, 20*time.Second, "the durable narrowed", func() bool {
		info := h.consumerInfo("courier")
		return info != nil && info.Config.FilterSubject == "orders.>"
	})
	ans = postDelayed(t, addr, "orders.created", "fixed", "Courier-Delay", "2s", "Idempotency-Key", "fixed-1")
	if ans.status != http.StatusAccepted {
		t.Fatalf("after the restart: %+v, want 202", ans)
	}
	deliveredOnceAt(t, a, "fixed", ans.at(t))
}
