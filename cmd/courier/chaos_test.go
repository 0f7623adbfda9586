package main

// Order per key under churn (README, "Order per key"; docs/order.md): three
// couriers, each a process of its own, on one durable of a 3-node cluster,
// while messages are published, the app fails some of them, couriers are
// killed with SIGKILL at random and restarted on an empty disk, one is
// stopped with SIGTERM, and the node leading the stream is stopped for a
// few seconds. The app (keyedApp) fails the test on any request of a
// later message of an entity before the earlier one's 2xx, on two requests
// of one entity at the app at once, on anything lost or dead-lettered, and
// on more duplicates than what was at the app when couriers died.
//
// Seeded and repeatable in what it does (the schedule of kills, the app's
// answers); the machine's timing still varies. .ci/run runs a short form;
// COURIERTEST_CHAOS runs it longer by hand, e.g.
//
//	COURIERTEST_CHAOS=seed=7,messages=2000,seconds=30,runs=10 go test -run TestChaos -timeout 60m ./cmd/courier/

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/partition"
)

// chaosPlan is one run's settings.
type chaosPlan struct {
	seed     uint64
	messages int           // published in all
	entities int           // ordering keys
	publish  time.Duration // over how long they are published
	runs     int
}

// chaosSettings reads COURIERTEST_CHAOS over the short form CI runs.
func chaosSettings(t *testing.T) chaosPlan {
	t.Helper()
	return planFrom(t, "COURIERTEST_CHAOS", chaosPlan{seed: 1, messages: 600, entities: 30, publish: 10 * time.Second, runs: 1})
}

// planFrom reads the environment variable name (name=value pairs, comma
// separated) over the plan p.
func planFrom(t *testing.T, name string, p chaosPlan) chaosPlan {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return p
	}
	for _, kv := range strings.Split(v, ",") {
		setting, value, _ := strings.Cut(kv, "=")
		n, err := strconv.Atoi(value)
		if err != nil || n < 1 {
			t.Fatalf("%s: %q is not name=positive number", name, kv)
		}
		switch setting {
		case "seed":
			p.seed = uint64(n)
		case "messages":
			p.messages = n
		case "entities":
			p.entities = n
		case "seconds":
			p.publish = time.Duration(n) * time.Second
		case "runs":
			p.runs = n
		default:
			t.Fatalf("%s: unknown setting %q (seed, messages, entities, seconds, runs)", name, setting)
		}
	}
	return p
}

// With partitions (COURIER_ORDER_PARTITIONS, the key a subject token) and
// batches.
func TestChaosOrderPartitions(t *testing.T) {
	runChaosSeeds(t, true, "COURIER_ORDER_KEY=subject:3", "COURIER_ORDER_PARTITIONS=6")
}

// One courier at a time active on the durable (a header key: no
// partitions), with batches.
func TestChaosOrderSingleActive(t *testing.T) {
	runChaosSeeds(t, false, "COURIER_ORDER_KEY=header:Order")
}

// runChaosSeeds runs runChaos once per run COURIERTEST_CHAOS asks for,
// each with the next seed.
func runChaosSeeds(t *testing.T, parts bool, extra ...string) {
	p := chaosSettings(t)
	for r := range p.runs {
		p := p
		p.seed += uint64(r)
		t.Run(fmt.Sprint("seed=", p.seed), func(t *testing.T) { runChaos(t, p, parts, extra...) })
	}
}

// chaosAnswer is the app's answer to the try-th request of message n of
// key, fixed by the seed: every seventh message fails twice (503), one in
// 29 is answered 429 with Retry-After 1s once, one in ten takes 2-8ms.
func chaosAnswer(seed uint64, key string, n, try int) (status int, retryAfter string, took time.Duration) {
	h := fnv.New64a()
	fmt.Fprint(h, seed, "/", key, "/", n)
	x := h.Sum64()
	if x%10 == 0 {
		took = time.Duration(2+x/10%7) * time.Millisecond
	}
	switch {
	case x%7 == 1 && try <= 2:
		return http.StatusServiceUnavailable, "", took
	case x%29 == 2 && try == 1:
		return http.StatusTooManyRequests, "1", took
	}
	return http.StatusOK, "", took
}

// chaosMsg is message n of entity key, published on orders.<type>.<key>.
func chaosMsg(key string, n int) *nats.Msg {
	m := nats.NewMsg(fmt.Sprintf("orders.e%d.%s", n%3, key))
	m.Header.Set("Order", key)
	m.Header.Set("N", strconv.Itoa(n))
	m.Header.Set("Nats-Msg-Id", fmt.Sprint(key, "-", n))
	m.Data = []byte(key)
	return m
}

