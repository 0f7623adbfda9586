package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// The runner says it is delivering a message while a worker has it at the
// app and, with order per key, while its key's line awaits its retry (the
// message is then with JetStream, NAK'd with a delay); not once it is
// acked, nor a message it never had.
func TestRunnerDelivering(t *testing.T) {
	e := setup(t)
	release := make(chan struct{})
	var retryPlain atomic.Bool // the next plain message's first attempt is answered 503
	keyed, plain := make(chan struct{}, 4), make(chan struct{}, 4)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Order") == "" {
			if plain <- struct{}{}; r.Header.Get(proxy.HeaderAttempt) == "1" && retryPlain.CompareAndSwap(true, false) {
				w.Header().Set("Retry-After", "3")
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
		} else if keyed <- struct{}{}; r.Header.Get(proxy.HeaderAttempt) == "1" {
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		<-release
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
	o := orderOptions(t)
	o.RetryAfterMax = time.Minute
	r, _ := e.runWith(t, nil, o)
	publish := func(key string) uint64 {
		t.Helper()
		m := nats.NewMsg("s.order")
		if key != "" {
			m.Header.Set("Order", key)
		}
		ack, err := e.js.PublishMsg(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}

	// Without a key: with a worker, at the app.
	first := publish("")
	<-plain
	if !r.Delivering(first) {
		t.Error("Delivering = false while the app has the message")
	}

	// With one: answered 503 with Retry-After: 3, then awaited.
	seq := publish("k")
	<-keyed
	poll.Until(t, 5*time.Second, "the retry", func() bool {
		return counter(t, e.reg, "courier_messages_total", "retried") == 1
	})
	if !r.Delivering(seq) {
		t.Error("Delivering = false while its key's line awaits the message's retry")
	}
	if r.Delivering(seq + 1) {
		t.Error("Delivering = true for a message the runner never had")
	}
	<-keyed // the retry, now at the app
	if !r.Delivering(seq) {
		t.Error("Delivering = false while the app has the retried message")
	}

	// Without a key, given back to be retried after a delay: still being
	// delivered until the delay and an ack wait have run out.
	retryPlain.Store(true)
	retried := publish("")
	<-plain
	poll.Until(t, 5*time.Second, "the plain message's retry", func() bool {
		return counter(t, e.reg, "courier_messages_total", "retried") == 2
	})
	if !r.Delivering(retried) {
		t.Error("Delivering = false while the message waits out its retry's delay")
	}

	close(release)
	poll.Until(t, 5*time.Second, "the messages acked", func() bool { return e.settled(t) })
	poll.Until(t, 5*time.Second, "the runner done with them", func() bool { return !r.Delivering(first) && !r.Delivering(seq) })
}
