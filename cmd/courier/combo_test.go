package main

// Every promise with every feature on (docs/behaviour.md): a chaos of
// combinations. Each seed draws a combination of features (order per key:
// none, a header key with one active courier, or partitions; batches off
// or of 8; the in-flight limit fixed, auto or auto:8; a rate limit or none;
// the embedded store with one courier or the shared one with three; one
// subscription, or two with a route; every message delayed, published as
// a JetStream schedule, or none) and a schedule of faults (SIGKILL,
// SIGTERM, the stream leader's node lost, an app outage, a 503 storm, the
// pin moved by JetStream's unpin while the couriers live, an app five times
// slower, a pause and resume, and in some seeds a rewind of every
// subscription's durable, combo_rewind_test.go), and checks the same
// invariants: nothing lost or dead-lettered; with order per key, order and
// no two calls of a key at once; duplicates within what the killed
// couriers had in flight; no stall past an ack wait once the faults end;
// every SIGTERM a clean exit; and of a rewind, every message of its range
// once more as a replay (but what was in flight at it), in order per key,
// and no other. Couriers are processes of their own on an embedded 3-node
// cluster.
//
// Every seed is printed with its combination and repeatable in what it
// draws (the machine's timing still varies). .ci/run runs a few seeds in a
// short form; COURIERTEST_COMBO runs more by hand, e.g.
//
//	COURIERTEST_COMBO=seed=1,runs=30 go test -run TestChaosCombinations -timeout 180m ./cmd/courier/
//
// and seed=N,runs=1 repeats one.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/partition"
)

// combo is one combination of features.
type combo struct {
	order    string // "none", "single" (a header key, one active courier) or "partitions"
	batch    int    // COURIER_BATCH_MAX: 1 or 8
	inflight string // COURIER_MAX_INFLIGHT: "4", "auto" or "auto:8"
	rate     int    // COURIER_MAX_RATE; 0: none
	shared   bool   // the shared store and three couriers, else the embedded store and one
	subs     bool   // two subscriptions, orders (with a route) and audit, else one
	// delayed: every message is published as a JetStream schedule due a
	// second later (delayed delivery), on streams that hold schedules.
	delayed bool
	// rewind: a rewind of every subscription's durable is among the
	// faults (withRewind).
	rewind bool
}

// drawCombo draws seed's combination. Whether it has a rewind is drawn
// apart, so that the rest is what the seed drew before rewinds were.
func drawCombo(seed uint64) combo {
	rng := rand.New(rand.NewPCG(seed, 0x636f6d62))
	c := combo{
		order:    []string{"none", "single", "partitions"}[rng.IntN(3)],
		batch:    []int{1, 8}[rng.IntN(2)],
		inflight: []string{"4", "auto", "auto:8"}[rng.IntN(3)],
		rate:     []int{0, 150}[rng.IntN(2)],
		shared:   rng.IntN(3) != 0,
		subs:     rng.IntN(2) == 0,
		delayed:  rng.IntN(3) == 0,
	}
	c.rewind = rand.New(rand.NewPCG(seed, 0x72657769)).IntN(2) == 0
	return c
}

func (c combo) String() string {
	store, rate, subs := "embedded store, 1 courier", "no rate limit", "one subscription"
	if c.shared {
		store = "shared store, 3 couriers"
	}
	if c.rate > 0 {
		rate = fmt.Sprintf("rate %d/s", c.rate)
	}
	if c.subs {
		subs = "two subscriptions with a route"
	}
	delayed, rewind := "", ""
	if c.delayed {
		delayed = ", every message delayed 1s"
	}
	if c.rewind {
		rewind = ", rewound once (courier rewind)"
	}
	return fmt.Sprintf("order %s, batches of %d, in flight %s, %s, %s, %s%s%s", c.order, c.batch, c.inflight, rate, store, subs, delayed, rewind)
}

// couriers is how many run at once.
func (c combo) couriers() int {
	if c.shared {
		return 3
	}
	return 1
}

// mostInflight is the most requests one courier has at the app.
func (c combo) mostInflight() int {
	switch c.inflight {
	case "auto":
		return 64
	case "auto:8":
		return 8
	}
	n, _ := strconv.Atoi(c.inflight)
	return n
}

