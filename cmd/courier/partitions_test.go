package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/ordermark"
	"github.com/courierhq/courier/partition"
)

// keyApp records, per key (the Order header), the N header of each 2xx in
// the order answered, which courier sent it, and any request of a key that
// came while another of that key was at the app.
type keyApp struct {
	mu       sync.Mutex
	ok       map[string][]int
	busy     map[string]bool
	overlaps int
	by       map[string]int // courier → 2xx answered
}

// url serves the app for the courier named by, answering each request 2xx
// after took.
func (a *keyApp) url(t *testing.T, by string, took time.Duration) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Order")
		n, _ := strconv.Atoi(r.Header.Get("N"))
		a.mu.Lock()
		if a.busy[key] {
			a.overlaps++
		}
		a.busy[key] = true
		a.mu.Unlock()
		time.Sleep(took)
		a.mu.Lock()
		a.busy[key] = false
		a.ok[key] = append(a.ok[key], n)
		a.by[by]++
		a.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// inOrder reports whether key's 2xx calls went 0..n-1 in stream order: a
// message repeated right after itself (its courier killed before the ack)
// is a redelivery, not a break of the order.
func (a *keyApp) inOrder(key string, n int) (bool, []int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	got := append([]int(nil), a.ok[key]...)
	next := 0
	for i, v := range got {
		switch {
		case v == next:
			next++
		case i > 0 && v == got[i-1]:
		default:
			return false, got
		}
	}
	return next == n, got
}

func (a *keyApp) count(by string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.by[by]
}

// Two couriers on a durable in eight partitions (sharing their dedup keys),
// one of them a real process killed (SIGKILL) while keys are under way (a
// slow app): the other takes its partitions once their pins lapse, and
// every key reaches the app in stream order, nothing lost. courier status then names the courier that
// holds each partition's pin.
func TestPartitionsThroughAKill(t *testing.T) {
	h := newHarness(t)
	a := &keyApp{ok: map[string][]int{}, busy: map[string]bool{}, by: map[string]int{}}
	env := func(by string) []string {
		return h.env(a.url(t, by, 50*time.Millisecond), "COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=8",
			"COURIER_ACK_WAIT=2s", "COURIER_MAX_INFLIGHT=4", "COURIER_LOG_LEVEL=info", "COURIER_DEDUP_DIR="+t.TempDir(),
			// Replicas share their keys: a message the killed one had
			// answered but not acked yet is not sent again.
			"COURIER_DEDUP_STORE=shared")
	}
	const keys, n = 16, 40
	publish := func(i int) {
		for k := range keys {
			h.publish(fmt.Sprintf("orders.k%d.e", k), "x", map[string]string{"Order": fmt.Sprintf("k%d", k), "N": strconv.Itoa(i)})
		}
	}
	// The stream is written to throughout, a round of the keys every
	// 100ms: real time is what the kill interrupts.
	published := make(chan struct{})
	go func() {
		defer close(published)
		for i := range n {
			publish(i)
			time.Sleep(100 * time.Millisecond)
		}
	}()
	killed := startChild(t, env("killed"))
	poll.Until(t, 30*time.Second, "the first courier delivering", func() bool { return a.count("killed") > 0 })
	c := start(t, env("other"))
	// The partitions are shared out by the couriers' random ids: the first
	// may keep all of them, or hand all on. Either way it is killed with
	// what it holds under way.
	poll.Until(t, 30*time.Second, "both couriers members", func() bool { return len(logLines(c, "sharing the durable")) > 0 })
	before := a.count("killed") + a.count("other")
	poll.Until(t, 30*time.Second, "deliveries going on", func() bool { return a.count("killed")+a.count("other") > before+20 })
	killed.kill(t)
	<-published
	allInOrder := func() bool {
		for k := range keys {
			if ok, _ := a.inOrder(fmt.Sprintf("k%d", k), n); !ok {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(90 * time.Second); !allInOrder() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // polled: the keys' deliveries are the condition
	}
	for k := range keys {
		if ok, got := a.inOrder(fmt.Sprintf("k%d", k), n); !ok {
			t.Errorf("k%d delivered in the order %v, want 0..%d (a message repeated right after itself allowed)", k, got, n-1)
		}
	}
	if a.overlaps != 0 {
		t.Errorf("%d requests of a key while an earlier one of the key was at the app", a.overlaps)
	}
	checkPartitionStatus(t, env("status"))
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
}

// checkPartitionStatus runs courier status and checks that it lists the
// eight partitions, each pinned to a courier of the membership.
func checkPartitionStatus(t *testing.T, env []string) {
	t.Helper()
	var out, errOut strings.Builder
	if err := run(context.Background(), []string{"status"}, env, &out, &errOut); err != nil {
		t.Fatalf("courier status: %v\n%s", err, errOut.String())
	}
	text := out.String()
	couriers := regexp.MustCompile(`(?m)^couriers\s+(.+)$`).FindStringSubmatch(text)
	if couriers == nil {
		t.Fatalf("courier status lists no couriers:\n%s", text)
	}
	for i := range 8 {
		line := regexp.MustCompile(`(?m)^courier-p` + strconv.Itoa(i) + `\s.*$`).FindString(text)
		pinned := regexp.MustCompile(`pinned to (\S+) since`).FindStringSubmatch(line)
		if pinned == nil || !strings.Contains(couriers[1], pinned[1]) {
			t.Errorf("partition %d is not shown pinned to a courier of the membership (%s):\n%s", i, couriers[1], text)
		}
	}
}

// The settings partitions cannot work with stop courier, saying why: a
// header key (the server partitions by subject tokens only), one partition,
// and a stream whose subject has a literal where the key's token is.
func TestPartitionsRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stream  []string
		extra   []string
		code    int
		sayings []string
	}{
		{"header key", nil, []string{"COURIER_ORDER_KEY=header:Order", "COURIER_ORDER_PARTITIONS=8"}, 2,
			[]string{"COURIER_ORDER_PARTITIONS", "subject:N", "never from a header"}},
		{"one partition", nil, []string{"COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=1"}, 2,
			[]string{"COURIER_ORDER_PARTITIONS", "from 2"}},
		{"literal key token", []string{"orders.eu.*"}, []string{"COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=8"}, 1,
			[]string{`"orders.eu.*"`, `"eu" as its token 2`, "wildcard"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(sc *jetstream.StreamConfig) {
				if tc.stream != nil {
					sc.Subjects = tc.stream
				}
			})
			err := run(context.Background(), nil, h.env("http://127.0.0.1:1/", tc.extra...), io.Discard, io.Discard)
			var out bytes.Buffer
			if code := exitCode(err, &out); code != tc.code {
				t.Fatalf("exit %d, want %d: %q", code, tc.code, out.String())
			}
			for _, want := range tc.sayings {
				if !strings.Contains(out.String(), want) {
					t.Errorf("error does not say %q: %q", want, out.String())
				}
			}
			if _, err := h.js.Stream(context.Background(), partition.StreamName("ORDERS", "courier")); err == nil {
				t.Error("a work stream was created though courier refused to start")
			}
		})
	}
}

