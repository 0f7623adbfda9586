package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// publishEnv turns the publish API on, on a free loopback port.
var publishEnv = []string{"COURIER_PUBLISH_ADDR=127.0.0.1:0", "COURIER_PUBLISH_SUBJECTS=orders.>,events.*"}

// publishAddr waits for the publish API's start-up line and returns its
// address.
func publishAddr(t *testing.T, c *courier) string {
	t.Helper()
	var addr string
	poll.Until(t, 10*time.Second, "the publish API's start-up log line", func() bool {
		if recs := logLines(c, "publish API listening"); len(recs) > 0 {
			addr, _ = recs[0]["addr"].(string)
		}
		return addr != ""
	})
	return addr
}

// pubAnswer is one answer of the publish API.
type pubAnswer struct {
	status     int
	retryAfter string
	at         time.Time
	Stream     string `json:"stream"`
	Seq        uint64 `json:"seq"`
	Error      string `json:"error"`
}

// postPublish publishes body to subject through courier at addr.
func postPublish(addr, subject, body, key string) (pubAnswer, error) {
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/publish/"+subject, strings.NewReader(body))
	if err != nil {
		return pubAnswer{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return pubAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return pubAnswer{}, err
	}
	ans := pubAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), at: time.Now()}
	if err := json.Unmarshal(b, &ans); err != nil {
		return ans, fmt.Errorf("answer %d %q: %w", resp.StatusCode, b, err)
	}
	return ans, nil
}

