package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/internal/testlog"
)

// The app snippets of the README and docs/ (Python, Node, curl) run here
// against a real courier, taken from the Markdown as the reader sees it: a
// fenced block under a line `<!-- snippet: NAME -->`. The apps read their
// port from PORT (8080 in the docs) and the curl commands name 127.0.0.1:7416,
// which the test replaces with the publish API's address; nothing else of a
// snippet is changed.

// docFiles are the Markdown files whose snippets are checked: the README and
// every page of docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{"../../README.md"}, files...)
	if len(files) < 5 {
		t.Fatalf("only %d Markdown files found: is ../.. the repo?", len(files))
	}
	return files
}

// snippet is one marked fenced block: app code (<!-- snippet: NAME -->) or
// what a reader is told they will see (<!-- output: NAME -->).
type snippet struct {
	name, lang, code string
	output           bool
	where            string // file:line of the fence
}

var snippetMark = regexp.MustCompile(`^<!-- (snippet|output): ([a-z0-9-]+) -->$`)

// appLangs are the fence languages of app code: each such block must be a
// marked snippet. A shell block is app code when it runs curl.
var appLangs = []string{"python", "py", "js", "javascript", "node", "mjs"}

// readSnippets returns the marked snippets of the docs by name, and where an
// app snippet is not marked.
func readSnippets(t *testing.T) (map[string]snippet, []string) {
	t.Helper()
	marked := map[string]snippet{}
	var unmarked []string
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(f, "../../")
		lines := strings.Split(string(b), "\n")
		for i := 0; i < len(lines); i++ {
			lang, ok := strings.CutPrefix(lines[i], "```")
			if !ok {
				continue
			}
			start := i
			var code []string
			for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
				code = append(code, lines[i])
			}
			s := snippet{lang: strings.TrimSpace(lang), code: strings.Join(code, "\n") + "\n", where: fmt.Sprintf("%s:%d", rel, start+1)}
			if start > 0 {
				if m := snippetMark.FindStringSubmatch(strings.TrimSpace(lines[start-1])); m != nil {
					s.name, s.output = m[2], m[1] == "output"
				}
			}
			isApp := slices.Contains(appLangs, s.lang) ||
				(s.lang == "sh" || s.lang == "bash" || s.lang == "shell") && regexp.MustCompile(`(?m)^\s*curl `).MatchString(s.code)
			switch {
			case s.name != "":
				if prev, dup := marked[s.name]; dup {
					t.Errorf("%s: snippet %q is also at %s", s.where, s.name, prev.where)
				}
				marked[s.name] = s
			case isApp:
				unmarked = append(unmarked, s.where)
			}
		}
	}
	return marked, unmarked
}

// TestSnippets runs every app snippet of the README and docs/ against a real
// courier and checks that it does what the text around it says.
func TestSnippets(t *testing.T) {
	snippets, unmarked := readSnippets(t)
	for _, w := range unmarked {
		t.Errorf("%s: app code that no test runs: mark it <!-- snippet: NAME --> and run it in TestSnippets", w)
	}
	scenarios := []struct {
		names []string
		run   func(t *testing.T, s snippet)
	}{
		{[]string{"quickstart-python", "quickstart-node"}, func(t *testing.T, s snippet) {
			runQuickstart(t, s, snippets["quickstart-app"], snippets["quickstart-dlq-ls"])
		}},
		{[]string{"quickstart-app", "quickstart-dlq-ls"}, nil}, // compared by runQuickstart
		{[]string{"verify-python", "verify-node"}, runVerify},
		{[]string{"batch-app"}, runBatchApp},
		{[]string{"publish-curl", "publish-batch-curl"}, nil}, // run together by runPublishCurl
		{[]string{"delayed-python", "delayed-node"}, func(t *testing.T, s snippet) { runDelayedClient(t, s, snippets["delayed-output"]) }},
		{[]string{"delayed-output"}, nil},              // compared by runDelayedClient
		{[]string{"delayed-curl", "cancel-curl"}, nil}, // run together by runDelayedCurl
	}
	used := map[string]bool{}
	for _, sc := range scenarios {
		for _, name := range sc.names {
			used[name] = true
			s, ok := snippets[name]
			if !ok {
				t.Errorf("snippet %q is in no doc", name)
				continue
			}
			if sc.run != nil {
				t.Run(name, func(t *testing.T) { sc.run(t, s) })
			}
		}
	}
	if a, b := snippets["publish-curl"], snippets["publish-batch-curl"]; a.name != "" && b.name != "" {
		t.Run("publish-curl", func(t *testing.T) { runPublishCurl(t, a, b) })
	}
	if a, b := snippets["delayed-curl"], snippets["cancel-curl"]; a.name != "" && b.name != "" {
		t.Run("delayed-curl", func(t *testing.T) { runDelayedCurl(t, a, b) })
	}
	for name, s := range snippets {
		if !used[name] {
			t.Errorf("%s: snippet %q is run by no scenario of TestSnippets", s.where, name)
		}
	}
}

