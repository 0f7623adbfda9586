package dedup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/courierhq/courier/internal/metricstest"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

// openShared opens a shared store on js with a fresh local cache, closed
// when the test ends.
func openShared(t testing.TB, js jetstream.JetStream, o SharedOptions) *Shared {
	t.Helper()
	return openSharedIn(t, js, t.TempDir(), o)
}

// openSharedIn opens a shared store on js with its local cache in dir,
// closed when the test ends.
func openSharedIn(t testing.TB, js jetstream.JetStream, dir string, o SharedOptions) *Shared {
	t.Helper()
	if o.TTL == 0 {
		o.TTL = hour
	}
	if o.Scope == "" {
		o.Scope = "S/c"
	}
	local, err := Open(dir, Options{TTL: o.TTL, Scope: o.Scope})
	if err != nil {
		t.Fatal(err)
	}
	var s *Shared
	t.Cleanup(func() {
		if s == nil {
			_ = local.Close()
		}
	})
	natstest.Try(t, "OpenShared", func(ctx context.Context) error {
		s, err = OpenShared(ctx, js, local, o)
		return err
	})
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// consumedStream creates, beside the bucket, the stream a courier consumes,
// as in every real deployment, for the tests that delete the bucket.
// Deleting an account's last stream makes nats-server remove the account's
// empty streams directory in a goroutine of its own, which can race a create
// that follows at once: the create fails with "error creating store for
// stream" (10049; the server logs "mkdir .../streams: no such file or
// directory"). With another stream in the account the directory stays.
func consumedStream(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
}

func mustCheck(t *testing.T, s interface {
	Check(context.Context, string) (Verdict, error)
}, key string, want Verdict) {
	t.Helper()
	got, err := s.Check(context.Background(), key)
	if err != nil {
		t.Fatalf("Check(%q): %v", key, err)
	}
	if got != want {
		t.Fatalf("Check(%q) = %v, want %v", key, got, want)
	}
}

// TestSharedLifeOfAKey walks a key through claim, release, claim, record,
// across two couriers on one server and a third on another scope.
func TestSharedLifeOfAKey(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	a := openShared(t, js, SharedOptions{Registerer: reg})
	b := openShared(t, js, SharedOptions{})
	other := openShared(t, js, SharedOptions{Scope: "S/other"})
	key := "order 7: any bytes \x00 at all"

	mustCheck(t, a, key, New)
	mustCheck(t, b, key, Claimed)
	mustCheck(t, a, key, Claimed) // a's own claim too: one delivery per key at a time
	mustCheck(t, other, key, New) // scopes do not share keys

	if err := a.Release(ctx, key); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, b, key, New) // released: the next delivery goes ahead at once
	if err := a.Release(ctx, key); err != nil {
		t.Fatalf("Release without a claim: %v", err)
	}
	mustCheck(t, a, key, Claimed) // a's late release did not remove b's claim

	if err := b.Record(ctx, key); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, b, key, Processed)
	mustCheck(t, a, key, Processed)
	if seen, err := a.local.Seen(ctx, key); err != nil || !seen {
		t.Errorf("a key found processed in the bucket is not cached locally: %v %v", seen, err)
	}
	if err := b.Release(ctx, key); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, a, key, Processed) // a release after Record changes nothing

	// A record without a claim (a claim lapsed, another courier's) is kept.
	if err := a.Record(ctx, "unclaimed"); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, b, "unclaimed", Processed)
	if seen, err := b.Seen(ctx, "unclaimed"); err != nil || !seen {
		t.Errorf("Seen: %v %v", seen, err)
	}

	if _, err := a.Check(ctx, ""); !errors.Is(err, ErrEmptyKey) {
		t.Errorf("empty key: %v", err)
	}
	long := string(make([]byte, 10000))
	mustCheck(t, a, long, New)
	mustCheck(t, b, long, Claimed)

	if n := metricstest.Value(t, reg, "courier_dedup_shared_checks_total", "answer", "new"); n == 0 {
		t.Errorf("courier_dedup_shared_checks_total{answer=\"new\"} = 0 after checks of new keys")
	}
}

// TestSharedConcurrentClaims: many deliveries of one key at once on
// several couriers: exactly one is New.
func TestSharedConcurrentClaims(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	stores := []*Shared{openShared(t, js, SharedOptions{}), openShared(t, js, SharedOptions{})}
	concurrentClaims(t, stores)
}

