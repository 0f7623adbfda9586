package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/ordermark"
)

// orderApp answers each request of key "k" and "other" and records, per
// key, the N header of each 2xx in the order answered; hold decides a
// status for a request.
type orderRecorder struct {
	mu     sync.Mutex
	ok     map[string][]int
	seen   map[string][]int
	status func(key string, n, attempt int) (int, string)
}

func newOrderRecorder(t *testing.T, status func(key string, n, attempt int) (int, string)) (*orderRecorder, string) {
	t.Helper()
	a := &orderRecorder{ok: map[string][]int{}, seen: map[string][]int{}, status: status}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Order")
		n, _ := strconv.Atoi(r.Header.Get("N"))
		attempt, _ := strconv.Atoi(r.Header.Get("Courier-Attempt"))
		code, retryAfter := 200, ""
		if a.status != nil {
			code, retryAfter = a.status(key, n, attempt)
		}
		a.mu.Lock()
		a.seen[key] = append(a.seen[key], n)
		if code < 300 {
			a.ok[key] = append(a.ok[key], n)
		}
		a.mu.Unlock()
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(srv.Close)
	return a, srv.URL
}

func (a *orderRecorder) delivered(key string) []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]int(nil), a.ok[key]...)
}

// A courier killed (SIGKILL) while a key's first message waits out a retry
// (Retry-After 4s) and its later messages wait behind it: the later ones
// come back first (their ack wait, 2s, runs out before the retry is due),
// and the courier that follows still sends the key in stream order, from
// the mark the first left in its bucket.
func TestOrderThroughAKill(t *testing.T) {
	h, a, url, retried := keyRetriedOnce(t, "4")
	h.publish("orders.other", "x", map[string]string{"Order": "other", "N": "0"})
	env := h.env(url, "COURIER_ORDER_KEY=header:Order", "COURIER_ACK_WAIT=2s", "COURIER_LOG_LEVEL=info")
	ch := startChild(t, env)
	poll.Until(t, 30*time.Second, "k's first message retried, other delivered", func() bool {
		return retried() && len(a.delivered("other")) == 1
	})
	// Its later messages wait behind it, its mark written.
	poll.Until(t, 15*time.Second, "k's mark in the bucket", func() bool {
		kv, err := h.js.KeyValue(context.Background(), ordermark.BucketName("ORDERS", "courier"))
		if err != nil {
			return false
		}
		keys, err := kv.Keys(context.Background())
		return err == nil && len(keys) == 1
	})
	ch.kill(t)

	c := start(t, env)
	poll.Until(t, 30*time.Second, "every message settled", func() bool { return h.settled("courier") })
	// courier status names the courier the durable is pinned to.
	var out, errOut strings.Builder
	if err := run(context.Background(), []string{"status"}, env, &out, &errOut); err != nil {
		t.Fatalf("courier status: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "pinned (courier)") || strings.Contains(out.String(), "pinned (courier)  nobody") {
		t.Errorf("courier status does not name the pinned courier:\n%s", out.String())
	}
	// Checked before the stop, which shows the courier's logs if it failed.
	if got := a.delivered("k"); fmt.Sprint(got) != "[0 1 2 3 4]" {
		t.Errorf("k delivered in the order %v, want [0 1 2 3 4]", got)
	}
	if got := h.deadLetters("dlq.ORDERS.courier"); len(got) != 0 {
		t.Errorf("%d dead letters", len(got))
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
}

// SIGTERM while a key's first message waits out a retry and its later
// messages wait behind it: the courier gives them back in stream order, and
// the one that starts next sends the key in stream order.
func TestOrderThroughASigterm(t *testing.T) {
	h, a, url, retried := keyRetriedOnce(t, "2")
	env := h.env(url, "COURIER_ORDER_KEY=header:Order", "COURIER_LOG_LEVEL=info")
	c := start(t, env)
	poll.Until(t, 30*time.Second, "k's first message retried", retried)
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
	c = start(t, env)
	poll.Until(t, 30*time.Second, "every message settled", func() bool { return h.settled("courier") })
	if got := a.delivered("k"); fmt.Sprint(got) != "[0 1 2 3 4]" {
		t.Errorf("k delivered in the order %v, want [0 1 2 3 4]", got)
	}
	if err := c.stop(); err != nil {
		t.Fatalf("courier: %v", err)
	}
}

// keyRetriedOnce is a harness with five messages of key "k" (N 0..4) and an
// app that answers the first one 503 with Retry-After retryAfter, once, and
// everything else 2xx; retried reports whether that answer was given.
func keyRetriedOnce(t *testing.T, retryAfter string) (h *harness, a *orderRecorder, url string, retried func() bool) {
	t.Helper()
	h = newHarness(t)
	var mu sync.Mutex
	failed := false
	a, url = newOrderRecorder(t, func(key string, n, attempt int) (int, string) {
		mu.Lock()
		defer mu.Unlock()
		if key == "k" && n == 0 && !failed {
			failed = true
			return 503, retryAfter
		}
		return 200, ""
	})
	for n := range 5 {
		h.publish("orders.k", "x", map[string]string{"Order": "k", "N": strconv.Itoa(n)})
	}
	return h, a, url, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return failed
	}
}