// runningApp is an app snippet run as a process: its output, line by line.
type runningApp struct {
	url    string
	mu     sync.Mutex
	stdout []string
	stderr bytes.Buffer
}

// lines returns what the app has printed so far.
func (a *runningApp) lines() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.stdout)
}

// startSnippetApp writes an app snippet to a file, runs it with its
// language's interpreter on a free port (PORT), and waits until it accepts
// connections. It skips the test where the interpreter is not installed.
func startSnippetApp(t *testing.T, s snippet, env ...string) *runningApp {
	t.Helper()
	bin, file := "python3", "app.py"
	if s.lang != "python" {
		bin, file = "node", "app.js"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		t.Skipf("%s is not installed: %s is not run", bin, s.where)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(s.code), 0o600); err != nil {
		t.Fatal(err)
	}
	// The snippets listen on 127.0.0.1, as an app beside courier does.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host, port := "127.0.0.1", ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, path, file)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"PORT=" + strconv.Itoa(port)}, env...)...)
	a := &runningApp{url: fmt.Sprintf("http://%s:%d/messages", host, port)}
	cmd.Stderr = &syncWriter{mu: &a.mu, w: &a.stderr}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("%s %s: %v", bin, file, err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			a.mu.Lock()
			a.stdout = append(a.stdout, sc.Text())
			a.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-read
		_ = cmd.Wait()
		if t.Failed() {
			a.mu.Lock()
			t.Logf("%s printed:\n%s\n%s", s.where, strings.Join(a.stdout, "\n"), a.stderr.String())
			a.mu.Unlock()
		}
	})
	poll.Until(t, 20*time.Second, s.where+" listening", func() bool {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return a
}

// syncWriter guards a writer with the app's mutex.
type syncWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// printed waits until the app has printed a line holding each of want.
func (a *runningApp) printed(t *testing.T, want ...string) {
	t.Helper()
	poll.Until(t, 30*time.Second, fmt.Sprintf("the app printing %q", want), func() bool {
		lines := a.lines()
		for _, w := range want {
			if !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, w) }) {
				return false
			}
		}
		return true
	})
}

// runQuickstart: the README's five-minute start. The app prints the JSON
// message and courier acks it; the one that is not JSON is answered 422 and
// dead-lettered as rejected, which `courier dlq ls` lists.
// What it prints, and what `courier dlq ls` prints, are what the README
// shows, times and the stream's creation time aside.
func runQuickstart(t *testing.T, s, shownApp, shownLs snippet) {
	a := startSnippetApp(t, s)
	h := newHarness(t)
	env := h.env(a.url)
	start(t, env)
	h.publish("orders.42.created", `{"order":42}`, nil)
	h.publish("orders.43.created", "not json", nil)
	a.printed(t, `orders.42.created ORDERS:`, `{"order":42}`, "orders.43.created ORDERS:", "not json")
	poll.Until(t, 20*time.Second, "one dead letter", func() bool { return len(h.deadLetters("dlq.ORDERS.courier")) == 1 })
	poll.Until(t, 20*time.Second, "the consumer settled", func() bool { return h.settled("courier") })
	l := h.deadLetters("dlq.ORDERS.courier")[0]
	if r, subj, st := l.Header.Get(dlq.HeaderReason), l.Header.Get(dlq.HeaderSubject), l.Header.Get(dlq.HeaderStatus); r != "rejected" || subj != "orders.43.created" || st != "422" {
		t.Errorf("dead letter: reason %q, subject %q, status %q; want rejected, orders.43.created, 422", r, subj, st)
	}
	var out testlog.Buffer
	if err := run(context.Background(), []string{"dlq", "ls"}, env, &out, io.Discard); err != nil {
		t.Fatalf("courier dlq ls: %v", err)
	}
	if got := out.String(); !strings.Contains(got, "rejected") || !strings.Contains(got, "orders.43.created") || !strings.Contains(got, "422") {
		t.Errorf("courier dlq ls printed %q, want the rejected orders.43.created", got)
	}
	printed := a.lines()
	if s.lang == "python" {
		// The request lines http.server logs, on stderr.
		a.mu.Lock()
		printed = append(printed, strings.Split(strings.TrimSpace(a.stderr.String()), "\n")...)
		a.mu.Unlock()
	}
	shown := strings.Split(strings.TrimSpace(shownApp.code), "\n")
	if s.lang != "python" {
		shown = slices.DeleteFunc(shown, func(l string) bool { return strings.Contains(l, `"POST /messages`) })
	}
	if got, want := shownLines(printed), shownLines(shown); !slices.Equal(got, want) {
		t.Errorf("the app printed\n%s\n%s shows\n%s", strings.Join(printed, "\n"), shownApp.where, strings.Join(shown, "\n"))
	}
	if got, want := shownLines(strings.Split(strings.TrimSpace(out.String()), "\n")), shownLines(strings.Split(strings.TrimSpace(shownLs.code), "\n")); !slices.Equal(got, want) {
		t.Errorf("courier dlq ls printed\n%s\n%s shows\n%s", out.String(), shownLs.where, shownLs.code)
	}
}

