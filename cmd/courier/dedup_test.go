package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/internal/poll"
)

func TestSameKeyTwiceOneRequest(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	h.publish("orders.created", "first", map[string]string{"Idempotency-Key": "order-7"})
	h.publish("orders.created", "again", map[string]string{"Idempotency-Key": "order-7"})
	h.publish("orders.created", "other", map[string]string{"Idempotency-Key": "order-8"})
	start(t, h.env(a.URL, "COURIER_MAX_INFLIGHT=1"))
	poll.Until(t, 10*time.Second, "all three acked", func() bool { return h.settled("courier") })
	if a.calls("order-7") != 1 || a.calls("order-8") != 1 {
		t.Errorf("app calls: order-7 %d, order-8 %d; want 1 each", a.calls("order-7"), a.calls("order-8"))
	}
}

func TestSameKeyConcurrentlyOneRequest(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		time.Sleep(300 * time.Millisecond) // the others arrive meanwhile
		w.WriteHeader(http.StatusOK)
	})
	for i := 0; i < 20; i++ {
		h.publish("orders.created", fmt.Sprint(i), map[string]string{"Idempotency-Key": "same"})
	}
	start(t, h.env(a.URL, "COURIER_MAX_INFLIGHT=16"))
	poll.Until(t, 15*time.Second, "all acked", func() bool { return h.settled("courier") })
	if n := a.calls("same"); n != 1 {
		t.Errorf("app called %d times for one key, want 1", n)
	}
}

func TestConcurrentDuplicateCallsAppIfFirstFailed(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		time.Sleep(200 * time.Millisecond)
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	h.publish("orders.created", "a", map[string]string{"Idempotency-Key": "k"})
	h.publish("orders.created", "b", map[string]string{"Idempotency-Key": "k"})
	start(t, h.env(a.URL, "COURIER_MAX_INFLIGHT=4"))
	poll.Until(t, 10*time.Second, "all acked", func() bool { return h.settled("courier") })
	// First fails; the waiting second calls the app (2); the first's retry
	// is then a duplicate.
	if n := a.calls("k"); n != 2 {
		t.Errorf("app called %d times, want 2", n)
	}
	for _, r := range a.requests() {
		if r.Header.Get("Courier-Attempt") != "1" {
			t.Errorf("the waiting delivery must not spend attempts: got attempt %s", r.Header.Get("Courier-Attempt"))
		}
	}
}

// A redelivery after a 2xx whose ack was lost: the key was recorded, so the
// app is not called again. The state "recorded, not acked" is made by
// recording the message's derived key before courier sees the message.
func TestRedeliveryAfterLostAckNoSecondRequest(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	seq := h.publish("orders.created", "x", nil)
	ctx := context.Background()
	s, err := h.js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("ORDERS:%d:%d", s.CachedInfo().Created.UnixNano(), seq)
	store, err := dedup.Open(h.dir, dedup.Options{TTL: time.Hour, Scope: "ORDERS/courier"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Record(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "the duplicate acked", func() bool { return h.settled("courier") })
	if a.count() != 0 {
		t.Errorf("app called %d times for a message already processed", a.count())
	}
}

func TestKeysSurviveRestart(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	h.publish("orders.created", "x", map[string]string{"Idempotency-Key": "persist"})
	c := start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "delivered", func() bool { return a.count() == 1 && h.settled("courier") })
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	h.publish("orders.created", "x", map[string]string{"Idempotency-Key": "persist"})
	start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "the duplicate acked", func() bool { return h.settled("courier") })
	if a.calls("persist") != 1 {
		t.Errorf("app called %d times across a restart, want 1", a.calls("persist"))
	}
}