func runChaos(t *testing.T, p chaosPlan, parts bool, extra ...string) {
	k := newCluster(t, func(sc *jetstream.StreamConfig) { sc.Subjects = []string{"orders.*.*"} })
	rng := rand.New(rand.NewPCG(p.seed, 0x636f7572))
	a := newKeyedApp(t, 0)
	a.answers = func(key string, n, try int) (int, string, time.Duration) { return chaosAnswer(p.seed, key, n, try) }
	const inflight, batch = 4, 8
	s := newReplicaSet(t, a.url, 3, func(url string, i int) []string {
		return k.env(url, i, append([]string{
			"COURIER_BATCH_MAX=" + strconv.Itoa(batch), "COURIER_BATCH_WAIT=5ms",
			"COURIER_MAX_DELIVER=20", "COURIER_MAX_INFLIGHT=" + strconv.Itoa(inflight),
			"COURIER_ACK_WAIT=3s", "COURIER_BACKOFF_INITIAL=100ms", "COURIER_BACKOFF_MAX=1s",
		}, extra...)...)
	})
	for i := range 3 {
		s.start(i)
	}
	all := append([]*child(nil), s.cs...) // every courier started, for the summary

	// The publisher: rounds of every entity's next message, spread over
	// the publishing time, each publish retried while the cluster cannot
	// answer (the node lost); Nats-Msg-Id stores a retried one once.
	rounds := max(p.messages/p.entities, 1)
	var published atomic.Bool
	pubErr := make(chan error, 1)
	go func() {
		defer published.Store(true)
		tick := time.NewTicker(p.publish / time.Duration(rounds))
		defer tick.Stop()
		for n := range rounds {
			for e := range p.entities {
				if err := publishChaos(k.js, chaosMsg(fmt.Sprint("k", e), n)); err != nil {
					pubErr <- err
					return
				}
			}
			<-tick.C
		}
	}()

	// The chaos, on the test's goroutine, while messages are published
	// and a little after (at most 14 events, as many as fit in the
	// publishing time and a few seconds more): a random courier killed
	// every 2-4s and started again at once on an empty disk (its env
	// names a new directory), the fifth time stopped with SIGTERM instead,
	// and once, the third time, the node leading the stream stopped for
	// 2-4s.
	events := min(14, int(p.publish/(3*time.Second))+3)
	kills, nodeLost := 0, false
	for event := 0; event < events; event++ {
		time.Sleep(time.Duration(2000+rng.IntN(2000)) * time.Millisecond)
		if event == 2 && !nodeLost {
			nodeLost = true
			leader := k.c.StreamLeader("ORDERS")
			if leader < 0 {
				continue
			}
			down := time.Duration(2000+rng.IntN(2000)) * time.Millisecond
			t.Logf("%s: node %d (the stream's leader) stopped for %s", time.Now().Format("15:04:05.000"), leader, down)
			k.c.Shutdown(leader)
			time.Sleep(down)
			k.c.Restart(leader)
			continue
		}
		i := rng.IntN(3)
		if event == 4 {
			t.Logf("%s: replica %d stopped with SIGTERM, %d delivered", time.Now().Format("15:04:05.000"), i, a.delivered())
			s.term(i)
		} else {
			kills++
			t.Logf("%s: replica %d killed, %d delivered", time.Now().Format("15:04:05.000"), i, a.delivered())
			s.cs[i].kill(t)
		}
		s.cs[i] = startChild(t, s.env(fmt.Sprint(s.url, "/c", i), i))
		all = append(all, s.cs[i])
	}
	for !published.Load() {
		time.Sleep(50 * time.Millisecond) // polled: the publisher's end is the condition
	}
	a.mu.Lock()
	during := a.longestGap
	a.longestGap, a.lastOK = 0, time.Now()
	a.mu.Unlock()
	select {
	case err := <-pubErr:
		t.Fatalf("publishing: %v", err)
	default:
	}

	drained := k.drained
	info := func() *jetstream.ConsumerInfo { return k.consumerInfo("courier") }
	if parts {
		work := partition.StreamName("ORDERS", "courier")
		drained = func() bool {
			for i := range 6 {
				ci := k.consumerInfoOn(work, partition.ConsumerName("courier", i))
				if ci == nil || ci.NumPending != 0 || ci.NumAckPending != 0 {
					return false
				}
			}
			return true
		}
		info = func() *jetstream.ConsumerInfo { return k.consumerInfoOn(work, partition.ConsumerName("courier", 0)) }
	}
	a.waitAllDelivered(t, 3*time.Minute, p.entities, rounds, drained, info)
	chaosSummary(t, all)
	a.check(t, p.entities, rounds)
	k.noDeadLetters()
	// A kill repeats at most what was at the app: its batch requests in
	// flight, each of at most batch entries.
	a.mu.Lock()
	dups, after := a.dups, a.longestGap
	a.mu.Unlock()
	t.Logf("%d messages, %d kills: %d duplicate requests; longest time with no message answered 2xx for the first time: %s during the chaos, %s after it",
		rounds*p.entities, kills, dups, during.Round(time.Millisecond), after.Round(time.Millisecond))
	if most := kills * inflight * batch; dups > most {
		t.Errorf("%d duplicate requests through %d kills, want at most %d (what the killed couriers had at the app)", dups, kills, most)
	}
}

// chaosSummary logs how often the couriers took a line over: pins that
// came with a clean hand-over or with a wait for what may be out, and
// hand-overs made with and without a clean record.
func chaosSummary(t *testing.T, all []*child) {
	t.Helper()
	var clean, waited, pins, handed, blind int
	for _, ch := range all {
		c := ch.asCourier()
		for _, l := range logLines(c, "pinned to this") {
			pins++
			if l["handed_on"] == true {
				clean++
			}
		}
		waited += len(logLines(c, "pinned to this partition: keyed messages wait")) + len(logLines(c, "pinned to this courier: keyed messages wait"))
		handed += len(logLines(c, "partition handed on"))
		blind += len(logLines(c, "handing the partition on without a clean record"))
	}
	t.Logf("%d couriers started; %d pins taken (%d after a clean hand-over, %d waiting for what may be out); %d hand-overs (%d not clean)",
		len(all), pins, clean, waited, handed, blind)
}

// publishChaos publishes m, trying again for up to 30s while the cluster
// cannot answer.
func publishChaos(js jetstream.JetStream, m *nats.Msg) error {
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = js.PublishMsg(ctx, m)
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s: %w", m.Header.Get("Nats-Msg-Id"), err)
}
