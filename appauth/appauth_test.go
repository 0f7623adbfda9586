package appauth

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// openWith writes the secrets (one a line) and token files and opens them.
func openWith(t *testing.T, secrets []string, token string) *Auth {
	t.Helper()
	dir := t.TempDir()
	o := Options{Interval: time.Hour}
	if len(secrets) > 0 {
		o.SecretsFile = filepath.Join(dir, "secrets")
		writeFile(t, o.SecretsFile, strings.Join(secrets, "\n")+"\n")
	}
	if token != "" {
		o.TokenFile = filepath.Join(dir, "token")
		writeFile(t, o.TokenFile, token+"\n")
	}
	a, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// TestStampOverHTTP: a stamped request, sent by net/http and read by an
// httptest server, verifies with the Standard Webhooks Go library from the
// headers and body the app received; webhook-id is the Idempotency-Key,
// webhook-timestamp the moment of stamping; the token is a Bearer
// Authorization; headers of the same names the request had are replaced.
func TestStampOverHTTP(t *testing.T) {
	s1, s2 := newSecret(t), newSecret(t)
	a := openWith(t, []string{s1, s2}, "tok-123")

	type got struct {
		h    http.Header
		body []byte
	}
	var mu sync.Mutex
	var seen []got
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, got{r.Header.Clone(), b})
		mu.Unlock()
	}))
	defer app.Close()

	send := func(h http.Header, body []byte) got {
		t.Helper()
		a.Stamp(h, body)
		req, _ := http.NewRequest(http.MethodPost, app.URL, bytes.NewReader(body))
		req.Header = h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		mu.Lock()
		defer mu.Unlock()
		return seen[len(seen)-1]
	}

	before := time.Now().Unix()
	body := []byte(`{"id":7}`)
	r := send(http.Header{"Idempotency-Key": {"order-7"}, "Webhook-Signature": {"v1,forged"}, "Authorization": {"Basic eA=="}}, body)
	after := time.Now().Unix()
	if id := r.h.Get("webhook-id"); id != "order-7" {
		t.Errorf("webhook-id %q, want the Idempotency-Key order-7", id)
	}
	if ts, _ := strconv.ParseInt(r.h.Get("webhook-timestamp"), 10, 64); ts < before || ts > after {
		t.Errorf("webhook-timestamp %d, not the moment of sending (%d..%d)", ts, before, after)
	}
	if strings.Contains(r.h.Get("webhook-signature"), "forged") || len(r.h.Values("webhook-signature")) != 1 {
		t.Errorf("the request's own webhook-signature was kept: %q", r.h.Values("webhook-signature"))
	}
	if v := r.h.Values("Authorization"); len(v) != 1 || v[0] != "Bearer tok-123" {
		t.Errorf("Authorization %q, want [Bearer tok-123]", v)
	}
	for i, s := range []string{s1, s2} {
		wh, _ := standardwebhooks.NewWebhook(s)
		if err := wh.Verify(r.body, r.h); err != nil {
			t.Errorf("secret %d: the app cannot verify the request: %v", i+1, err)
		}
	}

	// No Idempotency-Key (a health probe, a request/reply call): a
	// random id each time, and an empty body signed as such.
	r1, r2 := send(http.Header{}, nil), send(http.Header{}, nil)
	id1, id2 := r1.h.Get("webhook-id"), r2.h.Get("webhook-id")
	if !strings.HasPrefix(id1, "msg_") || id1 == id2 {
		t.Errorf("ids without a key: %q, %q; want distinct msg_ ids", id1, id2)
	}
	wh, _ := standardwebhooks.NewWebhook(s1)
	if err := wh.Verify(r1.body, r1.h); err != nil {
		t.Errorf("an empty body does not verify: %v", err)
	}
}