// shownLines makes printed lines comparable with those a doc shows: times
// and the stream's creation time (in keys) made placeholders, runs of spaces
// one, in sorted order (concurrent deliveries print in any order).
func shownLines(lines []string) []string {
	var out []string
	for _, l := range lines {
		l = regexp.MustCompile(`:\d{10,}:`).ReplaceAllString(l, ":CREATED:")
		l = regexp.MustCompile(`\[\d\d/\w+/\d{4} [\d:]+\]`).ReplaceAllString(l, "[DATE]")
		l = regexp.MustCompile(`\d{4}-\d\d-\d\dT[\d:.]+Z`).ReplaceAllString(l, "TIME")
		l = strings.Join(strings.Fields(l), " ")
		if l != "" {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// runVerify: the signature snippets accept what courier signs, whatever the
// body (JSON, text, bytes that are not UTF-8, none), and refuse a request
// signed with another secret or not signed at all.
func runVerify(t *testing.T, s snippet) {
	secret := "whsec_" + base64.StdEncoding.EncodeToString(randomBytes(t, 32))
	var env []string
	if s.lang != "python" {
		env = append(env, "NODE_PATH="+installNodeSnippetDeps(t))
	}
	a := startSnippetApp(t, s, append(env, "WEBHOOK_SECRET="+secret)...)
	h := newHarness(t)
	secrets := filepath.Join(t.TempDir(), "secrets")
	other := "whsec_" + base64.StdEncoding.EncodeToString(randomBytes(t, 32))
	// Two secrets, as during a rotation: the app knows one.
	if err := os.WriteFile(secrets, []byte(other+"\n"+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, h.env(a.url, "COURIER_SIGNING_SECRETS_FILE="+secrets))
	bodies := map[string]string{"json": `{"order":42}`, "text": "plain text, ünïcode", "binary": "\xff\xfe\x00\x80", "empty": ""}
	for name, body := range bodies {
		h.publish("orders."+name, body, map[string]string{"Nats-Msg-Id": "verify-" + name})
	}
	var want []string
	for name, body := range bodies {
		want = append(want, fmt.Sprintf("verified verify-%s %d bytes", name, len(body)))
	}
	a.printed(t, want...)
	poll.Until(t, 20*time.Second, "the consumer settled", func() bool { return h.settled("courier") })
	if n := len(h.deadLetters("dlq.ORDERS.courier")); n != 0 {
		t.Errorf("%d messages dead-lettered: the app refused what courier signed", n)
	}

	// Not signed by courier: refused.
	unsigned := http.Header{"Webhook-Id": {"msg_x"}, "Webhook-Timestamp": {strconv.FormatInt(time.Now().Unix(), 10)}}
	forged := unsigned.Clone()
	forged.Set("Webhook-Signature", "v1,"+base64.StdEncoding.EncodeToString(randomBytes(t, 32)))
	for what, hdr := range map[string]http.Header{"unsigned": unsigned, "wrongly signed": forged, "no headers": {}} {
		req, _ := http.NewRequest(http.MethodPost, a.url, strings.NewReader(`{"order":1}`))
		for k, v := range hdr {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s request: %v", what, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s request answered %d, want 401", what, resp.StatusCode)
		}
	}
}

// installNodeSnippetDeps installs what the Node snippets require (npm ci in
// testdata/snippets, from its committed lock file) and returns the
// node_modules directory for NODE_PATH. It skips where npm is not installed.
func installNodeSnippetDeps(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("testdata/snippets")
	if err != nil {
		t.Fatal(err)
	}
	modules := filepath.Join(dir, "node_modules")
	if _, err := os.Stat(filepath.Join(modules, "standardwebhooks", "package.json")); err == nil {
		return modules
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("npm is not installed: the Node snippet's standardwebhooks cannot be installed")
	}
	cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	return modules
}

// runBatchApp: the batch snippet reads a JSON message published with a JSON
// content type (in "data") and one published without (in "dataBase64") alike,
// and its DROP dead-letters the message that is not JSON.
func runBatchApp(t *testing.T, s snippet) {
	a := startSnippetApp(t, s)
	h := newHarness(t)
	start(t, h.env(a.url, "COURIER_BATCH_MAX=8", "COURIER_BATCH_WAIT=200ms"))
	h.publish("orders.1", `{"order": 1}`, map[string]string{"Content-Type": "application/json", "Nats-Msg-Id": "as-json"})
	h.publish("orders.2", `{"order": 2}`, map[string]string{"Nats-Msg-Id": "no-content-type"})
	h.publish("orders.3", "not json", map[string]string{"Nats-Msg-Id": "not-json"})
	a.printed(t, "as-json {'order': 1}", "no-content-type {'order': 2}")
	poll.Until(t, 20*time.Second, "one dead letter", func() bool { return len(h.deadLetters("dlq.ORDERS.courier")) == 1 })
	poll.Until(t, 20*time.Second, "the consumer settled", func() bool { return h.settled("courier") })
	if l := h.deadLetters("dlq.ORDERS.courier")[0]; l.Header.Get(dlq.HeaderReason) != "rejected" || string(l.Data) != "not json" {
		t.Errorf("dead letter: reason %q, body %q; want rejected, not json", l.Header.Get(dlq.HeaderReason), l.Data)
	}
}

// runPublishCurl runs the publishing page's curl commands against courier's
// publish API and compares each answer with the one the page shows after
// "# →", sequence numbers aside.
func runPublishCurl(t *testing.T, snippets ...snippet) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("sh is not installed")
	}
	h := newHarness(t)
	app := newApp(t, nil)
	c := start(t, h.env(app.URL, "COURIER_PUBLISH_ADDR=127.0.0.1:0", "COURIER_PUBLISH_SUBJECTS=orders.>"))
	addr := publishAddr(t, c)
	for _, s := range snippets {
		cmdText, want := splitAnswer(t, s)
		cmdText = strings.ReplaceAll(cmdText, "127.0.0.1:7416", addr)
		out, err := exec.Command(sh, "-c", cmdText).Output()
		if err != nil {
			t.Fatalf("%s: %v", s.where, err)
		}
		var got, exp any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s answered %q: %v", s.where, out, err)
		}
		if err := json.Unmarshal([]byte(want), &exp); err != nil {
			t.Fatalf("%s: the answer it shows, %q: %v", s.where, want, err)
		}
		if !reflect.DeepEqual(withoutSeq(got), withoutSeq(exp)) {
			t.Errorf("%s answered\n%s\nthe page shows\n%s", s.where, out, want)
		}
	}
	poll.Until(t, 20*time.Second, "the published messages delivered", func() bool { return app.count() == 3 })
}

// splitAnswer parses a snippet of one command followed by its answer, shown
// as comment lines after "# →".
func splitAnswer(t *testing.T, s snippet) (cmd, answer string) {
	t.Helper()
	i := strings.Index(s.code, "# →")
	if i < 0 {
		t.Fatalf("%s: no answer shown (# →)", s.where)
	}
	var b strings.Builder
	for _, l := range strings.Split(s.code[i:], "\n") {
		l = strings.TrimPrefix(strings.TrimPrefix(l, "# →"), "#")
		b.WriteString(strings.TrimSpace(l))
	}
	return s.code[:i], b.String()
}

// withoutSeq drops every "seq" of a decoded JSON answer: a stream's
// sequence depends on what was stored before.
func withoutSeq(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, x := range v {
			if k != "seq" {
				out[k] = withoutSeq(x)
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = withoutSeq(x)
		}
		return out
	}
	return v
}

// randomBytes returns n random bytes.
func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
