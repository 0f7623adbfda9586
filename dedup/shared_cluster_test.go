package dedup

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
)

// r3 starts a 3-node cluster and returns a JetStream handle on each node,
// as three couriers of one durable connected to different servers would
// have (each fails over to the others).
func r3(t *testing.T) (*natstest.Cluster, []jetstream.JetStream) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	c := natstest.StartCluster(t, 3, natstest.ClusterOptions{})
	jss := make([]jetstream.JetStream, 3)
	for i := range jss {
		// This node first; the others if it goes down.
		_, jss[i] = natstest.ConnectURL(t, c.NodeURL(i)+","+c.URL())
	}
	return c, jss
}

// TestSharedR3 runs the shared store's promises on an R3 bucket, with each
// courier connected to a different node.
func TestSharedR3(t *testing.T) {
	c, jss := r3(t)
	ctx := context.Background()
	a := openShared(t, jss[0], SharedOptions{Replicas: 3})
	st, err := jss[0].Stream(ctx, "KV_"+DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	if r := st.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("bucket has %d replicas", r)
	}
	t.Logf("bucket leader: node %d", c.StreamLeader("KV_"+DefaultBucket))

	t.Run("recorded on A, seen on B with an empty cache", func(t *testing.T) {
		mustCheck(t, a, "k1", New)
		if err := a.Record(ctx, "k1"); err != nil {
			t.Fatal(err)
		}
		b := openShared(t, jss[1], SharedOptions{Replicas: 3})
		mustCheck(t, b, "k1", Processed)
		// A third, on the third node, started after both.
		c := openShared(t, jss[2], SharedOptions{Replicas: 3})
		mustCheck(t, c, "k1", Processed)
	})
	t.Run("concurrent claims: one wins", func(t *testing.T) {
		concurrentClaims(t, []*Shared{a, openShared(t, jss[1], SharedOptions{Replicas: 3}), openShared(t, jss[2], SharedOptions{Replicas: 3})})
	})
	t.Run("claim lapses", func(t *testing.T) {
		claimLapses(t, jss[1], jss[2])
	})
}

// TestSharedR3NodeRestart checks and records keys on two couriers while the
// bucket's leader is shut down and restarted: every answer is right or an
// error (a key one courier holds or recorded is never New to the other),
// and the store works again once a leader is back.
func TestSharedR3NodeRestart(t *testing.T) {
	c, jss := r3(t)
	ctx := context.Background()
	opts := SharedOptions{Replicas: 3, Timeout: 2 * time.Second}
	a := openShared(t, jss[0], opts)
	b := openShared(t, jss[1], opts)
	leader := c.StreamLeader("KV_" + DefaultBucket)

	var n, errs int
	step := func(i int) (ok bool) {
		key := fmt.Sprint("r-", i)
		v, err := a.Check(ctx, key)
		if err != nil {
			errs++
			return false
		}
		if v != New {
			t.Fatalf("%s: fresh key is %v on A", key, v)
		}
		if v, err := b.Check(ctx, key); err == nil && v != Claimed {
			t.Fatalf("%s: claimed by A, %v on B", key, v)
		}
		if err := a.Record(ctx, key); err != nil {
			errs++
			return false
		}
		if v, err := b.Check(ctx, key); err == nil && v != Processed {
			t.Fatalf("%s: recorded by A, %v on B", key, v)
		}
		n++
		return true
	}
	i := 0
	for range 20 {
		i++
		if !step(i) {
			t.Fatalf("errors before any restart")
		}
	}
	c.Shutdown(leader)
	t.Logf("bucket leader node %d shut down", leader)
	for range 40 {
		i++
		step(i)
	}
	c.Restart(leader)
	t.Logf("node %d restarted; bucket leader now node %d", leader, c.StreamLeader("KV_"+DefaultBucket))
	deadline := time.Now().Add(20 * time.Second)
	for ok := 0; ok < 20; {
		i++
		if step(i) {
			ok++
		} else if time.Now().After(deadline) {
			t.Fatal("the store does not work again after the restart")
		}
	}
	t.Logf("%d keys checked and recorded, %d errors (none wrong)", n, errs)
}

// TestSharedR3LateRenewalAck: on an R3 bucket, the answer to a renewal
// held longer than the renewal waits (courier A connected to node 0 through
// a proxy, B to node 1) does not end A's claim while A lives.
func TestSharedR3LateRenewalAck(t *testing.T) {
	c, jss := r3(t)
	lateRenewalAck(t, c.Node(0).Addr().String(), jss[1], SharedOptions{Replicas: 3})
}