// postBatch publishes a batch through courier at addr, an entry per key
// (the key its data and its idempotency key), and returns each entry's
// answer by key, at the batch's time and with its Retry-After.
func postBatch(addr, subject string, keys []string) (map[string]pubAnswer, error) {
	type entry struct {
		IdempotencyKey string `json:"idempotencyKey"`
		DataBase64     []byte `json:"dataBase64"`
	}
	var body struct {
		Entries []entry `json:"entries"`
	}
	for _, k := range keys {
		body.Entries = append(body.Entries, entry{k, []byte(k)})
	}
	raw, _ := json.Marshal(body)
	resp, err := http.Post("http://"+addr+"/v1/publish-batch/"+subject, "application/json", strings.NewReader(string(raw)))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var ans struct {
		Entries []struct {
			Status int    `json:"status"`
			Stream string `json:"stream"`
			Seq    uint64 `json:"seq"`
			Error  string `json:"error"`
		} `json:"entries"`
		Error string `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
		return nil, fmt.Errorf("batch answer %d: %w", resp.StatusCode, err)
	}
	if len(ans.Entries) != len(keys) {
		return nil, fmt.Errorf("batch answered %d with %d entries for %d: %s", resp.StatusCode, len(ans.Entries), len(keys), ans.Error)
	}
	out := make(map[string]pubAnswer, len(keys))
	for i, e := range ans.Entries {
		out[keys[i]] = pubAnswer{status: e.Status, retryAfter: resp.Header.Get("Retry-After"), at: time.Now(),
			Stream: e.Stream, Seq: e.Seq, Error: e.Error}
	}
	return out, nil
}

// TestPublishThroughCourier: with COURIER_PUBLISH_ADDR set, the publish
// API answers by the time courier reports ready, and what the app publishes
// is stored and, on a consumed subject, delivered back to the app.
func TestPublishThroughCourier(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	c := start(t, h.env(a.URL, publishEnv...))
	admin := adminAddr(t, c)
	poll.Until(t, 20*time.Second, "courier ready", func() bool {
		code, _ := get(t, "http://"+admin+"/readyz")
		return code == http.StatusOK
	})
	// Ready implies the API is up: its line is logged before.
	if len(logLines(c, "publish API listening")) == 0 {
		t.Fatal("courier ready before the publish API listened")
	}
	addr := publishAddr(t, c)
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("publish API on %s", addr)
	}
	ans, err := postPublish(addr, "orders.paid", `{"order":1}`, "paid-1")
	if err != nil || ans.status != 200 || ans.Stream != "ORDERS" {
		t.Fatalf("publish: %+v %v", ans, err)
	}
	poll.Until(t, 10*time.Second, "the published message delivered to the app", func() bool { return a.calls("paid-1") == 1 })
	if r := a.requests()[0]; r.Body != `{"order":1}` || r.Header.Get("Courier-Sequence") != fmt.Sprint(ans.Seq) {
		t.Errorf("the app got %q, Courier-Sequence %s; published seq %d", r.Body, r.Header.Get("Courier-Sequence"), ans.Seq)
	}
	if ans, err := postPublish(addr, "billing.x", "x", ""); err != nil || ans.status != http.StatusForbidden {
		t.Errorf("outside COURIER_PUBLISH_SUBJECTS: %+v %v", ans, err)
	}
}

// TestPublishToken: with COURIER_APP_TOKEN_FILE, a publish without its
// token is refused 401; with it, stored.
func TestPublishToken(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := start(t, h.env(a.URL, append(publishEnv, "COURIER_APP_TOKEN_FILE="+tokenFile)...))
	addr := publishAddr(t, c)
	if ans, err := postPublish(addr, "orders.created", "x", ""); err != nil || ans.status != http.StatusUnauthorized {
		t.Errorf("without the token: %+v %v", ans, err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/publish/orders.created", strings.NewReader("x"))
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("with the token: %d", resp.StatusCode)
	}
}

// TestPublishBeforeNATS: the publish API is up while courier still
// connects: a publish then is answered 503 with Retry-After once its time
// (COURIER_HTTP_TIMEOUT) is over, not refused at the door.
func TestPublishBeforeNATS(t *testing.T) {
	a := newApp(t, nil)
	env := newHarness(t).env(a.URL, append(publishEnv, "NATS_URL=nats://127.0.0.1:1", "COURIER_HTTP_TIMEOUT=1s")...)
	c := start(t, env)
	addr := publishAddr(t, c)
	ans, err := postPublish(addr, "orders.created", "x", "k")
	if err != nil || ans.status != http.StatusServiceUnavailable || ans.retryAfter == "" || !strings.Contains(ans.Error, "not connected") {
		t.Errorf("while courier connects: %+v %v", ans, err)
	}
	start := time.Now()
	if err := c.stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	if d := time.Since(start); d > 4*time.Second { // the harness's grace is 5s
		t.Errorf("a courier that never reached NATS kept the publish API open %s after the signal", d)
	}
}

// TestPublishThroughSIGTERM: publishes in flight when the stop signal
// arrives, and those the app sends during the grace period, are answered
// 200 and stored; the API closes once COURIER_SHUTDOWN_GRACE is over, and
// every 200 it gave names a stored message (never a success without an
// acknowledgement). Batches likewise, entry by entry.
func TestPublishThroughSIGTERM(t *testing.T) {
	const grace = 2 * time.Second
	h := newHarness(t)
	if _, err := h.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		t.Fatal(err)
	}
	a := newApp(t, nil)
	c := start(t, h.env(a.URL, append(publishEnv, "COURIER_SHUTDOWN_GRACE="+grace.String())...))
	addr := publishAddr(t, c)

	var (
		mu      sync.Mutex
		answers = map[string]pubAnswer{}
		wg      sync.WaitGroup
	)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				ans, err := postPublish(addr, "events.created", key, key)
				if err != nil {
					return // the API has closed
				}
				mu.Lock()
				answers[key] = ans
				mu.Unlock()
			}
		})
	}
	// And one sending batches of five.
	wg.Go(func() {
		for i := 0; ; i++ {
			keys := make([]string, 5)
			for j := range keys {
				keys[j] = fmt.Sprintf("b%d-%d", i, j)
			}
			got, err := postBatch(addr, "events.created", keys)
			if err != nil {
				return // the API has closed
			}
			mu.Lock()
			maps.Copy(answers, got)
			mu.Unlock()
		}
	})
	poll.Until(t, 10*time.Second, "publishes stored", func() bool { mu.Lock(); defer mu.Unlock(); return len(answers) >= 50 })
	signalled := time.Now()
	c.cancel() // SIGTERM
	err, ok := c.exited(30 * time.Second)
	if !ok || err != nil {
		t.Fatalf("courier's exit: %v (exited %v)", err, ok)
	}
	stopped := time.Since(signalled)
	wg.Wait()

	events, err := h.js.Stream(t.Context(), "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	var last time.Time
	var afterSignal int
	for key, ans := range answers {
		switch ans.status {
		case http.StatusOK:
			m, err := events.GetMsg(t.Context(), ans.Seq)
			if err != nil || string(m.Data) != key || m.Header.Get(nats.MsgIdHdr) != key {
				t.Errorf("%s answered 200 seq %d: stored %v (%v)", key, ans.Seq, m, err)
				continue
			}
			if ans.at.After(last) {
				last = ans.at
			}
			if ans.at.After(signalled) {
				afterSignal++
			}
		case http.StatusServiceUnavailable:
			if ans.retryAfter == "" {
				t.Errorf("%s: 503 without Retry-After", key)
			}
		default:
			t.Errorf("%s: %d %s", key, ans.status, ans.Error)
		}
	}
	var batched int
	for key, ans := range answers {
		if strings.HasPrefix(key, "b") && ans.status == http.StatusOK && ans.at.After(signalled) {
			batched++
		}
	}
	if batched == 0 {
		t.Error("no batch entry answered 200 after the signal")
	}
	t.Logf("%d publishes (%d batch entries answered 200 after the signal), %d answered 200 after the signal, the last %s after it; courier stopped %s after it",
		len(answers), batched, afterSignal, last.Sub(signalled).Round(time.Millisecond), stopped.Round(time.Millisecond))
	if stopped < grace || last.Sub(signalled) < grace/2 || afterSignal == 0 {
		t.Errorf("courier stopped %s after the signal, the last 200 %s after it (%d after the signal): the API must stay up for the grace period (%s)",
			stopped, last.Sub(signalled), afterSignal, grace)
	}
}
