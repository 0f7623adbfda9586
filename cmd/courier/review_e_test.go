package main

import (
	"strings"
	"testing"
	"time"
)

// A courier that starts while its JetStream cluster has lost quorum (two of
// three nodes down, for longer than the server's lost-quorum interval) is
// facing a failure that time fixes: the server answers "JetStream system
// temporarily unavailable" (10008). It must retry while /readyz fails, and
// start once the nodes are back, not exit as if retrying could not help.
func TestStartWhileClusterHasNoQuorumRetries(t *testing.T) {
	k := newCluster(t)
	a := newApp(t, nil)
	k.c.Shutdown(1)
	k.c.Shutdown(2)
	// The server reports itself leaderless only after lostQuorumInterval
	// (10s by default).
	time.Sleep(12 * time.Second)
	env := k.harness.env(a.URL, "NATS_URL="+k.c.NodeURL(0), "COURIER_LOG_LEVEL=info")
	c := start(t, env)
	if err, done := c.exited(8 * time.Second); done {
		t.Fatalf("courier exited while the cluster had no quorum: %v\nlogs:\n%s", err, c.logs.String())
	}
	if !strings.Contains(c.logs.String(), "retrying") {
		t.Logf("logs:\n%s", c.logs.String())
	}
	k.c.Restart(1)
	k.c.Restart(2)
	waitReady(t, c)
	if err := c.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
}
