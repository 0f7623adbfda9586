package config

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// subsEnv is a valid environment of two subscriptions, orders and
// payments, each on a stream of its own, with kv applied ("<unset>"
// deletes).
func subsEnv(kv map[string]string) map[string]string {
	m := map[string]string{
		"COURIER_SUBSCRIPTIONS":       "orders,payments",
		"COURIER_APP_URL":             "http://127.0.0.1:8080/messages",
		"COURIER_SUB_ORDERS_STREAM":   "ORDERS",
		"COURIER_SUB_PAYMENTS_STREAM": "PAYMENTS",
	}
	for k, v := range kv {
		if v == "<unset>" {
			delete(m, k)
			continue
		}
		m[k] = v
	}
	return m
}

// TestSubscriptionFallback: a subscription's variable comes from its own
// COURIER_SUB_<NAME>_<VAR>, else the plain COURIER_<VAR>, else the
// default; the dead-letter subject's default follows its own stream and
// consumer; what the process has once is the plain Config's.
func TestSubscriptionFallback(t *testing.T) {
	environ := subsEnv(map[string]string{
		"COURIER_BATCH_MAX":                   "10",
		"COURIER_SUB_PAYMENTS_BATCH_MAX":      "1",
		"COURIER_SUB_PAYMENTS_CONSUMER":       "billing",
		"COURIER_SUB_PAYMENTS_APP_URL":        "http://127.0.0.1:9090/payments",
		"COURIER_SUB_ORDERS_ORDER_KEY":        "subject:2",
		"COURIER_SUB_ORDERS_MAX_INFLIGHT":     "auto:16",
		"COURIER_SUB_ORDERS_ROUTES":           "orders.*.created=/created",
		"COURIER_SUB_PAYMENTS_DLQ_SUBJECT":    "dead.payments",
		"COURIER_SUB_PAYMENTS_ACK_WAIT":       "1m",
		"COURIER_SUB_PAYMENTS_SUBJECTS":       "payments.>",
		"COURIER_SUB_ORDERS_STREAM_":          "", // empty: unset, not checked
		"COURIER_SUB_ORDERS_HTTP_TIMEOUT":     "", // empty: falls back
		"COURIER_HTTP_TIMEOUT":                "5s",
		"COURIER_ADMIN_ADDR":                  "127.0.0.1:7499",
		"COURIER_SUB_PAYMENTS_CLOUDEVENTS":    "BINARY",
		"COURIER_SUB_PAYMENTS_RETRY_STATUSES": "503",
	})
	cfg := mustLoad(t, environ)
	if !slices.Equal(cfg.SubscriptionNames, []string{"orders", "payments"}) {
		t.Errorf("SubscriptionNames %q", cfg.SubscriptionNames)
	}
	subs := cfg.Subscriptions()
	if len(subs) != 2 || subs[0].Name != "orders" || subs[1].Name != "payments" {
		t.Fatalf("subscriptions %+v", subs)
	}
	orders, payments := subs[0].Config, subs[1].Config

	for _, tt := range []struct {
		what      string
		got, want any
	}{
		{"orders' stream", orders.Stream, "ORDERS"},
		{"payments' stream", payments.Stream, "PAYMENTS"},
		{"orders' consumer (default)", orders.Consumer, "courier"},
		{"payments' consumer", payments.Consumer, "billing"},
		{"orders' batches (plain)", orders.BatchMax, 10},
		{"payments' batches (own)", payments.BatchMax, 1},
		{"orders' app URL (plain)", orders.AppURL, "http://127.0.0.1:8080/messages"},
		{"payments' app URL", payments.AppURL, "http://127.0.0.1:9090/payments"},
		{"orders' order key", orders.OrderKey, "subject:2"},
		{"payments' order key", payments.OrderKey, ""},
		{"orders' limit", [2]any{orders.MaxInflight, orders.InflightAuto}, [2]any{16, true}},
		{"payments' limit", [2]any{payments.MaxInflight, payments.InflightAuto}, [2]any{8, false}},
		{"orders' routes", orders.Routes, Routes{{"orders.*.created", "/created"}}},
		{"payments' routes", payments.Routes, Routes(nil)},
		{"orders' DLQ subject (its own default)", orders.DLQSubject, "dlq.ORDERS.courier"},
		{"payments' DLQ subject", payments.DLQSubject, "dead.payments"},
		{"orders' ack wait", orders.AckWait, 30 * time.Second},
		{"payments' ack wait", payments.AckWait, time.Minute},
		{"orders' timeout (empty own: plain)", orders.HTTPTimeout, 5 * time.Second},
		{"payments' subjects", payments.Subjects, []string{"payments.>"}},
		{"payments' CloudEvents (lower-cased)", payments.CloudEvents, CloudEventsBinary},
		{"payments' retry statuses", payments.RetryStatuses.String(), "503"},
		{"orders' retry statuses", orders.RetryStatuses.String(), "408,409,425,429,500,502-599"},
		{"orders' admin address (process)", orders.AdminAddr, "127.0.0.1:7499"},
		{"payments' admin address (process)", payments.AdminAddr, "127.0.0.1:7499"},
		{"plain stream", cfg.Stream, ""},
		{"plain batches", cfg.BatchMax, 10},
	} {
		if !reflect.DeepEqual(tt.got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.what, tt.got, tt.want)
		}
	}

	src := subs[1].Source
	for v, want := range map[string]string{
		"COURIER_STREAM":       "COURIER_SUB_PAYMENTS_STREAM",
		"COURIER_BATCH_MAX":    "COURIER_SUB_PAYMENTS_BATCH_MAX",
		"COURIER_HTTP_TIMEOUT": "COURIER_HTTP_TIMEOUT",
		"COURIER_MAX_DELIVER":  SourceDefault,
		"COURIER_DLQ_SUBJECT":  "COURIER_SUB_PAYMENTS_DLQ_SUBJECT",
	} {
		if src[v] != want {
			t.Errorf("payments' %s came from %q, want %q", v, src[v], want)
		}
	}
	if got := subs[0].Source["COURIER_DLQ_SUBJECT"]; got != SourceDefault {
		t.Errorf("orders' COURIER_DLQ_SUBJECT came from %q", got)
	}
	if got := slices.Sorted(maps.Keys(src)); !slices.Equal(got, slices.Sorted(maps.Keys(perSubVars()))) {
		t.Errorf("Source has %q, want every variable of the path", got)
	}

	// Every field the process has once is the plain Config's.
	pv, ov := reflect.ValueOf(cfg), reflect.ValueOf(orders)
	for i := range pv.NumField() {
		f := pv.Type().Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if tag == "" || isPerSub(tag) {
			continue
		}
		if !reflect.DeepEqual(pv.Field(i).Interface(), ov.Field(i).Interface()) {
			t.Errorf("orders' %s differs from the process's: %v, want %v", f.Name, ov.Field(i), pv.Field(i))
		}
	}
	if s := subs[0]; s.Var("COURIER_STREAM") != "COURIER_SUB_ORDERS_STREAM" || s.Var("COURIER_ADMIN_ADDR") != "COURIER_ADMIN_ADDR" {
		t.Errorf("Var: %s, %s", s.Var("COURIER_STREAM"), s.Var("COURIER_ADMIN_ADDR"))
	}
	// The returned slice is the caller's.
	subs[0].Name = "changed"
	if cfg.Subscriptions()[0].Name != "orders" {
		t.Error("Subscriptions shares its slice")
	}
}