func TestKeyForgottenAfterTTL(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	h.publish("orders.created", "x", map[string]string{"Idempotency-Key": "brief"})
	start(t, h.env(a.URL, "COURIER_DEDUP_TTL=1s"))
	poll.Until(t, 10*time.Second, "delivered", func() bool { return a.count() == 1 && h.settled("courier") })
	// Badger's TTL is in whole wall-clock seconds: after two, the key is
	// certainly gone. There is no condition to poll without calling the app.
	time.Sleep(2100 * time.Millisecond)
	h.publish("orders.created", "x", map[string]string{"Idempotency-Key": "brief"})
	poll.Until(t, 10*time.Second, "the expired key delivered again", func() bool { return a.calls("brief") == 2 })
}

func TestDedupOffEveryDeliveryReachesApp(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	h.publish("orders.created", "x", map[string]string{"Idempotency-Key": "k"})
	h.publish("orders.created", "x", map[string]string{"Idempotency-Key": "k"})
	start(t, h.env(a.URL, "COURIER_DEDUP_TTL=0"))
	poll.Until(t, 10*time.Second, "both delivered", func() bool { return a.calls("k") == 2 && h.settled("courier") })
}

func TestSecondCourierOnSameDirFails(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	c := start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "the first courier consuming", func() bool {
		return strings.Contains(c.logs.String(), `"msg":"consuming"`)
	})
	err := run(context.Background(), nil, h.env(a.URL), io.Discard, io.Discard)
	if err == nil {
		t.Fatal("second courier on the same directory started")
	}
	var out strings.Builder
	if code := exitCode(err, &out); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if !strings.Contains(out.String(), h.dir) || !strings.Contains(out.String(), "locked") {
		t.Errorf("error must name the directory and the lock: %q", out.String())
	}
}

// With the shared key-value store, two couriers on one durable (each with
// its own directory) call the app once for a key, whichever gets it.
func TestSharedKVStoreAcrossCouriers(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, func(w http.ResponseWriter, r *http.Request, n int) {
		time.Sleep(50 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	})
	start(t, h.env(a.URL, "COURIER_DEDUP_STORE=shared", "COURIER_DEDUP_DIR="+t.TempDir()))
	start(t, h.env(a.URL, "COURIER_DEDUP_STORE=shared", "COURIER_DEDUP_DIR="+t.TempDir()))
	for i := 0; i < 10; i++ {
		// One at a time, so each copy after the first finds its key
		// recorded, on whichever courier it lands.
		h.publish("orders.created", fmt.Sprint("copy ", i), map[string]string{"Idempotency-Key": fmt.Sprint("k", i%2)})
		poll.Until(t, 10*time.Second, "the copy acked", func() bool { return h.settled("courier") })
	}
	if a.calls("k0") != 1 || a.calls("k1") != 1 {
		t.Errorf("app calls: k0 %d, k1 %d; want 1 each", a.calls("k0"), a.calls("k1"))
	}
}

// A second courier on a locked store stops before it touches the server
// (#16): neither its consumer nor its dead-letter stream is created.
func TestLockedStoreTouchesNothingOnTheServer(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	c := start(t, h.env(a.URL))
	poll.Until(t, 10*time.Second, "the first courier consuming", func() bool {
		return strings.Contains(c.logs.String(), `"msg":"consuming"`)
	})
	err := run(context.Background(), nil, h.env(a.URL, "COURIER_CONSUMER=second"), io.Discard, io.Discard)
	var out strings.Builder
	if code := exitCode(err, &out); code != 1 || !strings.Contains(out.String(), "locked") {
		t.Fatalf("exit %d, want 1 naming the lock: %q", code, out.String())
	}
	if h.consumerInfo("second") != nil {
		t.Error("the second courier created its consumer before finding the store locked")
	}
	if dls := h.deadLetters("dlq.ORDERS.second"); dls != nil {
		t.Error("the second courier created its dead-letter stream before finding the store locked")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if name, err := h.js.StreamNameBySubject(ctx, "dlq.ORDERS.second"); err == nil {
		t.Errorf("stream %q captures the second courier's dead letters", name)
	}
}
