package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

// subsApp is the app of two subscriptions: it notes, by path, the
// subjects it was sent (a batch's entries one by one), and refuses
// messages whose body is "bad" (400, or DROP in a batch: subject *.bad).
type subsApp struct {
	mu  sync.Mutex
	got map[string][]string // path → subjects
}

func (a *subsApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.Header.Get("Courier-Batch") == "" {
		var body [8]byte
		n, _ := r.Body.Read(body[:])
		a.got[r.URL.Path] = append(a.got[r.URL.Path], r.Header.Get("Courier-Subject"))
		if string(body[:n]) == "bad" {
			w.WriteHeader(http.StatusBadRequest)
		}
		return
	}
	var b struct {
		Entries []struct {
			EntryID string `json:"entryId"`
			Subject string `json:"subject"`
		} `json:"entries"`
	}
	_ = json.NewDecoder(r.Body).Decode(&b)
	statuses := make([]map[string]string, 0, len(b.Entries))
	for _, e := range b.Entries {
		a.got[r.URL.Path] = append(a.got[r.URL.Path], e.Subject)
		status := "SUCCESS"
		if strings.HasSuffix(e.Subject, ".bad") {
			status = "DROP"
		}
		statuses = append(statuses, map[string]string{"entryId": e.EntryID, "status": status})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"statuses": statuses})
}

func (a *subsApp) count(path string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.got[path])
}

// subsEnv is the environment of a courier serving orders (stream ORDERS,
// order per key, routes) and payments (stream PAYMENTS, batches), each to
// its own app URL.
func subsEnv(h *harness, ordersURL, paymentsURL string, extra ...string) []string {
	return h.env(ordersURL, append([]string{
		"COURIER_SUBSCRIPTIONS=orders,payments",
		"COURIER_SUB_ORDERS_STREAM=ORDERS",
		"COURIER_SUB_ORDERS_ORDER_KEY=header:Order",
		"COURIER_SUB_ORDERS_ROUTES=orders.*.created=/created",
		"COURIER_SUB_PAYMENTS_STREAM=PAYMENTS",
		"COURIER_SUB_PAYMENTS_APP_URL=" + paymentsURL,
		"COURIER_SUB_PAYMENTS_BATCH_MAX=8",
		"COURIER_SUB_PAYMENTS_BATCH_WAIT=5ms",
		"COURIER_LOG_LEVEL=info",
	}, extra...)...)
}

func paymentsStream(t *testing.T, h *harness) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := h.js.CreateStream(ctx, jetstream.StreamConfig{Name: "PAYMENTS", Subjects: []string{"payments.>"}}); err != nil {
		t.Fatal(err)
	}
}

