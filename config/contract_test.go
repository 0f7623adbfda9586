package config

import (
	"strings"
	"testing"
	"time"
)

// TestNewVariablesBadValues: each bad value of the variables of behaviours
// 14 to 18 yields exactly one problem naming it.
func TestNewVariablesBadValues(t *testing.T) {
	tests := []struct {
		name    string
		environ map[string]string
		want    string // a prefix
	}{
		{"breaker failures negative", with(map[string]string{"COURIER_BREAKER_FAILURES": "-1"}), `COURIER_BREAKER_FAILURES="-1": must not be negative`},
		{"breaker failures word", with(map[string]string{"COURIER_BREAKER_FAILURES": "ten"}), `COURIER_BREAKER_FAILURES="ten": not an integer`},
		{"breaker probe zero", with(map[string]string{"COURIER_BREAKER_PROBE": "0s"}), `COURIER_BREAKER_PROBE="0s": must be more than 0`},
		{"breaker probe max zero", with(map[string]string{"COURIER_BREAKER_PROBE_MAX": "0s"}), `COURIER_BREAKER_PROBE_MAX="0s": must be more than 0`},
		{"breaker probe unit", with(map[string]string{"COURIER_BREAKER_PROBE": "5"}), `COURIER_BREAKER_PROBE="5": missing a unit`},
		{"max rate negative", with(map[string]string{"COURIER_MAX_RATE": "-1"}), `COURIER_MAX_RATE="-1": must not be negative`},
		{"max rate word", with(map[string]string{"COURIER_MAX_RATE": "fast"}), `COURIER_MAX_RATE="fast": not a number`},
		{"order key of nothing", with(map[string]string{"COURIER_ORDER_KEY": "subject:0"}), `COURIER_ORDER_KEY="subject:0": subject:0: the token's position must be a whole number from 1`},
		{"order key of a body", with(map[string]string{"COURIER_ORDER_KEY": "body:id"}), `COURIER_ORDER_KEY="body:id": "body": the key is "subject:N" or "header:NAME"`},
		{"batch of none", with(map[string]string{"COURIER_BATCH_MAX": "0"}), `COURIER_BATCH_MAX="0": must be from 1 (one message per request) to 1000`},
		{"batch too large", with(map[string]string{"COURIER_BATCH_MAX": "5000"}), `COURIER_BATCH_MAX="5000": must be from 1`},
		{"batch wait negative", with(map[string]string{"COURIER_BATCH_WAIT": "-1ms"}), `COURIER_BATCH_WAIT="-1ms": must be from 1µs to 1m`},
		{"batch wait zero", with(map[string]string{"COURIER_BATCH_WAIT": "0"}), `COURIER_BATCH_WAIT="0": must be from 1µs to 1m: a batch waits that long after its first entry for more (0 would send every entry in a request of its own)`},
		{"batch wait under 1µs", with(map[string]string{"COURIER_BATCH_WAIT": "999ns"}), `COURIER_BATCH_WAIT="999ns": must be from 1µs to 1m`},
		{"batch wait over 1m", with(map[string]string{"COURIER_BATCH_WAIT": "61s"}), `COURIER_BATCH_WAIT="61s": must be from 1µs to 1m`},
		{"batch bytes tiny", with(map[string]string{"COURIER_BATCH_BYTES": "10"}), `COURIER_BATCH_BYTES="10": must be at least 1024`},
		{"success wildcard", with(map[string]string{"COURIER_SUCCESS_SUBJECT": "done.*"}), `COURIER_SUCCESS_SUBJECT="done.*": must be a literal subject`},
		{"success invalid", with(map[string]string{"COURIER_SUCCESS_SUBJECT": "done..x"}), `COURIER_SUCCESS_SUBJECT="done..x": is not a valid subject`},
		{"success reserved", with(map[string]string{"COURIER_SUCCESS_SUBJECT": "$KV.x.y"}), `COURIER_SUCCESS_SUBJECT="$KV.x.y": subjects starting with $KV. are reserved`},
		{"success consumed", with(map[string]string{"COURIER_SUBJECTS": "orders.>", "COURIER_SUCCESS_SUBJECT": "orders.done"}),
			`COURIER_SUCCESS_SUBJECT="orders.done": matched by the filter subject "orders.>" of COURIER_SUBJECTS, so courier would consume its own success records`},
		{"success is the dlq", with(map[string]string{"COURIER_SUCCESS_SUBJECT": "dlq.ORDERS.courier"}), `COURIER_SUCCESS_SUBJECT="dlq.ORDERS.courier": is also COURIER_DLQ_SUBJECT`},
		{"reply invalid", with(map[string]string{"COURIER_REPLY_SUBJECTS": "a..b"}), `COURIER_REPLY_SUBJECTS="a..b": "a..b" is not a valid subject`},
		{"reply reserved", with(map[string]string{"COURIER_REPLY_SUBJECTS": "$JS.API.>"}), `COURIER_REPLY_SUBJECTS="$JS.API.>": "$JS.API.>": subjects starting with $JS. are reserved`},
		{"replies overlap", with(map[string]string{"COURIER_REPLY_SUBJECTS": "quote.*,quote.get"}), `COURIER_REPLY_SUBJECTS="quote.*,quote.get": "quote.*" and "quote.get" overlap`},
		{"reply consumed", with(map[string]string{"COURIER_SUBJECTS": "orders.>", "COURIER_REPLY_SUBJECTS": "orders.get"}), `COURIER_REPLY_SUBJECTS="orders.>": "orders.get" overlaps`},
		{"reply answers dead letters", with(map[string]string{"COURIER_REPLY_SUBJECTS": "dlq.>"}), `COURIER_REPLY_SUBJECTS="dlq.>": "dlq.>" matches COURIER_DLQ_SUBJECT`},
		{"reply url", with(map[string]string{"COURIER_REPLY_SUBJECTS": "q", "COURIER_REPLY_URL": "ftp://x/"}), `COURIER_REPLY_URL="ftp://x/": expected an absolute http, https or unix URL`},
		{"reply without any url", with(map[string]string{"COURIER_STREAM": "<unset>", "COURIER_APP_URL": "<unset>", "COURIER_REPLY_SUBJECTS": "q"}), `COURIER_REPLY_URL (or COURIER_APP_URL) is required with COURIER_REPLY_SUBJECTS`},
		{"stream needs the app", with(map[string]string{"COURIER_APP_URL": "<unset>", "COURIER_REPLY_SUBJECTS": "q", "COURIER_REPLY_URL": "http://h/"}), `COURIER_APP_URL is required`},
		{"success without stream", with(map[string]string{"COURIER_STREAM": "<unset>", "COURIER_REPLY_SUBJECTS": "q", "COURIER_SUCCESS_SUBJECT": "done"}), `COURIER_SUCCESS_SUBJECT="done": is set but COURIER_STREAM is not`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problems(t, tt.environ)
			if tt.name == "reply consumed" {
				tt.want = `COURIER_REPLY_SUBJECTS="orders.get": "orders.get" overlaps the filter subject "orders.>"`
			}
			if len(got) != 1 || !strings.HasPrefix(got[0], tt.want) {
				t.Errorf("problems:\n%s\nwant one starting\n %s", strings.Join(got, "\n"), tt.want)
			}
		})
	}
}

