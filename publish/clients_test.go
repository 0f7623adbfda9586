package publish

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
)

// TestPublishFromOtherLanguages: an app in Python or Node, with its
// standard library only, publishes through the API (testdata/client.py,
// testdata/client.mjs, run as subprocesses; Node with node:http and with
// fetch): its message is stored with its headers, a retry with the same
// Idempotency-Key is reported as the duplicate it is, the refusals reach it
// as statuses with a JSON error, and a batch's entries are each answered, a
// retry among them as a duplicate. So does curl. With a token and without
// one: a client on the loopback is not taken for a browser page.
func TestPublishFromOtherLanguages(t *testing.T) {
	for _, token := range []string{"t0ken", ""} {
		name := "token"
		if token == "" {
			name = "no token"
		}
		t.Run(name, func(t *testing.T) { publishFromOtherLanguages(t, token) })
	}
}

// publishFromOtherLanguages is TestPublishFromOtherLanguages against an
// API asking for token ("" for none).
func publishFromOtherLanguages(t *testing.T, token string) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	a := startAPI(t, srv.ClientURL(), Options{Token: func() string { return token }})

	t.Run("curl", func(t *testing.T) {
		bin, err := exec.LookPath("curl")
		if err != nil {
			t.Skipf("curl not installed (%v)", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, "-sS", "-w", "\n%{http_code}", "-H", "Authorization: Bearer "+token,
			"-H", "Idempotency-Key: curl-1", "--data-binary", "from curl", a.url+PathPrefix+"orders.curl").Output()
		if err != nil {
			t.Fatalf("curl: %v", err)
		}
		i := bytes.LastIndexByte(out, '\n')
		body, status := out[:max(i, 0)], string(out[i+1:])
		var ans answer
		if err := json.Unmarshal(body, &ans); err != nil || status != "200" || ans.Stream != "ORDERS" {
			t.Fatalf("curl: %s %q (%v)", status, body, err)
		}
		if m := stored(t, js, "ORDERS", ans.Seq); string(m.Data) != "from curl" || m.Header.Get(nats.MsgIdHdr) != "curl-1" {
			t.Errorf("stored %q with %v", m.Data, m.Header)
		}
	})
	for _, tt := range []struct{ lang, bin, script string }{
		{"python", "python3", "testdata/client.py"},
		{"node", "node", "testdata/client.mjs"},
	} {
		t.Run(tt.lang, func(t *testing.T) {
			bin, err := exec.LookPath(tt.bin)
			if err != nil {
				t.Skipf("%s not installed (%v): the %s client is not tried", tt.bin, err, tt.lang)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var stderr bytes.Buffer
			cmd := exec.CommandContext(ctx, bin, tt.script, a.url, token)
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s %s: %v\n%s", tt.bin, tt.script, err, stderr.String())
			}
			got := map[string]clientAnswer{}
			sc := bufio.NewScanner(bytes.NewReader(out))
			for sc.Scan() {
				var ca clientAnswer
				if err := json.Unmarshal(sc.Bytes(), &ca); err != nil {
					t.Fatalf("client output %q: %v", sc.Text(), err)
				}
				got[ca.Name] = ca
			}

			first, again := got["first"], got["again"]
			if first.Status != 200 || first.Answer.Stream != "ORDERS" || first.Answer.Duplicate {
				t.Errorf("first publish: %+v", first)
			}
			if again.Status != 200 || !again.Answer.Duplicate || again.Answer.Seq != first.Answer.Seq {
				t.Errorf("the retry: %+v, want a duplicate of seq %d", again, first.Answer.Seq)
			}
			if f := got["forbidden"]; f.Status != 403 || f.Answer.Error == "" {
				t.Errorf("outside the subjects: %+v", f)
			}
			if n := got["no-token"]; token != "" && (n.Status != 401 || n.Answer.Error == "") {
				t.Errorf("without the token: %+v", n)
			} else if token == "" && n.Status != 200 {
				t.Errorf("no token asked, none sent: %+v", n)
			}
			if f, ok := got["fetch"]; tt.lang == "node" && (!ok || f.Status != 200 || f.Answer.Stream != "ORDERS") {
				t.Errorf("with fetch: %+v", f)
			}
			b := got["batch"]
			if b.Status != 200 || len(b.Answer.Entries) != 3 {
				t.Fatalf("the batch: %+v", b)
			}
			for i, e := range b.Answer.Entries {
				if want := []string{"b1", "b2", "retry"}[i]; e.EntryID != want || e.Status != 200 || e.Duplicate != (want == "retry") {
					t.Errorf("batch entry %d: %+v, want %s", i, e, want)
				}
			}
			if r := b.Answer.Entries[2]; r.Seq != first.Answer.Seq {
				t.Errorf("the batch's retry of the first publish names seq %d, want %d", r.Seq, first.Answer.Seq)
			}
			if m := stored(t, js, "ORDERS", b.Answer.Entries[1].Seq); string(m.Data) != "\x00\x01" || m.Header.Get(nats.MsgIdHdr) != tt.lang+"-b2" {
				t.Errorf("batch entry b2 stored as %q with %v", m.Data, m.Header)
			}
			m := stored(t, js, "ORDERS", first.Answer.Seq)
			if m.Subject != "orders."+tt.lang || m.Header.Get(nats.MsgIdHdr) != tt.lang+"-7" ||
				m.Header.Get("X-Client") != tt.lang || m.Header.Get("Content-Type") != "application/json" {
				t.Errorf("stored on %s with headers %v", m.Subject, m.Header)
			}
			var body struct {
				Order int    `json:"order"`
				From  string `json:"from"`
			}
			if err := json.Unmarshal(m.Data, &body); err != nil || body.Order != 7 || body.From != tt.lang {
				t.Errorf("stored body %q (%v)", m.Data, err)
			}
		})
	}
}

// clientAnswer is a line of the clients' output.
type clientAnswer struct {
	Name       string  `json:"name"`
	Status     int     `json:"status"`
	RetryAfter *string `json:"retry_after"`
	Answer     struct {
		Stream    string `json:"stream"`
		Seq       uint64 `json:"seq"`
		Duplicate bool   `json:"duplicate"`
		Error     string `json:"error"`
		Entries   []struct {
			EntryID   string `json:"entryId"`
			Status    int    `json:"status"`
			Seq       uint64 `json:"seq"`
			Duplicate bool   `json:"duplicate"`
		} `json:"entries"`
	} `json:"answer"`
}