// subscriptions are the streams served: ORDERS, and AUDIT with subs.
func (c combo) subscriptions() []string {
	if c.subs {
		return []string{"ORDERS", "AUDIT"}
	}
	return []string{"ORDERS"}
}

// comboAckWait is every combination's COURIER_ACK_WAIT.
const comboAckWait = 3 * time.Second

// env is courier i's environment for c, sending to the app at base.
func (c combo) env(k *cluster, base string, i int) []string {
	extra := []string{
		"COURIER_MAX_DELIVER=20", "COURIER_ACK_WAIT=" + comboAckWait.String(),
		"COURIER_BACKOFF_INITIAL=100ms", "COURIER_BACKOFF_MAX=1s", "COURIER_BREAKER_PROBE=1s", "COURIER_BREAKER_PROBE_MAX=2s",
		"COURIER_MAX_INFLIGHT=" + c.inflight, "COURIER_HTTP_TIMEOUT=10s",
	}
	switch c.order {
	case "single":
		extra = append(extra, "COURIER_ORDER_KEY=header:Order")
	case "partitions":
		extra = append(extra, "COURIER_ORDER_KEY=subject:3", "COURIER_ORDER_PARTITIONS=6")
	}
	if c.batch > 1 {
		extra = append(extra, "COURIER_BATCH_MAX="+strconv.Itoa(c.batch), "COURIER_BATCH_WAIT=5ms")
	}
	if c.rate > 0 {
		extra = append(extra, "COURIER_MAX_RATE="+strconv.Itoa(c.rate))
	}
	if !c.shared {
		extra = append(extra, "COURIER_DEDUP_STORE=badger")
	}
	if c.subs {
		extra = append(extra, "COURIER_SUBSCRIPTIONS=orders,audit",
			"COURIER_SUB_ORDERS_STREAM=ORDERS",
			fmt.Sprintf("COURIER_SUB_ORDERS_ROUTES=orders.e1.*=/routed/c%d", i),
			"COURIER_SUB_AUDIT_STREAM=AUDIT",
			fmt.Sprintf("COURIER_SUB_AUDIT_APP_URL=%s/audit/c%d", base, i))
	}
	return k.env(fmt.Sprintf("%s/c%d", base, i), i, extra...)
}

// comboSettings reads COURIERTEST_COMBO over the short form CI runs:
// messages and entities per subscription.
func comboSettings(t *testing.T) chaosPlan {
	t.Helper()
	return planFrom(t, "COURIERTEST_COMBO", chaosPlan{seed: 1, messages: 400, entities: 20, publish: 10 * time.Second, runs: 3})
}

func TestChaosCombinations(t *testing.T) {
	p := comboSettings(t)
	for r := range p.runs {
		p := p
		p.seed += uint64(r)
		c := drawCombo(p.seed)
		t.Run(fmt.Sprint("seed=", p.seed), func(t *testing.T) {
			t.Logf("seed %d: %s", p.seed, c)
			runCombo(t, p, c)
		})
	}
}

// comboApp is the app of a combination: keyedApp, at an address that an
// outage leaves (lateApp: connections refused), with a 503 storm and a
// slowdown to turn on.
type comboApp struct {
	*keyedApp
	at    *lateApp
	storm atomic.Bool
	slow  atomic.Bool
}

func newComboApp(t *testing.T, seed uint64, ordered bool) *comboApp {
	a := &comboApp{keyedApp: newKeyedApp(t, 0), at: newLateApp(t, nil)}
	a.unordered = !ordered
	a.answers = func(key string, n, try int) (int, string, time.Duration) {
		status, retryAfter, took := chaosAnswer(seed, key, n, try)
		if a.slow.Load() {
			took = 5*took + 20*time.Millisecond
		}
		if a.storm.Load() {
			return http.StatusServiceUnavailable, "", took
		}
		return status, retryAfter, took
	}
	a.at.h = a.keyedApp
	a.at.up()
	return a
}

func (a *comboApp) url() string { return "http://" + a.at.addr }