func concurrentClaims(t *testing.T, stores []*Shared) {
	t.Helper()
	ctx := context.Background()
	for round := range 20 {
		key := fmt.Sprint("race-", round)
		var mu sync.Mutex
		count := map[Verdict]int{}
		var wg sync.WaitGroup
		for i := range 8 {
			s := stores[i%len(stores)]
			wg.Go(func() {
				v, err := s.Check(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				count[v]++
				mu.Unlock()
			})
		}
		wg.Wait()
		if count[New] != 1 || count[Claimed] != 7 {
			t.Fatalf("%s: verdicts %v, want one new and seven claimed", key, count)
		}
	}
}

// TestSharedClaimLapses: a claim nobody records or releases (its courier
// died: its store no longer renews the claim) lapses after the claim TTL,
// and the key can be claimed again.
func TestSharedClaimLapses(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	claimLapses(t, js, js)
}

func claimLapses(t *testing.T, jsA, jsB jetstream.JetStream) {
	t.Helper()
	a := openShared(t, jsA, SharedOptions{ClaimTTL: time.Second})
	b := openShared(t, jsB, SharedOptions{ClaimTTL: time.Second})
	mustCheck(t, a, "dies", New)
	if err := a.Close(); err != nil { // the courier dies holding the claim
		t.Fatal(err)
	}
	began := time.Now()
	mustCheck(t, b, "dies", Claimed)
	poll.Until(t, 10*time.Second, "the claim lapses", func() bool {
		v, err := b.Check(context.Background(), "dies")
		if err != nil {
			t.Fatal(err)
		}
		return v == New
	})
	t.Logf("claim of 1s taken over after %v", time.Since(began).Round(time.Millisecond))
	if err := b.Record(context.Background(), "dies"); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, openShared(t, jsA, SharedOptions{ClaimTTL: time.Second}), "dies", Processed)
}

// TestSharedClaimRenewedWhileHeld: a claim whose holder lives (its delivery
// held by an app outage, longer than the claim TTL) does not lapse, so
// another courier's delivery of the key waits; the holder's Release, after
// renewals, still ends it.
func TestSharedClaimRenewedWhileHeld(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	a := openShared(t, js, SharedOptions{ClaimTTL: time.Second})
	b := openShared(t, js, SharedOptions{ClaimTTL: time.Second})
	mustCheck(t, a, "held", New)
	for range 6 { // three claim TTLs
		time.Sleep(500 * time.Millisecond)
		mustCheck(t, b, "held", Claimed)
	}
	if err := a.Release(context.Background(), "held"); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, b, "held", New)
}

// TestSharedKeysExpire: a processed key is forgotten after the TTL, in the
// bucket as in the local cache.
func TestSharedKeysExpire(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	a := openShared(t, js, SharedOptions{TTL: time.Second, ClaimTTL: time.Second})
	b := openShared(t, js, SharedOptions{TTL: time.Second, ClaimTTL: time.Second})
	mustCheck(t, a, "brief", New)
	if err := a.Record(context.Background(), "brief"); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, b, "brief", Processed)
	poll.Until(t, 10*time.Second, "the key is forgotten", func() bool {
		v, err := b.Check(context.Background(), "brief")
		if err != nil {
			t.Fatal(err)
		}
		return v == New
	})
}

// TestSharedRecordMany records a batch in one call, some keys claimed, some
// not, one recorded already; a batch with an empty key records none.
func TestSharedRecordMany(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	a := openShared(t, js, SharedOptions{})
	b := openShared(t, js, SharedOptions{})
	if err := a.Record(ctx, "k-3"); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 300)
	for i := range keys {
		keys[i] = fmt.Sprint("k-", i)
		if i%2 == 0 {
			a.Check(ctx, keys[i])
		}
	}
	if err := a.Record(ctx, keys...); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		mustCheck(t, b, k, Processed)
	}
	if err := a.Record(ctx, "x-1", "", "x-2"); !errors.Is(err, ErrEmptyKey) {
		t.Fatalf("batch with an empty key: %v, want ErrEmptyKey", err)
	}
	mustCheck(t, b, "x-1", New)
}

// TestSharedBucketDeleted: a bucket deleted under running couriers is
// created again at the next write, and nothing is answered wrongly.
func TestSharedBucketDeleted(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	consumedStream(t, js)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	a := openShared(t, js, SharedOptions{Registerer: reg})
	b := openShared(t, js, SharedOptions{})
	mustCheck(t, a, "before", New)
	if err := a.Record(ctx, "before"); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, DefaultBucket); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, a, "before", Processed) // its own keys: in its local cache
	mustCheck(t, b, "after", New)        // recreates the bucket
	mustCheck(t, a, "after", Claimed)
	if got := metricstest.Value(t, reg, "courier_dedup_shared_bucket_recreated_total"); got > 1 {
		t.Errorf("recreated %v times by a", got)
	}

	if err := js.DeleteKeyValue(ctx, DefaultBucket); err != nil {
		t.Fatal(err)
	}
	if err := b.Record(ctx, "after"); err != nil { // a record recreates it too
		t.Fatal(err)
	}
	mustCheck(t, a, "after", Processed)
}

// TestSharedBucketMadeAgainWithoutTTL: a bucket deleted under running
// couriers and made again without per-key TTLs (`nats kv add`) gets them
// turned on at the next write, as OpenShared would, instead of refusing
// every check and record (every message held) until courier restarts.
func TestSharedBucketMadeAgainWithoutTTL(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	consumedStream(t, js)
	ctx := context.Background()
	a := openShared(t, js, SharedOptions{})
	b := openShared(t, js, SharedOptions{})
	mustCheck(t, a, "before", New)
	remake := func() {
		t.Helper()
		if err := js.DeleteKeyValue(ctx, DefaultBucket); err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: DefaultBucket, History: 1}); err != nil {
			t.Fatal(err)
		}
	}
	remake()
	mustCheck(t, a, "after", New)
	mustCheck(t, b, "after", Claimed)

	remake()
	if err := a.Record(ctx, "after"); err != nil { // a record turns them on too
		t.Fatal(err)
	}
	mustCheck(t, b, "after", Processed)
}