// TestSubscriptionNameCase: names are matched in upper case, as their
// variables spell them, and kept as listed.
func TestSubscriptionNameCase(t *testing.T) {
	cfg := mustLoad(t, map[string]string{
		"COURIER_SUBSCRIPTIONS":     " Orders , eu2 ",
		"COURIER_APP_URL":           "http://127.0.0.1:8080/",
		"COURIER_SUB_ORDERS_STREAM": "ORDERS",
		"COURIER_SUB_EU2_STREAM":    "EU",
	})
	subs := cfg.Subscriptions()
	if len(subs) != 2 || subs[0].Name != "Orders" || subs[0].Config.Stream != "ORDERS" || subs[1].Name != "eu2" || subs[1].Config.Stream != "EU" {
		t.Errorf("subscriptions %v", subs)
	}
	if v := subs[0].Var("COURIER_BATCH_MAX"); v != "COURIER_SUB_ORDERS_BATCH_MAX" {
		t.Errorf("Var = %s", v)
	}
}

// TestOneSubscriptionWithout: without COURIER_SUBSCRIPTIONS there is one
// subscription, unnamed, whose Config is the Config.
func TestOneSubscriptionWithout(t *testing.T) {
	cfg := mustLoad(t, with(map[string]string{"COURIER_BATCH_MAX": "5"}))
	subs := cfg.Subscriptions()
	if len(subs) != 1 || subs[0].Name != "" || !reflect.DeepEqual(subs[0].Config, cfg) {
		t.Fatalf("subscriptions %+v", subs)
	}
	for v, want := range map[string]string{"COURIER_STREAM": "COURIER_STREAM", "COURIER_BATCH_MAX": "COURIER_BATCH_MAX", "COURIER_ACK_WAIT": SourceDefault} {
		if got := subs[0].Source[v]; got != want {
			t.Errorf("%s came from %q, want %q", v, got, want)
		}
	}
	if s := subs[0]; s.Var("COURIER_STREAM") != "COURIER_STREAM" {
		t.Errorf("Var = %s", s.Var("COURIER_STREAM"))
	}
	// A Config made by hand has its one subscription too.
	if subs := (Config{Stream: "S"}).Subscriptions(); len(subs) != 1 || subs[0].Config.Stream != "S" {
		t.Errorf("subscriptions %+v", subs)
	}
}