// comboMsg is message n of entity key on stream's subjects:
// <stream>.e<n%3>.<key>.
func comboMsg(stream, key string, n int) *nats.Msg {
	m := nats.NewMsg(fmt.Sprintf("%s.e%d.%s", strings.ToLower(stream), n%3, key))
	m.Header.Set("Order", key)
	m.Header.Set("N", strconv.Itoa(n))
	m.Header.Set("Nats-Msg-Id", fmt.Sprint(stream, "-", key, "-", n))
	m.Data = []byte(key)
	return m
}

// delayedMsg is m published as a schedule due after d, on a subject of
// its own under the stream's schedule prefix (schedule.Subjects).
func delayedMsg(stream string, m *nats.Msg, d time.Duration) *nats.Msg {
	s := nats.NewMsg(fmt.Sprintf("_sched.%s.%s", stream, strings.ReplaceAll(m.Header.Get("Nats-Msg-Id"), ".", "-")))
	s.Data = m.Data
	for k, vs := range m.Header {
		s.Header[k] = vs
	}
	s.Header.Set("Nats-Schedule", "@at "+time.Now().Add(d).UTC().Format(time.RFC3339Nano))
	s.Header.Set("Nats-Schedule-Target", m.Subject)
	return s
}

// comboKeyPrefix is the keys' prefix of stream's messages.
func comboKeyPrefix(stream string) string {
	if stream == "AUDIT" {
		return "a"
	}
	return "k"
}