// courier pause and resume act on every partition, status says so, and
// cleanup removes what partitions need beside the stream (the work stream,
// its advisory stream, the membership and marks buckets), never the stream.
func TestPartitionsPauseAndCleanup(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	env := h.env(a.URL, "COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=4")
	for i := range 3 {
		h.publish(fmt.Sprintf("orders.k%d.e", i), "x", nil)
	}
	c := start(t, env)
	work := partition.StreamName("ORDERS", "courier")
	poll.Until(t, 20*time.Second, "every message delivered and settled", func() bool {
		return a.count() == 3 && h.streamExists(work) && h.streamMsgsOf(work) == 0
	})
	command := func(args ...string) string {
		t.Helper()
		var out, errOut strings.Builder
		if err := run(context.Background(), args, env, &out, &errOut); err != nil {
			t.Fatalf("courier %s: %v\n%s", args[0], err, errOut.String())
		}
		return out.String()
	}
	if out := command("pause", "--for", "1m"); !strings.Contains(out, "paused ORDERS/courier (4 partitions)") {
		t.Errorf("courier pause: %q", out)
	}
	if out := command("status"); !regexp.MustCompile(`(?m)^paused\s+until `).MatchString(out) {
		t.Errorf("courier status after pause:\n%s", out)
	}
	if out := command("resume"); !strings.Contains(out, "resumed ORDERS/courier (4 partitions)") {
		t.Errorf("courier resume: %q", out)
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	if !h.streamExists(giveup.StreamName(work, giveup.AllConsumers)) {
		t.Error("no stream captures the partitions' max-deliveries advisories")
	}
	out, code := h.cleanupRun(t, "--yes")
	if code != 0 {
		t.Fatalf("cleanup: exit %d\n%s", code, out)
	}
	for _, name := range []string{work, giveup.StreamName(work, giveup.AllConsumers),
		"KV_" + partition.MembersBucket("ORDERS", "courier"), "KV_" + ordermark.PartitionsBucketName("ORDERS", "courier")} {
		if h.streamExists(name) {
			t.Errorf("%s left after cleanup:\n%s", name, out)
		}
	}
	if !h.streamExists("ORDERS") {
		t.Error("cleanup removed the stream courier consumes")
	}
}