// TestSubscriptionErrors: each mistake is one problem, naming the variable
// (a subscription's own where it set one) and the closest real name.
func TestSubscriptionErrors(t *testing.T) {
	tests := []struct {
		name    string
		environ map[string]string
		want    string
	}{
		{"name not listed", subsEnv(map[string]string{"COURIER_SUB_ORDRES_BATCH_MAX": "5"}),
			"COURIER_SUB_ORDRES_BATCH_MAX: ORDRES is not a subscription in COURIER_SUBSCRIPTIONS (orders,payments): did you mean COURIER_SUB_ORDERS_BATCH_MAX?"},
		{"name far from any", subsEnv(map[string]string{"COURIER_SUB_REFUNDS_STREAM": "R"}),
			"COURIER_SUB_REFUNDS_STREAM: REFUNDS is not a subscription in COURIER_SUBSCRIPTIONS (orders,payments)"},
		{"no list", map[string]string{"COURIER_STREAM": "ORDERS", "COURIER_APP_URL": "http://h/", "COURIER_SUB_ORDERS_BATCH_MAX": "5"},
			"COURIER_SUB_ORDERS_BATCH_MAX: is set but COURIER_SUBSCRIPTIONS is not: list the subscription there (COURIER_SUBSCRIPTIONS=orders), or set the plain COURIER_BATCH_MAX for a courier of one subscription"},
		{"per process", subsEnv(map[string]string{"COURIER_SUB_ORDERS_ADMIN_ADDR": ":7500"}),
			"COURIER_SUB_ORDERS_ADMIN_ADDR: COURIER_ADMIN_ADDR is per process, not per subscription: every subscription shares it; set COURIER_ADMIN_ADDR"},
		{"per process dedup store", subsEnv(map[string]string{"COURIER_SUB_PAYMENTS_DEDUP_STORE": "shared"}),
			"COURIER_SUB_PAYMENTS_DEDUP_STORE: COURIER_DEDUP_STORE is per process, not per subscription: every subscription shares it; set COURIER_DEDUP_STORE"},
		{"per process connection", subsEnv(map[string]string{"COURIER_SUB_ORDERS_NATS_PASSWORD": "hunter2"}),
			"COURIER_SUB_ORDERS_NATS_PASSWORD: NATS_PASSWORD is per process, not per subscription: every subscription shares it; set NATS_PASSWORD"},
		{"the list itself", subsEnv(map[string]string{"COURIER_SUB_ORDERS_SUBSCRIPTIONS": "x"}),
			"COURIER_SUB_ORDERS_SUBSCRIPTIONS: COURIER_SUBSCRIPTIONS is per process, not per subscription: every subscription shares it; set COURIER_SUBSCRIPTIONS"},
		{"unknown, close to one of the path", subsEnv(map[string]string{"COURIER_SUB_ORDERS_BATCH_MAXX": "5"}),
			"COURIER_SUB_ORDERS_BATCH_MAXX: COURIER_BATCH_MAXX is not a courier variable: did you mean COURIER_SUB_ORDERS_BATCH_MAX?"},
		{"unknown, close to one of the process", subsEnv(map[string]string{"COURIER_SUB_ORDERS_ADMIN_ADR": ":1"}),
			"COURIER_SUB_ORDERS_ADMIN_ADR: COURIER_ADMIN_ADR is not a courier variable: did you mean COURIER_ADMIN_ADDR? It is per process, not per subscription: set COURIER_ADMIN_ADDR"},
		{"unknown, close to nothing", subsEnv(map[string]string{"COURIER_SUB_ORDERS_COLOUR": "blue"}),
			"COURIER_SUB_ORDERS_COLOUR: COURIER_COLOUR is not a courier variable (`courier config` lists them; those of one message's path can be set per subscription, as COURIER_SUB_ORDERS_<VAR>)"},
		{"no variable", subsEnv(map[string]string{"COURIER_SUB_ORDERS": "x"}),
			"COURIER_SUB_ORDERS: not a subscription's variable: expected COURIER_SUB_<NAME>_<VARIABLE>, such as COURIER_SUB_ORDERS_STREAM"},
		{"same durable", subsEnv(map[string]string{"COURIER_SUB_PAYMENTS_STREAM": "ORDERS"}),
			`subscriptions orders and payments are the same durable consumer, "courier" of the stream "ORDERS": each subscription needs its own; set COURIER_SUB_PAYMENTS_CONSUMER (or COURIER_SUB_PAYMENTS_STREAM) to another name`},
		{"same durable through the plain variables", subsEnv(map[string]string{"COURIER_SUB_ORDERS_STREAM": "<unset>", "COURIER_SUB_PAYMENTS_STREAM": "<unset>", "COURIER_STREAM": "EVENTS", "COURIER_CONSUMER": "c"}),
			`subscriptions orders and payments are the same durable consumer, "c" of the stream "EVENTS": each subscription needs its own; set COURIER_SUB_PAYMENTS_CONSUMER (or COURIER_SUB_PAYMENTS_STREAM) to another name`},
		{"one dead-letter subject", subsEnv(map[string]string{"COURIER_DLQ_SUBJECT": "dead"}),
			`subscriptions orders and payments dead-letter to the same subject "dead" (COURIER_DLQ_SUBJECT, COURIER_DLQ_SUBJECT): each needs its own, or ` + "`courier dlq`" + ` of one would list, replay and purge the other's; leave COURIER_DLQ_SUBJECT unset (dlq.<stream>.<consumer> differs per subscription) or set COURIER_SUB_PAYMENTS_DLQ_SUBJECT`},
		{"bad name", subsEnv(map[string]string{"COURIER_SUBSCRIPTIONS": "orders,payments,pay_outs"}),
			`COURIER_SUBSCRIPTIONS="orders,payments,pay_outs": "pay_outs" is not a subscription name: ASCII letters and digits only, as it is part of its variables' names (COURIER_SUB_<NAME>_STREAM)`},
		{"name listed twice", subsEnv(map[string]string{"COURIER_SUBSCRIPTIONS": "orders,payments,Orders"}),
			`COURIER_SUBSCRIPTIONS="orders,payments,Orders": "Orders" is listed twice (as "orders" before): a name's variables are upper case, COURIER_SUB_ORDERS_STREAM for both`},
		{"empty list", subsEnv(map[string]string{"COURIER_SUBSCRIPTIONS": " , "}),
			`COURIER_SUBSCRIPTIONS=" , ": names no subscription: expected names of letters and digits, comma separated, such as orders,payments (unset: one subscription, set by the plain variables)`},
		{"a subscription without a stream", subsEnv(map[string]string{"COURIER_SUB_PAYMENTS_STREAM": "<unset>"}),
			"COURIER_SUB_PAYMENTS_STREAM is required: the name of the stream this subscription consumes (it must exist; courier does not create it)"},
		{"a subscription without an app", subsEnv(map[string]string{"COURIER_APP_URL": "<unset>", "COURIER_SUB_ORDERS_APP_URL": "http://h/"}),
			"COURIER_SUB_PAYMENTS_APP_URL is required: the URL each message is POSTed to, such as http://127.0.0.1:8080/messages"},
		{"own bad value", subsEnv(map[string]string{"COURIER_SUB_ORDERS_BATCH_MAX": "5000"}),
			`COURIER_SUB_ORDERS_BATCH_MAX="5000": must be from 1 (one message per request) to 1000`},
		{"own value that does not parse", subsEnv(map[string]string{"COURIER_SUB_PAYMENTS_ACK_WAIT": "banana"}),
			`COURIER_SUB_PAYMENTS_ACK_WAIT="banana": not a duration: Go syntax expected, such as 500ms, 30s, 10m or 1h30m`},
		{"own limit", subsEnv(map[string]string{"COURIER_SUB_ORDERS_MAX_INFLIGHT": "auto:0"}),
			`COURIER_SUB_ORDERS_MAX_INFLIGHT="auto:0": the N of auto:N must be at least 1: ` + inflightSyntax},
		{"own routes", subsEnv(map[string]string{"COURIER_SUB_ORDERS_ROUTES": "orders.*=created"}),
			`COURIER_SUB_ORDERS_ROUTES="orders.*=created": "orders.*=created": the path "created" must start with '/' (` + routesSyntax + ")"},
		{"own value against a default", subsEnv(map[string]string{"COURIER_SUB_ORDERS_MAX_INFLIGHT": "2000"}),
			`COURIER_SUB_ORDERS_MAX_ACK_PENDING="1000" (default): must be at least COURIER_SUB_ORDERS_MAX_INFLIGHT (2000), and should be far larger: messages waiting out a backoff count toward it, so a small limit stalls fresh messages`},
		{"plain value against an own one", subsEnv(map[string]string{"COURIER_MAX_ACK_PENDING": "100", "COURIER_SUB_PAYMENTS_MAX_INFLIGHT": "200"}),
			`subscription payments: COURIER_MAX_ACK_PENDING="100": must be at least COURIER_SUB_PAYMENTS_MAX_INFLIGHT (200), and should be far larger: messages waiting out a backoff count toward it, so a small limit stalls fresh messages`},
		{"plain bad value, once for all it applies to", subsEnv(map[string]string{"COURIER_BATCH_MAX": "0"}),
			`subscriptions orders, payments: COURIER_BATCH_MAX="0": must be from 1 (one message per request) to 1000`},
		{"plain bad value, where it applies", subsEnv(map[string]string{"COURIER_BATCH_MAX": "0", "COURIER_SUB_ORDERS_BATCH_MAX": "5"}),
			`subscription payments: COURIER_BATCH_MAX="0": must be from 1 (one message per request) to 1000`},
		{"own subjects against the process's reply subjects", subsEnv(map[string]string{"COURIER_SUB_PAYMENTS_SUBJECTS": "payments.>", "COURIER_REPLY_SUBJECTS": "payments.get"}),
			`subscription payments: COURIER_REPLY_SUBJECTS="payments.get": "payments.get" overlaps the filter subject "payments.>" of COURIER_SUB_PAYMENTS_SUBJECTS: the stream would store such a request too, and its acknowledgement could answer the caller before the app does`},
		{"own success subject consumed", subsEnv(map[string]string{"COURIER_SUB_ORDERS_SUBJECTS": "orders.>", "COURIER_SUB_ORDERS_SUCCESS_SUBJECT": "orders.done"}),
			`COURIER_SUB_ORDERS_SUCCESS_SUBJECT="orders.done": matched by the filter subject "orders.>" of COURIER_SUB_ORDERS_SUBJECTS, so courier would consume its own success records: choose a subject outside the consumed ones`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problems(t, tt.environ)
			if len(got) != 1 || got[0] != tt.want {
				t.Errorf("problems:\n%s\nwant\n%s", strings.Join(got, "\n"), tt.want)
			}
			if strings.Contains(strings.Join(got, "\n"), "hunter2") {
				t.Error("a value set in the wrong place is shown")
			}
		})
	}
}