// TestReplyOnly: COURIER_REPLY_SUBJECTS alone is a courier that serves
// requests and consumes nothing; COURIER_REPLY_URL defaults to the app's.
func TestReplyOnly(t *testing.T) {
	cfg := mustLoad(t, map[string]string{
		"COURIER_REPLY_SUBJECTS": "quote.get",
		"COURIER_APP_URL":        "http://u:pw@127.0.0.1:8080/q",
	})
	if cfg.ConsumesStream() || !cfg.ServesReplies() {
		t.Errorf("ConsumesStream %v, ServesReplies %v; want false, true", cfg.ConsumesStream(), cfg.ServesReplies())
	}
	if cfg.ReplyURL != "http://u:pw@127.0.0.1:8080/q" || cfg.DLQSubject != "" {
		t.Errorf("ReplyURL %q, DLQSubject %q", cfg.ReplyURL, cfg.DLQSubject)
	}
	vars, _, err := Inspect(map[string]string{"COURIER_REPLY_SUBJECTS": "quote.get", "COURIER_REPLY_URL": "http://h:1/q"})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vars {
		if v.Name == "COURIER_REPLY_URL" && v.Value != "http://h:1/q" {
			t.Errorf("COURIER_REPLY_URL shown as %q", v.Value)
		}
	}

	// Neither a stream nor reply subjects: both requirements are named.
	got := problems(t, map[string]string{})
	if len(got) != 2 || !strings.Contains(got[0], "COURIER_STREAM is required") || !strings.Contains(got[0], "COURIER_REPLY_SUBJECTS") ||
		!strings.HasPrefix(got[1], "COURIER_APP_URL is required") {
		t.Errorf("problems:\n%s", strings.Join(got, "\n"))
	}
	// Served beside a stream, the reply URL defaults to the app's.
	if got := mustLoad(t, with(map[string]string{"COURIER_REPLY_SUBJECTS": "q"})).ReplyURL; got != minimal()["COURIER_APP_URL"] {
		t.Errorf("ReplyURL = %q", got)
	}
}