func runCombo(t *testing.T, p chaosPlan, c combo) {
	schedules := func(sc *jetstream.StreamConfig) {
		if c.delayed {
			sc.AllowMsgSchedules = true
			sc.Subjects = append(sc.Subjects, "_sched."+sc.Name+".>")
		}
	}
	k := newCluster(t, func(sc *jetstream.StreamConfig) { sc.Subjects = []string{"orders.*.*"}; schedules(sc) })
	if c.subs {
		natstest.Try(t, "creating the AUDIT stream", func(ctx context.Context) error {
			sc := jetstream.StreamConfig{Name: "AUDIT", Subjects: []string{"audit.*.*"}, Replicas: 3}
			schedules(&sc)
			_, err := k.js.CreateStream(ctx, sc)
			return err
		})
	}
	rng := rand.New(rand.NewPCG(p.seed, 0x636f7572))
	a := newComboApp(t, p.seed, c.order != "none")
	a.prefixes = nil
	for _, st := range c.subscriptions() {
		a.prefixes = append(a.prefixes, comboKeyPrefix(st))
	}
	s := newReplicaSet(t, a.url(), c.couriers(), func(_ string, i int) []string { return c.env(k, a.url(), i) })
	for i := range c.couriers() {
		s.start(i)
	}
	all := append([]*child(nil), s.cs...)

	// The faults, drawn first: messages are published for as long as
	// they last, so that every fault meets messages in flight.
	faults := comboFaults(rng, c, p.publish)
	if c.rewind {
		faults = withRewind(rand.New(rand.NewPCG(p.seed, 0x72657764)), c, faults)
	}
	span := p.publish
	if total := faultsSpan(faults); total > span {
		span = total
	}

	// The publisher: rounds of every entity's next message on each
	// subscription's stream, spread over the faults.
	rounds := max(p.messages/p.entities, 1)
	var published atomic.Bool
	pubErr := make(chan error, 1)
	go func() {
		defer published.Store(true)
		tick := time.NewTicker(span / time.Duration(rounds))
		defer tick.Stop()
		for n := range rounds {
			for _, st := range c.subscriptions() {
				for e := range p.entities {
					m := comboMsg(st, fmt.Sprint(comboKeyPrefix(st), e), n)
					if c.delayed {
						m = delayedMsg(st, m, time.Second)
					}
					if err := publishChaos(k.js, m); err != nil {
						pubErr <- err
						return
					}
				}
			}
			<-tick.C
		}
	}()

	// The faults, one after another while messages are published.
	kills := 0
	for _, f := range faults {
		time.Sleep(f.after)
		t.Logf("%s: %s (%d delivered)", time.Now().Format("15:04:05.000"), f, a.delivered())
		switch f.kind {
		case "kill":
			kills++
			s.cs[f.courier].kill(t)
			s.cs[f.courier] = startChild(t, s.env("", f.courier))
			all = append(all, s.cs[f.courier])
		case "term":
			s.term(f.courier)
			s.cs[f.courier] = startChild(t, s.env("", f.courier))
			all = append(all, s.cs[f.courier])
		case "node":
			leader := k.c.StreamLeader("ORDERS")
			if leader < 0 {
				continue
			}
			k.c.Shutdown(leader)
			time.Sleep(f.lasts)
			k.c.Restart(leader)
		case "outage":
			a.at.down()
			time.Sleep(f.lasts)
			a.at.up()
		case "storm":
			a.storm.Store(true)
			time.Sleep(f.lasts)
			a.storm.Store(false)
		case "slow":
			a.slow.Store(true)
			time.Sleep(f.lasts)
			a.slow.Store(false)
		case "unpin":
			comboUnpin(t, k, c, rng)
		case "pause":
			comboPause(t, s, c, f.lasts)
		case "rewind":
			comboRewind(t, s, c, a.keyedApp, f.back)
		}
	}
	for !published.Load() {
		time.Sleep(50 * time.Millisecond) // polled: the publisher's end is the condition
	}
	select {
	case err := <-pubErr:
		t.Fatalf("publishing: %v", err)
	default:
	}
	a.mu.Lock()
	during := a.longestGap
	a.longestGap, a.lastOK = 0, time.Now()
	a.mu.Unlock()

	a.waitAllDelivered(t, 3*time.Minute, p.entities, rounds, func() bool { return comboDrained(k, c) },
		func() *jetstream.ConsumerInfo { return k.consumerInfo("courier") })
	chaosSummary(t, all)
	a.check(t, p.entities, rounds)
	for _, st := range c.subscriptions() {
		if dls := k.deadLetters("dlq." + st + ".courier"); len(dls) > 0 {
			t.Errorf("%d dead letters of %s, want none; first: %v", len(dls), st, dls[0].Header)
		}
	}
	a.mu.Lock()
	dups, replayDups, after := a.dups, a.replay.dups, a.longestGap
	a.mu.Unlock()
	t.Logf("%s: %d messages, %d kills: %d duplicate requests, %d of a replay; longest time without a first 2xx: %s during the faults, %s after them",
		c, rounds*p.entities*len(c.subscriptions()), kills, dups, replayDups, during.Round(time.Millisecond), after.Round(time.Millisecond))
	// A kill repeats what was at the app (requests of up to batch
	// entries) and what was answered and not yet recorded (about one
	// more per request); a replay's, as a first delivery's.
	most := kills * c.mostInflight() * (c.batch + 1) * len(c.subscriptions())
	if dups > most {
		t.Errorf("%d duplicate requests through %d kills, want at most %d (what the killed couriers had at the app)", dups, kills, most)
	}
	if replayDups > most {
		t.Errorf("%d duplicate requests of a replay through %d kills, want at most %d (what the killed couriers had at the app)", replayDups, kills, most)
	}
	// Once the faults end, a takeover may wait out an ack wait for what a
	// killed courier held, and 2 s more (docs/order.md); nothing longer.
	// (The app fails some messages on purpose: a probe may draw one, so the
	// breaker's probes are capped at 2 s, COURIER_BREAKER_PROBE_MAX.)
	if most := 2*comboAckWait + 2*time.Second; after > most {
		t.Errorf("no message answered 2xx for the first time for %s after the faults ended, want at most %s", after.Round(time.Millisecond), most)
	}
	// Every courier stops cleanly.
	for i := range s.cs {
		s.term(i)
	}
}

// fault is one event of a combination's schedule.
type fault struct {
	kind    string
	after   time.Duration // after the one before
	lasts   time.Duration // outage, storm, slow, node, pause
	courier int           // kill, term
	back    time.Duration // rewind: how long before it its point was answered 2xx
}