// Two streams in one courier, each its own delivery path: orders to its
// routes' paths in order per key, payments in batches to its own URL;
// dead letters each on its own subject; every metric of a path labelled
// with its subscription. An outage of the payments app does not hold
// orders back, and /readyz names the subscription that is not ready.
// courier status takes --subscription.
func TestSubscriptions(t *testing.T) {
	h := newHarness(t)
	paymentsStream(t, h)
	a := &subsApp{got: map[string][]string{}}
	orders := httptest.NewServer(a)
	t.Cleanup(orders.Close)
	// The payments app is not there at first: a port nobody listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	paymentsAddr := ln.Addr().String()
	ln.Close()
	env := subsEnv(h, orders.URL+"/orders", "http://"+paymentsAddr+"/payments")
	c := start(t, env)
	admin := adminAddr(t, c)

	for i := range 10 {
		h.publish(fmt.Sprintf("orders.%d.created", i), "{}", map[string]string{"Order": "o" + strconv.Itoa(i%3)})
		h.publish(fmt.Sprintf("orders.%d.paid", i), "{}", map[string]string{"Order": "o" + strconv.Itoa(i%3)})
		h.publish(fmt.Sprintf("payments.%d", i), "{}", nil)
	}
	h.publish("orders.x.paid", "bad", nil)
	h.publish("payments.bad", "bad", nil)
	poll.Until(t, 20*time.Second, "orders delivered while the payments app is down", func() bool {
		return a.count("/created") == 10 && a.count("/orders") == 11
	})
	poll.Until(t, 10*time.Second, "/readyz naming payments", func() bool {
		code, body := get(t, "http://"+admin+"/readyz")
		return code != http.StatusOK && strings.Contains(body, "subscription payments") && !strings.Contains(body, "subscription orders")
	})
	if a.count("/payments") != 0 {
		t.Fatalf("payments delivered with its app down")
	}
	// The payments app comes up where its URL points.
	pl, err := net.Listen("tcp", paymentsAddr)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", paymentsAddr, err)
	}
	payments := &httptest.Server{Listener: pl, Config: &http.Server{Handler: a}}
	payments.Start()
	t.Cleanup(payments.Close)
	poll.Until(t, 30*time.Second, "payments delivered once its app is up", func() bool { return a.count("/payments") >= 11 })
	poll.Until(t, 20*time.Second, "both durables settled", func() bool {
		return h.settled("courier") && h.consumerSettled("PAYMENTS", "courier")
	})
	waitReady(t, c)

	// Dead letters, each on its subscription's subject.
	if n := len(h.deadLetters("dlq.ORDERS.courier")); n != 1 {
		t.Errorf("%d dead letters of orders, want 1", n)
	}
	if n := len(h.deadLetters("dlq.PAYMENTS.courier")); n != 1 {
		t.Errorf("%d dead letters of payments, want 1", n)
	}
	// Metrics of each path carry its subscription.
	g := metrics(admin)
	for sub, want := range map[string]float64{"orders": 20, "payments": 10} {
		if v := metricstest.Value(t, g, "courier_messages_total", "outcome", "delivered", "subscription", sub); v != want {
			t.Errorf("courier_messages_total{outcome=delivered,subscription=%q} %v, want %v", sub, v, want)
		}
		if v := metricstest.Value(t, g, "courier_dead_letters_total", "subscription", sub, "reason", "rejected"); v != 1 {
			t.Errorf("courier_dead_letters_total{subscription=%q,reason=rejected} %v, want 1", sub, v)
		}
	}

	// courier status picks one subscription, and asks which with several.
	var out, errOut strings.Builder
	if err := run(context.Background(), []string{"status", "--subscription", "payments"}, env, &out, &errOut); err != nil {
		t.Fatalf("courier status --subscription payments: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "PAYMENTS/courier") || !strings.Contains(out.String(), "dlq.PAYMENTS.courier") {
		t.Errorf("courier status --subscription payments:\n%s", out.String())
	}
	out.Reset()
	err = run(context.Background(), []string{"status"}, env, &out, &errOut)
	if code := exitCode(err, &errOut); code != 2 || !strings.Contains(errOut.String(), "--subscription") {
		t.Errorf("courier status with two subscriptions: exit %d, %s; want 2 asking for --subscription", code, errOut.String())
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
}

// Both subscriptions draining in a courier killed with SIGKILL and
// started again, each with an automatic in-flight limit: nothing lost, and
// what reaches the app twice is at most what each path had at the app
// when it died.
func TestSubscriptionsThroughAKill(t *testing.T) {
	h := newHarness(t)
	paymentsStream(t, h)
	mu, seen, app := countingApp(t)
	const n = 300
	for i := range n {
		h.publish(fmt.Sprintf("orders.%d.paid", i), "{}", map[string]string{"Order": "o" + strconv.Itoa(i%10)})
		h.publish(fmt.Sprintf("payments.%d", i), "{}", nil)
	}
	dir := t.TempDir()
	// The in-flight limit automatic, at most 4, as each path finds it.
	env := subsEnv(h, app.URL+"/orders", app.URL+"/payments", "COURIER_DEDUP_DIR="+dir, "COURIER_ACK_WAIT=2s",
		"COURIER_MAX_INFLIGHT=auto:4")
	first := startChild(t, env)
	poll.Until(t, 20*time.Second, "both draining", func() bool {
		mu.Lock()
		defer mu.Unlock()
		o, p := 0, 0
		for s := range seen {
			if strings.HasPrefix(s, "orders.") {
				o++
			} else {
				p++
			}
		}
		return o > 50 && p > 50
	})
	first.kill(t)
	second := startChild(t, env)
	waitReady(t, second.asCourier())
	poll.Until(t, 60*time.Second, "both durables settled", func() bool {
		return h.settled("courier") && h.consumerSettled("PAYMENTS", "courier")
	})
	mu.Lock()
	defer mu.Unlock()
	dups := subscriptionDuplicates(t, seen, n)
	// orders: 4 requests in flight, and what was answered 2xx but not yet
	// recorded (a worker hands its 2xx to the recorder and takes the next
	// message: a few milliseconds, one a worker at most but for a slow
	// store); payments: 4 batch requests of 8, each batch's slot waiting
	// for its keys to be recorded.
	if dups["orders"] > 2*4 || dups["payments"] > 4*8 {
		t.Errorf("duplicates %v, want at most 8 for orders and 32 for payments (what each had at the app, or answered and not yet recorded)", dups)
	}
	t.Logf("duplicates through the kill: %v", dups)
}

// consumerSettled reports whether consumer name on stream has delivered
// everything and nothing waits for an ack (redeliveries allowed).
func (h *harness) consumerSettled(stream, name string) bool {
	info := h.consumerInfoOn(stream, name)
	return info != nil && info.NumPending == 0 && info.NumAckPending == 0
}

// Two subscriptions with the shared store, three couriers (processes) on a
// 3-node cluster, one of them killed with SIGKILL: every message of both
// streams reaches the app, nothing dead-lettered, and what reaches it twice
// is at most what the killed courier had at the app.
func TestSubscriptionsOnACluster(t *testing.T) {
	k := newCluster(t)
	natsTry(t, k, jetstream.StreamConfig{Name: "PAYMENTS", Subjects: []string{"payments.>"}, Replicas: 3})
	mu, seen, app := countingApp(t)
	const n = 200
	for i := range n {
		k.publishRetry(fmt.Sprintf("orders.%d.paid", i), "{}", map[string]string{"Order": "o" + strconv.Itoa(i%10), "Nats-Msg-Id": "o" + strconv.Itoa(i)})
		k.publishRetry(fmt.Sprintf("payments.%d", i), "{}", map[string]string{"Nats-Msg-Id": "p" + strconv.Itoa(i)})
	}
	env := func(i int) []string {
		return k.env(app.URL+"/orders", i,
			"COURIER_SUBSCRIPTIONS=orders,payments", "COURIER_ACK_WAIT=2s", "COURIER_MAX_INFLIGHT=4",
			"COURIER_SUB_ORDERS_STREAM=ORDERS", "COURIER_SUB_ORDERS_ORDER_KEY=header:Order",
			"COURIER_SUB_PAYMENTS_STREAM=PAYMENTS", "COURIER_SUB_PAYMENTS_APP_URL="+app.URL+"/payments",
			"COURIER_SUB_PAYMENTS_BATCH_MAX=8", "COURIER_SUB_PAYMENTS_BATCH_WAIT=5ms")
	}
	cs := []*child{startChild(t, env(0)), startChild(t, env(1)), startChild(t, env(2))}
	for _, c := range cs {
		waitReady(t, c.asCourier())
	}
	poll.Until(t, 30*time.Second, "both draining", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 100
	})
	cs[0].kill(t)
	poll.Until(t, 90*time.Second, "both durables settled", func() bool {
		return k.drained() && k.consumerSettled("PAYMENTS", "courier")
	})
	mu.Lock()
	defer mu.Unlock()
	byStream := subscriptionDuplicates(t, seen, n)
	dups := byStream["orders"] + byStream["payments"]
	// The killed courier had at most 4 orders and 4 batches of 8 payments
	// at the app.
	if dups > 4+4*8 {
		t.Errorf("%d duplicates, want at most %d", dups, 4+4*8)
	}
	k.noDeadLetters()
	if dls := k.deadLetters("dlq.PAYMENTS.courier"); len(dls) > 0 {
		t.Errorf("%d dead letters of payments", len(dls))
	}
	t.Logf("%d duplicates through the kill", dups)
}

