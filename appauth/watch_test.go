package appauth

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/courierhq/courier/internal/poll"
)

const fast = 5 * time.Millisecond

// verifiedBy stamps a request and returns which of secrets its signature
// verifies with (the Standard Webhooks Go library deciding), in order.
func verifiedBy(t *testing.T, a *Auth, secrets ...string) []string {
	t.Helper()
	h := http.Header{"Idempotency-Key": {"k1"}}
	body := []byte("body")
	a.Stamp(h, body)
	var ok []string
	for _, s := range secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			t.Fatal(err)
		}
		if wh.Verify(body, h) == nil {
			ok = append(ok, s)
		}
	}
	return ok
}

// TestRotationWithoutRestart: a secret added to the file is used from the
// next read on, beside the old one; the old one removed is no longer used;
// the token file likewise. Stamps run meanwhile from several goroutines.
func TestRotationWithoutRestart(t *testing.T) {
	dir := t.TempDir()
	secrets, token := filepath.Join(dir, "secrets"), filepath.Join(dir, "token")
	oldS, newS := newSecret(t), newSecret(t)
	writeFile(t, secrets, oldS+"\n")
	writeFile(t, token, "old-token\n")
	log, logs := jsonLogger()
	a, err := Open(Options{SecretsFile: secrets, TokenFile: token, Interval: fast, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					h := http.Header{}
					a.Stamp(h, []byte("x"))
					_ = a.Token()
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()

	if got := verifiedBy(t, a, oldS, newS); !slices.Equal(got, []string{oldS}) {
		t.Fatalf("at start verified by %d secrets, want the old one only", len(got))
	}
	writeFile(t, secrets, newS+"\n"+oldS+"\n")
	poll.Until(t, 5*time.Second, "both secrets in use", func() bool { return len(verifiedBy(t, a, oldS, newS)) == 2 })
	writeFile(t, secrets, newS+"\n")
	poll.Until(t, 5*time.Second, "the old secret dropped", func() bool {
		return slices.Equal(verifiedBy(t, a, oldS, newS), []string{newS})
	})
	writeFile(t, token, "new-token")
	poll.Until(t, 5*time.Second, "the new token", func() bool { return a.Token() == "new-token" })

	if n := count(logs.String(), "COURIER_SIGNING_SECRETS_FILE changed"); n != 2 {
		t.Errorf("%d lines say the secrets changed, want 2 (one per change):\n%s", n, logs)
	}
	leaks(t, "the logs", logs.String(), oldS, newS)
	if strings.Contains(logs.String(), "-token") {
		t.Errorf("the logs hold the token:\n%s", logs)
	}
}

// TestUnreadableKeepsLastGood: a file that disappears (a Secret deleted,
// a mount gone) or is replaced by one that cannot be used keeps the last
// good value, said once however many polls find it so; once usable again
// it is read again and that is said once too.
func TestUnreadableKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "secrets")
	good, next := newSecret(t), newSecret(t)
	writeFile(t, path, good+"\n")
	log, logs := jsonLogger()
	a, err := Open(Options{SecretsFile: path, Interval: fast, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const warned = "COURIER_SIGNING_SECRETS_FILE cannot be used; keeping the last good secrets"

	// Gone.
	if err := os.Rename(path, path+".away"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the warning", func() bool { return count(logs.String(), warned) == 1 })
	waitPolls(t, a)
	if n := count(logs.String(), warned); n != 1 {
		t.Errorf("%d warnings for one missing file, want 1", n)
	}
	if got := verifiedBy(t, a, good); len(got) != 1 {
		t.Error("the last good secret is no longer used while the file is missing")
	}

	// Back, unchanged.
	if err := os.Rename(path+".away", path); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the file usable again", func() bool {
		return count(logs.String(), "COURIER_SIGNING_SECRETS_FILE usable again") == 1
	})

	// Invalid, then another invalid content: one episode, one warning.
	writeFile(t, path, "whsec_???\n")
	poll.Until(t, 5*time.Second, "the second warning", func() bool { return count(logs.String(), warned) == 2 })
	writeFile(t, path, "not a secret\n")
	waitPolls(t, a)
	if n := count(logs.String(), warned); n != 2 {
		t.Errorf("%d warnings after two failure episodes, want 2:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "line 1: not a Standard Webhooks secret") && !strings.Contains(logs.String(), "line 1: the part after whsec_ is not base64") {
		t.Errorf("the warning does not say what is wrong:\n%s", logs)
	}
	if got := verifiedBy(t, a, good); len(got) != 1 {
		t.Error("the last good secret is no longer used while the file is invalid")
	}

	// Fixed with a new secret.
	writeFile(t, path, next+"\n")
	poll.Until(t, 5*time.Second, "the new secret", func() bool {
		return slices.Equal(verifiedBy(t, a, good, next), []string{next})
	})
	leaks(t, "the logs", logs.String(), good, next)
}

// waitPolls lets the watcher read the files several more times.
func waitPolls(t *testing.T, a *Auth) {
	t.Helper()
	time.Sleep(20 * fast) // real time is what is tested: that polls add no line
}

// TestOpenRefusesBadFiles: at start, a missing file, a bad secret line and
// an empty token are errors naming the variable, the path and the problem,
// never the content; both files' problems come together.
func TestOpenRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	good := newSecret(t)
	bad := filepath.Join(dir, "bad")
	writeFile(t, bad, good+"\nwhsec_"+strings.Repeat("A", 7)+"\n")
	empty := filepath.Join(dir, "empty")
	writeFile(t, empty, "\n")
	missing := filepath.Join(dir, "missing")

	_, err := Open(Options{SecretsFile: bad, TokenFile: empty})
	if err == nil {
		t.Fatal("Open accepted a bad secrets file and an empty token file")
	}
	for _, want := range []string{
		"COURIER_SIGNING_SECRETS_FILE=" + bad + ": line 2: the part after whsec_ is not base64",
		"COURIER_APP_TOKEN_FILE=" + empty + ": the file is empty",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	leaks(t, "the error", err.Error(), good)

	_, err = Open(Options{SecretsFile: missing})
	if err == nil || !strings.Contains(err.Error(), "COURIER_SIGNING_SECRETS_FILE="+missing+": cannot read the file: no such file or directory") {
		t.Errorf("missing file: %v", err)
	}
	_, err = Open(Options{TokenFile: dir})
	if err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("a directory: %v", err)
	}
}

// TestCloseStopsWatching: after Close the file is no longer read (a change
// is not picked up) and the last values stay; Close twice is fine.
func TestCloseStopsWatching(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	writeFile(t, path, "first")
	a, err := Open(Options{TokenFile: path, Interval: fast})
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	a.Close()
	writeFile(t, path, "second")
	waitPolls(t, a)
	if got := a.Token(); got != "first" {
		t.Errorf("Token after Close = %q, want the last value read, first", got)
	}
}