// TestDedupStoreNames: shared is the new name; kv is still read, as shared,
// with a warning.
func TestDedupStoreNames(t *testing.T) {
	for _, tt := range []struct{ given, want string }{{"", DedupBadger}, {"Badger", DedupBadger}, {"shared", DedupShared}, {"KV", DedupShared}} {
		environ := with(map[string]string{"COURIER_DEDUP_STORE": tt.given})
		cfg := mustLoad(t, environ)
		if cfg.DedupStore != tt.want {
			t.Errorf("COURIER_DEDUP_STORE=%q: DedupStore %q, want %q", tt.given, cfg.DedupStore, tt.want)
		}
		warned := false
		for _, w := range Warnings(cfg, environ) {
			warned = warned || (w.Variable == "COURIER_DEDUP_STORE" && strings.Contains(w.Text, "set COURIER_DEDUP_STORE=shared"))
		}
		if warned != strings.EqualFold(tt.given, "kv") {
			t.Errorf("COURIER_DEDUP_STORE=%q: warned %v", tt.given, warned)
		}
	}
}

// TestInspectShowsInvalidValuesAsGiven: `courier config` shows what was set,
// not the zero Load left in its place (#16).
func TestInspectShowsInvalidValuesAsGiven(t *testing.T) {
	vars, _, err := Inspect(with(map[string]string{
		"COURIER_ACK_WAIT":    "banana",
		"COURIER_MAX_DELIVER": "0",
		"NATS_URL":            "ftp://u:hunter2@h",
	}))
	if err == nil {
		t.Fatal("no error")
	}
	want := map[string]string{"COURIER_ACK_WAIT": "banana", "COURIER_MAX_DELIVER": "0", "NATS_URL": "ftp://u:[redacted]@h"}
	for _, v := range vars {
		w, bad := want[v.Name]
		switch {
		case bad && (v.Value != w || len(v.Problems) != 1):
			t.Errorf("%s: Value %q, problems %q; want %q and one problem", v.Name, v.Value, v.Problems, w)
		case !bad && len(v.Problems) > 0:
			t.Errorf("%s: problems %q", v.Name, v.Problems)
		}
	}
	var out strings.Builder
	if err := WriteTable(&out, vars); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "banana (invalid)") || strings.Contains(out.String(), "hunter2") {
		t.Errorf("table:\n%s", out.String())
	}
}