// TestSharedBucketChecks: OpenShared turns per-key TTLs on in a bucket made
// without them (by the earlier kv store), reading its keys as processed, and
// refuses a bucket that would forget keys early.
func TestSharedBucketChecks(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()

	old, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "OLD", History: 1, TTL: hour})
	if err != nil {
		t.Fatal(err)
	}
	a := openShared(t, js, SharedOptions{Bucket: "OLD"})
	bk, _ := a.own.bucketKey("from-kv")
	if _, err := old.Create(ctx, bk[len("$KV.OLD."):], nil); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, a, "from-kv", Processed)
	mustCheck(t, a, "fresh", New)
	st, err := js.Stream(ctx, "KV_OLD")
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; !c.AllowMsgTTL || c.SubjectDeleteMarkerTTL == 0 {
		t.Errorf("per-key TTL not turned on: %+v", c)
	}

	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "SHORT", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	local := openStore(t, t.TempDir(), Options{})
	_, err = OpenShared(ctx, js, local, SharedOptions{Bucket: "SHORT", TTL: hour})
	if !errors.Is(err, ErrBucket) {
		t.Fatalf("bucket with a 1m max age for a 1h TTL: %v, want ErrBucket", err)
	}
	t.Log(err)
	_, err = OpenShared(ctx, js, local, SharedOptions{Bucket: "OLD", TTL: hour, Replicas: 3})
	if !errors.Is(err, ErrBucket) {
		t.Fatalf("R1 bucket for 3 replicas: %v, want ErrBucket", err)
	}
	t.Log(err)
	for _, o := range []SharedOptions{{}, {TTL: 1500 * time.Millisecond}, {TTL: hour, ClaimTTL: 10 * time.Millisecond}} {
		if _, err := OpenShared(ctx, js, local, o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
}

// TestSharedUnreachable: with the server down a check returns an error, in
// bounded time, never New; a key known locally is still answered.
func TestSharedUnreachable(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	a := openShared(t, js, SharedOptions{Timeout: 500 * time.Millisecond})
	if err := a.Record(ctx, "known"); err != nil {
		t.Fatal(err)
	}
	natstest.Stop(srv)
	began := time.Now()
	if v, err := a.Check(ctx, "unknown"); err == nil {
		t.Fatalf("Check with the server down: %v, no error", v)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("Check took %v", took)
	}
	mustCheck(t, a, "known", Processed)
	if err := a.Record(ctx, "during"); err == nil {
		t.Error("Record with the server down: no error")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Check(ctx, "known"); !errors.Is(err, ErrClosed) {
		t.Errorf("Check after Close: %v", err)
	}
}

// TestCreateBucketTimeoutIsRetryable: a bucket whose creation times out (a
// cluster slow to place its replicas) fails with the timeout in the error's
// chain, so that start-up retries it rather than giving up.
func TestCreateBucketTimeoutIsRetryable(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	s := &Shared{js: js, bucket: "SLOW", stream: "KV_SLOW", replicas: 1, ttl: hour, claimTTL: 5 * time.Second}
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	err := s.createBucket(ctx)
	if !errors.Is(err, ErrBucket) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("createBucket past its deadline: %v; want ErrBucket wrapping context.DeadlineExceeded", err)
	}
	if _, err := js.KeyValue(context.Background(), "SLOW"); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("bucket after the failed create: %v, want none", err)
	}
}

// TestSharedBucketErrorSeries: courier_dedup_shared_bucket_errors_total has
// a series at 0 from start-up for every operation it counts, so that a rate
// or an alert on it works before the first failure, and the operations
// guide lists every one of them.
func TestSharedBucketErrorSeries(t *testing.T) {
	const name = "courier_dedup_shared_bucket_errors_total"
	ops := []string{"claim", "read", "record", "release", "renew"}
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	reg := prometheus.NewRegistry()
	openShared(t, js, SharedOptions{Registerer: reg})

	if n, err := testutil.GatherAndCount(reg, name); err != nil || n != len(ops) {
		t.Errorf("%s has %d series (%v), want one per op %v", name, n, err, ops)
	}
	for _, op := range ops {
		if v := metricstest.Value(t, reg, name, "op", op); v != 0 {
			t.Errorf("%s{op=%q} = %v at start-up, want 0", name, op, v)
		}
	}

	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for line := range strings.Lines(string(doc)) {
		if strings.HasPrefix(line, "| `"+name+"`") {
			row = line
		}
	}
	if row == "" {
		t.Fatalf("docs/operations.md has no row for %s", name)
	}
	for _, op := range ops {
		if !strings.Contains(row, "`"+op+"`") {
			t.Errorf("docs/operations.md does not list op %q of %s: %s", op, name, row)
		}
	}
}
