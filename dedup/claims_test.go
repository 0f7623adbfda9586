package dedup

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

// The claim TTL of the renewal tests, and how long the answers to the
// holder's renewal are held: longer than a renewal waits (half the claim
// TTL), shorter than the claim lives, leaving the holder 2 s after the
// answers come to renew again (a write, a read and a write on an R3
// bucket, on a machine busy with other tests) before the claim lapses.
const (
	renewClaimTTL = 5 * time.Second
	renewHold     = 3 * time.Second
)

// renewFailures is how many renewals of s have failed.
func renewFailures(s *Shared) float64 {
	return testutil.ToFloat64(s.m.bucketErrors[opRenew])
}

// TestSharedLateRenewalAck: a renewal that is stored but whose
// acknowledgement comes later than the renewal waits (the answers held 3s,
// past the 2.5s wait, within the 5s claim TTL) does not end the claim:
// another courier's delivery of the key keeps waiting while the holder
// lives, and says so once in the log.
func TestSharedLateRenewalAck(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	lateRenewalAck(t, srv.Addr().String(), js, SharedOptions{})
}

// lateRenewalAck runs the late acknowledgement of a renewal: courier A
// talks to the server at addr through a proxy that holds the answer to
// A's first renewal back; courier B uses jsB.
func lateRenewalAck(t *testing.T, addr string, jsB jetstream.JetStream, o SharedOptions) {
	t.Helper()
	p := startStallProxy(t, addr)
	var logs logBuffer
	o.ClaimTTL = renewClaimTTL
	b := openShared(t, jsB, o)
	o.Registerer, o.Logger = prometheus.NewRegistry(), logs.logger()
	a := openShared(t, p.connect(), o)

	mustCheck(t, a, "late", New)
	bk, err := a.own.bucketKey("late")
	if err != nil {
		t.Fatal(err)
	}
	held := p.holdAnswersAfter(bk, renewHold)
	select {
	case <-held:
	case <-time.After(4 * renewClaimTTL):
		t.Fatal("A sent no renewal")
	}
	poll.Until(t, 4*renewClaimTTL, "A's renewal given up unanswered", func() bool { return renewFailures(a) >= 1 })
	checkFor(t, b, "late", Claimed, 2*renewClaimTTL, "A's claim lapsed while A lived and renewed it")
	if err := a.Release(context.Background(), "late"); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, b, "late", New)
	if n := logs.count("level=WARN", "renew"); n != 1 {
		t.Errorf("%d warnings of renewals failing, want 1:\n%s", n, &logs)
	}
	t.Logf("renewals failed: %v\n%s", renewFailures(a), &logs)
}

// TestSharedReleaseAfterLateRenewalAck: a Release that follows a renewal
// stored but never acknowledged (the holder's revision of its claim is
// behind the bucket's) still ends the claim at once: the next delivery of
// the key goes ahead without waiting for it to lapse.
func TestSharedReleaseAfterLateRenewalAck(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, jsB := natstest.Connect(t, srv)
	p := startStallProxy(t, srv.Addr().String())
	o := SharedOptions{ClaimTTL: renewClaimTTL}
	b := openShared(t, jsB, o)
	o.Registerer = prometheus.NewRegistry()
	a := openShared(t, p.connect(), o)

	mustCheck(t, a, "release", New)
	bk, err := a.own.bucketKey("release")
	if err != nil {
		t.Fatal(err)
	}
	<-p.holdAnswersAfter(bk, renewHold)
	poll.Until(t, 4*renewClaimTTL, "A's renewal given up unanswered", func() bool { return renewFailures(a) >= 1 })
	if err := a.Release(context.Background(), "release"); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, b, "release", New)
}

// TestSharedClaimLapsesWhenHolderCutOff: a holder cut off from the server
// for longer than the claim TTL (both directions held 6s, claim TTL 2s,
// the connection not dropped) does lose its claim, so another courier's
// delivery goes ahead; once back it notices, says so once, and neither
// renews nor releases the other courier's claim. Its renewals failing tick
// after tick are one warning.
func TestSharedClaimLapsesWhenHolderCutOff(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	p := startStallProxy(t, srv.Addr().String())
	var logs logBuffer
	o := SharedOptions{ClaimTTL: 2 * time.Second}
	b := openShared(t, js, o)
	c := openShared(t, js, o)
	o.Registerer, o.Logger = prometheus.NewRegistry(), logs.logger()
	a := openShared(t, p.connect(), o)

	mustCheck(t, a, "cut", New)
	p.cutOff(3 * o.ClaimTTL)
	poll.Until(t, 10*o.ClaimTTL, "the claim of A, cut off, lapses", func() bool {
		v, err := b.Check(context.Background(), "cut")
		if err != nil {
			t.Fatal(err)
		}
		return v == New
	})
	if !p.holding() {
		t.Log("the claim was taken over after the cut-off ended (a slow machine)")
	}
	poll.Until(t, 10*o.ClaimTTL, "A notices it lost the claim", func() bool { return logs.count("level=WARN", "claim lost") > 0 })
	mustCheck(t, c, "cut", Claimed) // B's, not overwritten by A's renewal
	if err := a.Release(context.Background(), "cut"); err != nil {
		t.Fatal(err)
	}
	checkFor(t, c, "cut", Claimed, o.ClaimTTL, "A's release or renewal ended B's claim")
	if n := logs.count("level=WARN", "cannot renew"); n != 1 {
		t.Errorf("%d warnings of renewals failing, want 1:\n%s", n, &logs)
	}
	if n := logs.count("level=WARN", "claim lost"); n != 1 {
		t.Errorf("%d warnings of the claim lost, want 1:\n%s", n, &logs)
	}
	if n := renewFailures(a); n < 2 {
		t.Errorf("%v renewals failed, want several (one a tick while cut off)", n)
	}
	if err := b.Release(context.Background(), "cut"); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, c, "cut", New)
}

// TestSharedClaimsAcrossVersions: in a rolling upgrade, a claim written by
// a courier of before (the value "claim", no holder) is a claim another's
// to this one, and this one's claims keep that value, which couriers of
// before compare whole, with the holder in a header.
func TestSharedClaimsAcrossVersions(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	a := openShared(t, js, SharedOptions{ClaimTTL: 2 * time.Second})

	bk, err := a.own.bucketKey("old")
	if err != nil {
		t.Fatal(err)
	}
	old := nats.NewMsg(bk)
	old.Data = []byte("claim")
	if _, err := js.PublishMsg(ctx, old, jetstream.WithExpectLastSequencePerSubject(0), jetstream.WithMsgTTL(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, a, "old", Claimed)
	if err := a.Release(ctx, "old"); err != nil { // not a's: left alone
		t.Fatal(err)
	}
	mustCheck(t, a, "old", Claimed)

	mustCheck(t, a, "new", New)
	st, err := js.Stream(ctx, "KV_"+DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	bk, _ = a.own.bucketKey("new")
	m, err := st.GetLastMsgForSubject(ctx, bk)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "claim" || m.Header.Get(ClaimHolderHeader) == "" {
		t.Errorf("claim stored as %q with holder %q; want the value \"claim\" and a holder", m.Data, m.Header.Get(ClaimHolderHeader))
	}
}