// TestInactive: with neither file, Stamp adds nothing and Token is "".
func TestInactive(t *testing.T) {
	a, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	h := http.Header{"Idempotency-Key": {"k"}}
	a.Stamp(h, []byte("x"))
	if a.Active() || len(h) != 1 || a.Token() != "" {
		t.Errorf("Active %v, headers %v, Token %q: want false, the key alone, empty", a.Active(), h, a.Token())
	}
	var none *Auth
	if none.Token() != "" {
		t.Error("a nil Auth has a token")
	}
}

// nodeDir holds the package.json and package-lock.json of the Node test:
// the standardwebhooks package of the npm registry, installed by the test
// (npm ci) into its node_modules, which git ignores.
const nodeDir = "testdata/node"

// TestVerifiedByNode: the standardwebhooks npm package, the reference
// verifier for Node, accepts courier's requests with each secret alone and
// refuses them with a secret not listed. Skipped only where node or npm is
// not installed.
func TestVerifiedByNode(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the Node verifier cannot run here")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("npm is not installed: the Node verifier cannot be installed here")
	}
	if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", "standardwebhooks", "package.json")); err != nil {
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts")
		cmd.Dir = nodeDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", nodeDir, err, out)
		}
	}

	s1, s2, other := newSecret(t), newSecret(t), newSecret(t)
	a := openWith(t, []string{s1, s2}, "")
	type request struct {
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	}
	var reqs []request
	for i, body := range []string{`{"order":1}`, "plain text, ünïcode", ""} {
		h := http.Header{}
		if i != 2 {
			h.Set("Idempotency-Key", "ORDERS:1700000000000000000:"+strconv.Itoa(i+1))
		}
		a.Stamp(h, []byte(body))
		m := map[string]string{}
		for k := range h {
			m[strings.ToLower(k)] = h.Get(k)
		}
		reqs = append(reqs, request{m, body})
	}
	in, _ := json.Marshal(map[string]any{"secrets": []string{s1, s2}, "other": other, "requests": reqs})

	cmd := exec.Command(node, "verify.js")
	cmd.Dir = nodeDir
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node verify.js: %v\n%s", err, out)
	}
	var res struct {
		Verified [][]bool `json:"verified"` // per request, per secret
		Other    []bool   `json:"other"`    // per request, with the secret not listed
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("node's output %q: %v", out, err)
	}
	if len(res.Verified) != len(reqs) {
		t.Fatalf("node verified %d requests, want %d: %s", len(res.Verified), len(reqs), out)
	}
	for i := range reqs {
		for j, ok := range res.Verified[i] {
			if !ok {
				t.Errorf("request %d: standardwebhooks refuses it with secret %d", i+1, j+1)
			}
		}
		if res.Other[i] {
			t.Errorf("request %d: standardwebhooks accepts it with a secret not listed", i+1)
		}
	}
}

// BenchmarkStamp is the cost Stamp adds to each request: a 1 KiB body
// signed with one secret (steady state) and with two (during a rotation),
// plus the token.
func BenchmarkStamp(b *testing.B) {
	body := bytes.Repeat([]byte("x"), 1024)
	for _, n := range []int{1, 2} {
		b.Run(strconv.Itoa(n)+" secrets", func(b *testing.B) {
			secrets := make([]string, n)
			for i := range secrets {
				secrets[i] = newSecret(b)
			}
			dir := b.TempDir()
			o := Options{SecretsFile: filepath.Join(dir, "s"), TokenFile: filepath.Join(dir, "t"), Interval: time.Hour}
			if err := os.WriteFile(o.SecretsFile, []byte(strings.Join(secrets, "\n")), 0o600); err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(o.TokenFile, []byte("tok"), 0o600); err != nil {
				b.Fatal(err)
			}
			a, err := Open(o)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			h := http.Header{"Idempotency-Key": {"ORDERS:1700000000000000000:42"}}
			b.ReportAllocs()
			for b.Loop() {
				a.Stamp(h, body)
			}
		})
	}
}