// TestSubscriptionProblemsAtOnce: the process's problems first, then the
// names, then each subscription's, then those between subscriptions; the
// plain variables of the path are not blamed on their own.
func TestSubscriptionProblemsAtOnce(t *testing.T) {
	got := problems(t, subsEnv(map[string]string{
		"COURIER_SUB_PAYMENTS_STREAM":    "ORDERS",
		"COURIER_SUB_PAYMENTS_BATCH_MAX": "x",
		"COURIER_SUB_ORDERS_BATCH_MAX":   "0",
		"COURIER_SUB_ORDERS_ACK_WAIT":    "1",
		"COURIER_SUB_ORDRES_STREAM":      "S",
		"COURIER_LOG_LEVEL":              "loud",
		"COURIER_MAX_DELIVER":            "-1",
	}))
	want := []string{
		`COURIER_LOG_LEVEL="loud": expected debug, info, warn or error`,
		"COURIER_SUB_ORDRES_STREAM: ORDRES is not a subscription in COURIER_SUBSCRIPTIONS (orders,payments): did you mean COURIER_SUB_ORDERS_STREAM?",
		`subscriptions orders, payments: COURIER_MAX_DELIVER="-1": must be at least 1 (the first delivery counts)`,
		`COURIER_SUB_ORDERS_ACK_WAIT="1": missing a unit: a duration in Go syntax, such as 1s`,
		`COURIER_SUB_ORDERS_BATCH_MAX="0": must be from 1 (one message per request) to 1000`,
		`COURIER_SUB_PAYMENTS_BATCH_MAX="x": not an integer`,
		`subscriptions orders and payments are the same durable consumer, "courier" of the stream "ORDERS": each subscription needs its own; set COURIER_SUB_PAYMENTS_CONSUMER (or COURIER_SUB_PAYMENTS_STREAM) to another name`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Without COURIER_SUBSCRIPTIONS a plain stream is required as before;
	// with it, only per subscription.
	mustLoad(t, subsEnv(nil))
}

// TestSubscriptionVarsNotUnknown: `courier config` names unknown COURIER_
// variables; a subscription's are known (or Load's problems).
func TestSubscriptionVarsNotUnknown(t *testing.T) {
	environ := subsEnv(map[string]string{"COURIER_SUB_ORDERS_BATCH_MAX": "5", "COURIER_SUBSCRIPTION": "x", "COURIER_SUB_ORDRES_STREAM": "S"})
	if got := UnknownVars(environ); !slices.Equal(got, []string{"COURIER_SUBSCRIPTION"}) {
		t.Errorf("UnknownVars = %q", got)
	}
	if got := ClosestVar("COURIER_SUBSCRIPTION"); got != "COURIER_SUBSCRIPTIONS" {
		t.Errorf("ClosestVar = %q", got)
	}
}

// TestSubscriptionWarnings: each subscription is warned about as its
// problems are, once for what several share.
func TestSubscriptionWarnings(t *testing.T) {
	environ := subsEnv(map[string]string{
		"COURIER_MAX_DELIVER":              "1",
		"COURIER_SUB_PAYMENTS_MAX_DELIVER": "2",
		"COURIER_SUB_ORDERS_SUBJECTS":      "orders.>",
		"COURIER_SUB_ORDERS_ROUTES":        "payments.*=/p",
	})
	var got []string
	for _, w := range Warnings(mustLoad(t, environ), environ) {
		got = append(got, w.Variable+" | "+w.Text)
	}
	want := []string{
		"COURIER_MAX_DELIVER | subscription orders: COURIER_MAX_DELIVER=1 allows no retry: a transient failure (a 503, a timeout) dead-letters the message at once, and so does stopping courier (a rollout, an app outage) while it holds messages; keep it at 3 or more",
		`COURIER_SUB_ORDERS_ROUTES | COURIER_SUB_ORDERS_ROUTES: the pattern "payments.*" matches no subject of COURIER_SUB_ORDERS_SUBJECTS (orders.>): no message takes the route to /p`,
		"COURIER_SUB_PAYMENTS_MAX_DELIVER | COURIER_SUB_PAYMENTS_MAX_DELIVER=2 allows one retry, which a restart while courier holds a message (a rollout, an app outage) may already spend; keep it at 3 or more",
	}
	if !slices.Equal(got, want) {
		t.Errorf("warnings:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	environ = subsEnv(map[string]string{"COURIER_MAX_DELIVER": "1"})
	ws := Warnings(mustLoad(t, environ), environ)
	if len(ws) != 1 || !strings.HasPrefix(ws[0].Text, "subscriptions orders, payments: COURIER_MAX_DELIVER=1 allows no retry") {
		t.Errorf("warnings %q", ws)
	}
}

// TestInspectSubscriptions: `courier config` shows each subscription's
// values of the path and where each came from; a wrong one as given, with
// its problem.
func TestInspectSubscriptions(t *testing.T) {
	if got := InspectSubscriptions(minimal()); got != nil {
		t.Errorf("without COURIER_SUBSCRIPTIONS: %v", got)
	}
	subs := InspectSubscriptions(subsEnv(map[string]string{
		"COURIER_BATCH_MAX":               "10",
		"COURIER_SUB_PAYMENTS_BATCH_MAX":  "banana",
		"COURIER_SUB_PAYMENTS_APP_URL":    "http://u:secret@127.0.0.1:9/p",
		"COURIER_SUB_ORDERS_MAX_INFLIGHT": "auto",
	}))
	if len(subs) != 2 || subs[0].Name != "orders" || subs[1].Name != "payments" {
		t.Fatalf("subscriptions %+v", subs)
	}
	type row struct{ value, source string }
	rows := func(sv SubscriptionVars) map[string]row {
		m := map[string]row{}
		for _, v := range sv.Vars {
			if !v.PerSubscription {
				t.Errorf("%s: %s is not per subscription", sv.Name, v.Name)
			}
			m[v.Name] = row{v.Value, v.Source}
		}
		if len(m) != len(perSubVars()) {
			t.Errorf("%s: %d variables, want %d", sv.Name, len(m), len(perSubVars()))
		}
		return m
	}
	orders, payments := rows(subs[0]), rows(subs[1])
	for _, tt := range []struct {
		what      string
		got, want row
	}{
		{"orders' stream", orders["COURIER_STREAM"], row{"ORDERS", "COURIER_SUB_ORDERS_STREAM"}},
		{"orders' batches", orders["COURIER_BATCH_MAX"], row{"10", "COURIER_BATCH_MAX"}},
		{"orders' limit", orders["COURIER_MAX_INFLIGHT"], row{"auto", "COURIER_SUB_ORDERS_MAX_INFLIGHT"}},
		{"orders' DLQ subject", orders["COURIER_DLQ_SUBJECT"], row{"dlq.ORDERS.courier", SourceDefault}},
		{"payments' batches, as given", payments["COURIER_BATCH_MAX"], row{"banana", "COURIER_SUB_PAYMENTS_BATCH_MAX"}},
		{"payments' app, redacted", payments["COURIER_APP_URL"], row{"http://u:[redacted]@127.0.0.1:9/p", "COURIER_SUB_PAYMENTS_APP_URL"}},
		{"payments' ack wait", payments["COURIER_ACK_WAIT"], row{"30s", SourceDefault}},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.what, tt.got, tt.want)
		}
	}
	for _, v := range subs[1].Vars {
		wantProblem := v.Name == "COURIER_BATCH_MAX"
		if (len(v.Problems) > 0) != wantProblem {
			t.Errorf("payments' %s: problems %q", v.Name, v.Problems)
		}
	}
}

// TestInspectPlainVariableOfSubscriptions: a plain variable of the path
// that is wrong for the subscriptions taking it is shown as given and
// invalid; one no subscription takes is not checked.
func TestInspectPlainVariableOfSubscriptions(t *testing.T) {
	vars, _, err := Inspect(subsEnv(map[string]string{
		"COURIER_BATCH_MAX":             "abc",
		"COURIER_ACK_WAIT":              "banana",
		"COURIER_SUB_ORDERS_ACK_WAIT":   "1m",
		"COURIER_SUB_PAYMENTS_ACK_WAIT": "2m",
	}))
	if err == nil || strings.Contains(err.Error(), "banana") {
		t.Errorf("error %v: want COURIER_BATCH_MAX's problem only", err)
	}
	environ := subsEnv(map[string]string{"COURIER_ACK_WAIT": "banana", "COURIER_SUB_ORDERS_ACK_WAIT": "1m", "COURIER_SUB_PAYMENTS_ACK_WAIT": "2m"})
	ws := Warnings(mustLoad(t, environ), environ)
	if len(ws) != 1 || ws[0].Text != "COURIER_ACK_WAIT is set but every subscription sets its own (COURIER_SUB_<NAME>_ACK_WAIT): it is not used" {
		t.Errorf("warnings %q", ws)
	}
	for _, v := range vars {
		switch v.Name {
		case "COURIER_BATCH_MAX":
			if v.Value != "abc" || len(v.Problems) != 1 || v.Problems[0] != `COURIER_BATCH_MAX="abc": not an integer` {
				t.Errorf("COURIER_BATCH_MAX: %q, problems %q", v.Value, v.Problems)
			}
		default:
			if len(v.Problems) > 0 {
				t.Errorf("%s: problems %q", v.Name, v.Problems)
			}
		}
	}
}