func TestWarnings(t *testing.T) {
	tests := []struct {
		name    string
		environ map[string]string
		want    []string // one per warning, each a substring
	}{
		{"none", minimal(), nil},
		{"misspelt", with(map[string]string{"COURIER_MAX_INFLIGT": "4"}), []string{"COURIER_MAX_INFLIGT is not a courier variable and is ignored: did you mean COURIER_MAX_INFLIGHT?"}},
		{"missing word", with(map[string]string{"COURIER_INFLIGHT": "4"}), []string{"did you mean COURIER_MAX_INFLIGHT?"}},
		{"nothing close", with(map[string]string{"COURIER_COLOUR": "blue"}), []string{"COURIER_COLOUR is not a courier variable and is ignored (`courier config` lists them)"}},
		{"max deliver 1", with(map[string]string{"COURIER_MAX_DELIVER": "1"}), []string{"COURIER_MAX_DELIVER=1 allows no retry"}},
		{"max deliver 2", with(map[string]string{"COURIER_MAX_DELIVER": "2"}), []string{"COURIER_MAX_DELIVER=2 allows one retry"}},
		{"batches beyond ack pending", with(map[string]string{"COURIER_BATCH_MAX": "200", "COURIER_MAX_INFLIGHT": "8"}),
			[]string{"= 1600 messages may be in batches at once, more than COURIER_MAX_ACK_PENDING=1000"}},
		{"max deliver 3", with(map[string]string{"COURIER_MAX_DELIVER": "3"}), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := Warnings(mustLoad(t, tt.environ), tt.environ)
			if len(ws) != len(tt.want) {
				t.Fatalf("warnings %q, want %d", ws, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(ws[i].Text, w) {
					t.Errorf("warning %q, want %q in it", ws[i].Text, w)
				}
			}
		})
	}
}

