package proxy_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// Two replicas, one key (COURIER_DEDUP_STORE=shared): the first replica takes the key's
// claim and is then held by an app outage longer than the claim's TTL. The
// second replica's delivery of the same key must still wait for the first's
// outcome, not take the claim over while its holder is alive and about to
// send: when the app comes back it is called once for the key.
func TestSharedClaimKeptWhileHeld(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	streams(t, js)

	// The app's address, not listening yet: an outage. Reserved on
	// 127.0.0.2 where the system has it (Linux routes all of 127/8 to
	// loopback): the servers of this and the other packages' tests listen
	// on 127.0.0.1:0, and one could take the port while it is free.
	l, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		l, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	var calls atomic.Int32
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(proxy.HeaderIdempotencyKey) == "K" {
			calls.Add(1)
		}
	})}
	t.Cleanup(func() { _ = app.Close() })

	const claimTTL = time.Second
	regs := map[string]*prometheus.Registry{}
	replica := func(name, subject string) *proxy.Runner {
		cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{
			Durable: name, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5,
			AckWait: 5 * time.Second, FilterSubject: subject,
		})
		if err != nil {
			t.Fatal(err)
		}
		local, err := dedup.Open(t.TempDir(), dedup.Options{TTL: time.Hour, Scope: "S/c"})
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		regs[name] = reg
		var sh *dedup.Shared
		natstest.Try(t, "OpenShared", func(ctx context.Context) error {
			sh, err = dedup.OpenShared(ctx, js, local, dedup.SharedOptions{TTL: time.Hour, ClaimTTL: claimTTL, Scope: "S/c", Registerer: reg})
			return err
		})
		r, err := proxy.New(cons, dlq.NewPublisher(js, "dlq.s"), sh, proxy.Options{
			AppURL: "http://" + addr, Stream: "S", Consumer: name, Registerer: prometheus.NewRegistry(),
			MaxDeliver: 5, AckWait: 5 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(runCtx) }()
		t.Cleanup(func() { cancel(); wg.Wait(); _ = sh.Close() })
		return r
	}
	publish := func(subject string) {
		m := nats.NewMsg(subject)
		m.Header.Set(proxy.HeaderIdempotencyKey, "K")
		m.Data = []byte("x")
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	appDown := func(r *proxy.Runner) func() bool {
		return func() bool {
			err := r.Ready()
			return err != nil && strings.Contains(err.Error(), "app")
		}
	}

	a := replica("a", "s.a")
	publish("s.a")
	poll.Until(t, 10*time.Second, "replica a to hold its message (app down)", appDown(a))
	// The outage outlasts the claim's TTL: real time passing is what is
	// tested.
	time.Sleep(2*claimTTL + 500*time.Millisecond)

	replica("b", "s.b")
	publish("s.b")
	// b checks the key, and holds (app down) or waits (claimed).
	poll.Until(t, 10*time.Second, "replica b to check the key", func() bool {
		n := 0.0
		for _, answer := range []string{"local", "new", "processed", "claimed", "error"} {
			v, _ := metricstest.Lookup(t, regs["b"], "courier_dedup_shared_checks_total", "answer", answer)
			n += v
		}
		return n >= 1
	})

	l, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = app.Serve(l) }()
	poll.Until(t, 10*time.Second, "the app called for the key", func() bool { return calls.Load() >= 1 })
	// b's message settles once b sees the key processed (or, were the
	// claim taken over, once b has called the app too).
	poll.Until(t, 10*time.Second, "replica b's message to settle", func() bool {
		cons, err := js.Consumer(ctx, "S", "b")
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	if got := calls.Load(); got != 1 {
		t.Errorf("the app was called %d times for one key from two replicas, want 1", got)
	}
}
