package proxy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/dedup"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// A store that cannot answer a check is an outage like the app's: the
// message is held (never sent unchecked, no attempt spent) and delivered once
// the store answers again.
func TestStoreCheckErrorHoldsSpendsNothing(t *testing.T) {
	e := setup(t)
	fs := &flakyStore{checker: openStore(t)}
	fs.seenFails.Store(4)
	e.run(t, fs)
	if _, err := e.js.Publish(context.Background(), "s.x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "delivery after the store recovers", func() bool { return e.calls.Load() == 1 && e.settled(t) })
	if got := counter(t, e.reg, "courier_dedup_errors_total", "check"); got != 4 {
		t.Errorf("check errors counted %v, want 4", got)
	}
	if got := e.attempts.Load(); got != 1 {
		t.Errorf("the app saw Courier-Attempt %d, want 1: a store that could not answer spent attempts", got)
	}
	if got := counter(t, e.reg, "courier_messages_total", "retried"); got != 0 {
		t.Errorf("%v messages NAK'd while the store could not answer, want 0", got)
	}
}

// A full disk (here: a floor above the file system's free space, which the
// store measures for real) is a clear state: courier holds the message
// (never sent unchecked, no attempt spent), readiness says why, nothing
// crashes.
func TestFullDiskHoldsMessages(t *testing.T) {
	e := setup(t)
	s, err := dedup.Open(t.TempDir(), dedup.Options{TTL: time.Hour, Scope: "S/c", DiskFloor: 1 << 60, DiskInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	e.publish(t, 3, []byte("x"))
	r, _ := e.runWith(t, s, proxy.Options{})
	poll.Until(t, 10*time.Second, "readiness to name the store", func() bool {
		err := r.Ready()
		return err != nil && strings.Contains(err.Error(), "dedup store unavailable")
	})
	time.Sleep(300 * time.Millisecond)
	if got := e.calls.Load(); got != 0 {
		t.Errorf("the app was called %d times with the disk full: sent unchecked", got)
	}
	info, err := e.cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 {
		t.Errorf("%d messages redelivered while held", info.NumRedelivered)
	}
	if got := counter(t, e.reg, "courier_delivery_held", "store_unavailable"); got != 1 {
		t.Errorf("courier_delivery_held{cause=store_unavailable} = %v", got)
	}
}

// A paused consumer is not fetched from, and readiness says so; resumed, it
// delivers.
func TestPausedConsumerIsNotFetched(t *testing.T) {
	e := setup(t)
	a := newStormApp(t, e)
	ctx := context.Background()
	if _, err := e.js.PauseConsumer(ctx, "S", "c", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	r, _ := e.runWith(t, nil, proxy.Options{InfoInterval: 50 * time.Millisecond})
	poll.Until(t, 10*time.Second, "readiness to say paused", func() bool {
		err := r.Ready()
		return err != nil && contains(err.Error(), "consumer paused")
	})
	e.publish(t, 5, []byte("x"))
	time.Sleep(300 * time.Millisecond)
	if got := a.ok.Load(); got != 0 {
		t.Fatalf("%d messages delivered while paused", got)
	}
	if _, err := e.js.ResumeConsumer(ctx, "S", "c"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "delivery after resume", func() bool { return a.ok.Load() == 5 })
}