// TestCommaInNATSPassword (#17.10): an unencoded ',' in a password is
// hidden everywhere, and named as the problem it is.
func TestCommaInNATSPassword(t *testing.T) {
	const secret = "pa,ss"
	environ := with(map[string]string{"NATS_URL": "nats://u:" + secret + "@host:4222"})
	got := problems(t, environ)
	text := strings.Join(got, "\n")
	if len(got) != 1 || !strings.Contains(got[0], "percent-encode it as %2C") {
		t.Errorf("problems:\n%s", text)
	}
	vars, _, _ := Inspect(environ)
	var out strings.Builder
	if err := WriteTable(&out, vars); err != nil {
		t.Fatal(err)
	}
	for _, shown := range []string{text, out.String()} {
		for _, piece := range []string{"pa", "ss@"} {
			if strings.Contains(shown, "u:"+piece) || strings.Contains(shown, piece+"host") || strings.Contains(shown, "\""+piece) {
				t.Errorf("a piece of the password shows:\n%s", shown)
			}
		}
	}
	for _, tt := range []struct{ in, want string }{
		{"nats://u:pa,ss@host:4222", "nats://u:[redacted]@host:4222"},
		{"nats://u:pa,ss@h1:4222,nats://v:w@h2", "nats://u:[redacted]@h1:4222,nats://v:[redacted]@h2"},
		{"nats://a@x,u:p,q@y", "nats://[redacted]@x,u:[redacted]@y"},
		{"nats://t,ok@h", "nats://[redacted]@h"},
		{" u:p@h:4222", " u:[redacted]@h:4222"},
		// Cannot be told from a URL followed by one without a scheme:
		// more is hidden, never less.
		{"nats://h1:4222,u:p@h2", "nats://h1:[redacted]@h2"},
	} {
		if got := redactNATSURLs(tt.in); got != tt.want {
			t.Errorf("redactNATSURLs(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestShutdownGraceZero: 0 is no grace, not the default.
func TestShutdownGraceZero(t *testing.T) {
	for _, v := range []string{"0", "0s"} {
		if got := mustLoad(t, with(map[string]string{"COURIER_SHUTDOWN_GRACE": v})).ShutdownGrace; got != 0 {
			t.Errorf("COURIER_SHUTDOWN_GRACE=%s: %s, want 0", v, got)
		}
	}
	if got := mustLoad(t, minimal()).ShutdownGrace; got != 25*time.Second {
		t.Errorf("default ShutdownGrace %s", got)
	}
}

func TestClosestVar(t *testing.T) {
	for in, want := range map[string]string{
		"COURIER_MAXDELIVER":   "COURIER_MAX_DELIVER",
		"COURIER_MAX_DELIVERY": "COURIER_MAX_DELIVER",
		"COURIER_STREAMS":      "COURIER_STREAM",
		"COURIER_APP_HEALTH":   "COURIER_APP_HEALTH_URL",
		"COURIER_XYZZY":        "",
	} {
		if got := ClosestVar(in); got != want {
			t.Errorf("ClosestVar(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestPublishVariables: COURIER_PUBLISH_ADDR turns the publish API on, on
// loopback when it names only a port, and needs COURIER_PUBLISH_SUBJECTS;
// each bad value yields one problem naming it.
func TestPublishVariables(t *testing.T) {
	cfg := mustLoad(t, minimal())
	if cfg.ServesPublishes() || cfg.PublishListenAddr() != "" {
		t.Errorf("off by default: ServesPublishes %v, PublishListenAddr %q", cfg.ServesPublishes(), cfg.PublishListenAddr())
	}
	for addr, want := range map[string]string{":7416": "127.0.0.1:7416", "0.0.0.0:7416": "0.0.0.0:7416", "[::1]:7416": "[::1]:7416", "localhost:0": "localhost:0"} {
		cfg := mustLoad(t, with(map[string]string{"COURIER_PUBLISH_ADDR": addr, "COURIER_PUBLISH_SUBJECTS": "orders.>, billing.*.paid"}))
		if !cfg.ServesPublishes() || cfg.PublishListenAddr() != want {
			t.Errorf("COURIER_PUBLISH_ADDR=%s: listens on %q, want %q", addr, cfg.PublishListenAddr(), want)
		}
		if len(cfg.PublishSubjects) != 2 || cfg.PublishSubjects[1] != "billing.*.paid" {
			t.Errorf("PublishSubjects %q", cfg.PublishSubjects)
		}
	}

	tests := []struct {
		name    string
		environ map[string]string
		want    string // a prefix
	}{
		{"no subjects", with(map[string]string{"COURIER_PUBLISH_ADDR": ":7416"}), `COURIER_PUBLISH_SUBJECTS is required with COURIER_PUBLISH_ADDR`},
		{"subjects without the address", with(map[string]string{"COURIER_PUBLISH_SUBJECTS": "orders.>"}), `COURIER_PUBLISH_SUBJECTS="orders.>": is set but COURIER_PUBLISH_ADDR is not`},
		{"no port", with(map[string]string{"COURIER_PUBLISH_ADDR": "7416", "COURIER_PUBLISH_SUBJECTS": "a"}), `COURIER_PUBLISH_ADDR="7416": not a listen address`},
		{"the admin port", with(map[string]string{"COURIER_PUBLISH_ADDR": "127.0.0.1:7415", "COURIER_PUBLISH_SUBJECTS": "a"}), `COURIER_PUBLISH_ADDR="127.0.0.1:7415": the same port as COURIER_ADMIN_ADDR`},
		{"invalid subject", with(map[string]string{"COURIER_PUBLISH_ADDR": ":7416", "COURIER_PUBLISH_SUBJECTS": "orders..x"}), `COURIER_PUBLISH_SUBJECTS="orders..x": "orders..x" is not a valid subject`},
		{"reserved subject", with(map[string]string{"COURIER_PUBLISH_ADDR": ":7416", "COURIER_PUBLISH_SUBJECTS": "$JS.API.>"}), `COURIER_PUBLISH_SUBJECTS="$JS.API.>": "$JS.API.>": subjects starting with $JS. are reserved`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problems(t, tt.environ)
			if len(got) != 1 || !strings.HasPrefix(got[0], tt.want) {
				t.Errorf("problems:\n%s\nwant one starting\n %s", strings.Join(got, "\n"), tt.want)
			}
		})
	}

	vars, _, err := Inspect(with(map[string]string{"COURIER_PUBLISH_ADDR": ":7416", "COURIER_PUBLISH_SUBJECTS": "orders.>"}))
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]string{}
	for _, v := range vars {
		shown[v.Name] = v.Value
	}
	if shown["COURIER_PUBLISH_ADDR"] != ":7416" || shown["COURIER_PUBLISH_SUBJECTS"] != "orders.>" {
		t.Errorf("courier config shows %q and %q", shown["COURIER_PUBLISH_ADDR"], shown["COURIER_PUBLISH_SUBJECTS"])
	}
}