func (f fault) String() string {
	switch f.kind {
	case "kill":
		return fmt.Sprintf("courier %d killed (SIGKILL) and started again on an empty disk", f.courier)
	case "term":
		return fmt.Sprintf("courier %d stopped with SIGTERM and started again", f.courier)
	case "node":
		return fmt.Sprintf("the stream leader's node stopped for %s", f.lasts)
	case "outage":
		return fmt.Sprintf("the app unreachable for %s", f.lasts)
	case "storm":
		return fmt.Sprintf("the app answering 503 for %s", f.lasts)
	case "slow":
		return fmt.Sprintf("the app five times slower for %s", f.lasts)
	case "unpin":
		return "the pin moved by JetStream's unpin"
	case "pause":
		return fmt.Sprintf("the consumer paused for %s, then resumed", f.lasts)
	case "rewind":
		return fmt.Sprintf("every durable rewound (courier rewind --to-seq) to a message the app answered %s before", f.back)
	}
	return f.kind
}

// comboFaults draws the schedule of faults for c over publish and a few
// seconds more: one every 1.5-3 s, kills the most often, the node lost at
// most once, an unpin only where a pin keeps order.
func comboFaults(rng *rand.Rand, c combo, publish time.Duration) []fault {
	kinds := []string{"kill", "kill", "kill", "term", "node", "outage", "storm", "slow", "pause"}
	if c.order != "none" {
		kinds = append(kinds, "unpin", "unpin")
	}
	n := min(12, int(publish/(2*time.Second))+2)
	var out []fault
	node := false
	for len(out) < n {
		f := fault{kind: kinds[rng.IntN(len(kinds))], after: time.Duration(1500+rng.IntN(1500)) * time.Millisecond,
			lasts: time.Duration(1500+rng.IntN(2000)) * time.Millisecond, courier: rng.IntN(c.couriers())}
		if f.kind == "node" {
			if node {
				continue
			}
			node = true
		}
		out = append(out, f)
	}
	return out
}

// faultsSpan is how long faults take from first to last.
func faultsSpan(faults []fault) time.Duration {
	var d time.Duration
	for _, f := range faults {
		d += f.after
		switch f.kind {
		case "node", "outage", "storm", "slow", "pause":
			d += f.lasts
		}
	}
	return d
}

// comboUnpin moves a pin: the durable's with one active courier, a random
// partition's with partitions, on a random subscription.
func comboUnpin(t *testing.T, k *cluster, c combo, rng *rand.Rand) {
	t.Helper()
	st := c.subscriptions()[rng.IntN(len(c.subscriptions()))]
	stream, consumer := st, "courier"
	if c.order == "partitions" {
		stream, consumer = partition.StreamName(st, "courier"), partition.ConsumerName("courier", rng.IntN(6))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := k.js.Stream(ctx, stream)
	if err == nil {
		err = s.UnpinConsumer(ctx, consumer, "courier")
	}
	if err != nil {
		t.Logf("unpin %s/%s: %v (a node may be down)", stream, consumer, err)
	}
}

// comboPause pauses every subscription's consumer for d with `courier
// pause`, and resumes it with `courier resume` once d is over.
func comboPause(t *testing.T, s *replicaSet, c combo, d time.Duration) {
	t.Helper()
	env := s.env("", 0)
	command := func(args ...string) {
		var out, errOut strings.Builder
		if err := run(context.Background(), args, env, &out, &errOut); err != nil {
			t.Errorf("courier %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
		}
	}
	each := func(args ...string) {
		if !c.subs {
			command(args...)
			return
		}
		for _, sub := range []string{"orders", "audit"} {
			command(append(args, "--subscription", sub)...)
		}
	}
	each("pause", "--for", "1m")
	time.Sleep(d)
	each("resume")
}

// comboDrained reports whether every subscription's durable (each of its
// partitions) has nothing left to deliver or waiting for an ack.
func comboDrained(k *cluster, c combo) bool {
	for _, st := range c.subscriptions() {
		if c.order == "partitions" {
			work := partition.StreamName(st, "courier")
			for i := range 6 {
				ci := k.consumerInfoOn(work, partition.ConsumerName("courier", i))
				if ci == nil || ci.NumPending != 0 || ci.NumAckPending != 0 {
					return false
				}
			}
			continue
		}
		ci := k.consumerInfoOn(st, "courier")
		if ci == nil || ci.NumPending != 0 || ci.NumAckPending != 0 {
			return false
		}
	}
	return true
}