// natsTry creates stream sc on k, trying again while the cluster cannot
// answer yet.
func natsTry(t *testing.T, k *cluster, sc jetstream.StreamConfig) {
	t.Helper()
	natstest.Try(t, "creating stream "+sc.Name, func(ctx context.Context) error {
		_, err := k.js.CreateStream(ctx, sc)
		return err
	})
}

// countingApp is an app that takes 2ms a request and counts, under mu,
// the requests of each subject (a batch's entries one by one).
func countingApp(t *testing.T) (mu *sync.Mutex, seen map[string]int, app *httptest.Server) {
	t.Helper()
	mu, seen = &sync.Mutex{}, map[string]int{}
	app = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		if r.Header.Get("Courier-Batch") == "" {
			seen[r.Header.Get("Courier-Subject")]++
			return
		}
		var b struct {
			Entries []struct {
				Subject string `json:"subject"`
			} `json:"entries"`
		}
		_ = json.NewDecoder(r.Body).Decode(&b)
		for _, e := range b.Entries {
			seen[e.Subject]++
		}
	}))
	t.Cleanup(app.Close)
	return mu, seen, app
}

// subscriptionDuplicates fails t for each of the n orders and n payments
// the app never saw, and returns how many times more than once it saw
// those of each stream ("orders", "payments").
func subscriptionDuplicates(t *testing.T, seen map[string]int, n int) map[string]int {
	t.Helper()
	dups := map[string]int{}
	for i := range n {
		for _, s := range []string{fmt.Sprintf("orders.%d.paid", i), fmt.Sprintf("payments.%d", i)} {
			switch c := seen[s]; {
			case c == 0:
				t.Errorf("%s lost", s)
			case c > 1:
				dups[strings.SplitN(s, ".", 2)[0]] += c - 1
			}
		}
	}
	return dups
}
