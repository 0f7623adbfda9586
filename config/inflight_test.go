package config

import (
	"strings"
	"testing"
)

// TestMaxInflight: COURIER_MAX_INFLIGHT is a number as before, or auto /
// auto:N (any case, spaces around); MaxInflight holds the number or the
// ceiling, and `courier config` shows the value as it could be set.
func TestMaxInflight(t *testing.T) {
	for _, tt := range []struct {
		given string
		n     int
		auto  bool
		shown string
	}{
		{"", 8, false, "8"},
		{"1", 1, false, "1"},
		{" 32 ", 32, false, "32"},
		{"auto", 64, true, "auto"},
		{"AUTO", 64, true, "auto"},
		{"auto:16", 16, true, "auto:16"},
		{" Auto: 200 ", 200, true, "auto:200"},
		{"auto:64", 64, true, "auto"},
		{"auto:1", 1, true, "auto:1"},
		{"10000", 10000, false, "10000"},
		{"auto:10000", 10000, true, "auto:10000"},
	} {
		environ := with(map[string]string{"COURIER_MAX_INFLIGHT": tt.given})
		if tt.n > 1000 {
			environ["COURIER_MAX_ACK_PENDING"] = "50000"
		}
		cfg := mustLoad(t, environ)
		if cfg.MaxInflight != tt.n || cfg.InflightAuto != tt.auto {
			t.Errorf("COURIER_MAX_INFLIGHT=%q: MaxInflight %d, InflightAuto %v; want %d, %v", tt.given, cfg.MaxInflight, cfg.InflightAuto, tt.n, tt.auto)
		}
		if got := describeValue(t, cfg, inflightVar); got != tt.shown {
			t.Errorf("COURIER_MAX_INFLIGHT=%q: shown as %q, want %q", tt.given, got, tt.shown)
		}
	}
}

// TestMaxInflightBadValues: each bad value is one problem naming the
// variable, the value and what is accepted.
func TestMaxInflightBadValues(t *testing.T) {
	for _, tt := range []struct{ given, want string }{
		{"0", `COURIER_MAX_INFLIGHT="0": must be at least 1: ` + inflightSyntax},
		{"-1", `COURIER_MAX_INFLIGHT="-1": must be at least 1: ` + inflightSyntax},
		{"many", `COURIER_MAX_INFLIGHT="many": not a number: ` + inflightSyntax},
		{"auto:0", `COURIER_MAX_INFLIGHT="auto:0": the N of auto:N must be at least 1: ` + inflightSyntax},
		{"auto:-3", `COURIER_MAX_INFLIGHT="auto:-3": the N of auto:N must be at least 1: ` + inflightSyntax},
		{"auto:x", `COURIER_MAX_INFLIGHT="auto:x": the N of auto:N is not a whole number: ` + inflightSyntax},
		{"auto:", `COURIER_MAX_INFLIGHT="auto:": the N of auto:N is not a whole number: ` + inflightSyntax},
		{"automatic", `COURIER_MAX_INFLIGHT="automatic": not a number: ` + inflightSyntax},
		{"99999999999999999999", `COURIER_MAX_INFLIGHT="99999999999999999999": integer out of range: ` + inflightSyntax},
		{"10001", `COURIER_MAX_INFLIGHT="10001": must be at most 10000: ` + inflightSyntax},
		{"auto:10001", `COURIER_MAX_INFLIGHT="auto:10001": the N of auto:N must be at most 10000: ` + inflightSyntax},
		// Within int64, as COURIER_MAX_ACK_PENDING's own problem asks: a
		// worker, a slot and queue room per request would not fit.
		{"auto:4611686018427387904", `COURIER_MAX_INFLIGHT="auto:4611686018427387904": the N of auto:N must be at most 10000: ` + inflightSyntax},
		{"4611686018427387904", `COURIER_MAX_INFLIGHT="4611686018427387904": must be at most 10000: ` + inflightSyntax},
	} {
		got := problems(t, with(map[string]string{"COURIER_MAX_INFLIGHT": tt.given, "COURIER_MAX_ACK_PENDING": "4611686018427387904"}))
		if len(got) != 1 || got[0] != tt.want {
			t.Errorf("COURIER_MAX_INFLIGHT=%q: problems\n%s\nwant\n%s", tt.given, strings.Join(got, "\n"), tt.want)
		}
	}
}

// TestMaxInflightAutoAckPending: the ack-pending limit must hold what the
// automatic limit may reach, its ceiling.
func TestMaxInflightAutoAckPending(t *testing.T) {
	got := problems(t, with(map[string]string{"COURIER_MAX_INFLIGHT": "auto:2000"}))
	want := `COURIER_MAX_ACK_PENDING="1000" (default): must be at least COURIER_MAX_INFLIGHT (auto:2000)`
	if len(got) != 1 || !strings.HasPrefix(got[0], want) {
		t.Errorf("problems:\n%s\nwant one starting\n %s", strings.Join(got, "\n"), want)
	}
	mustLoad(t, with(map[string]string{"COURIER_MAX_INFLIGHT": "auto:2000", "COURIER_MAX_ACK_PENDING": "20000"}))
}

// describeValue is the value Describe shows for the variable name.
func describeValue(t *testing.T, cfg Config, name string) string {
	t.Helper()
	for _, v := range Describe(cfg) {
		if v.Name == name {
			return v.Value
		}
	}
	t.Fatalf("Describe has no %s", name)
	return ""
}

// TestMaxInflightTimesBatchMax: batches may hold COURIER_MAX_INFLIGHT ×
// COURIER_BATCH_MAX messages at once, and courier makes room for them all
// at start: a product past the bound is one problem naming both variables
// and the bound; at the bound it loads.
func TestMaxInflightTimesBatchMax(t *testing.T) {
	got := problems(t, with(map[string]string{"COURIER_MAX_INFLIGHT": "auto:101", "COURIER_BATCH_MAX": "1000", "COURIER_MAX_ACK_PENDING": "200000"}))
	want := `COURIER_BATCH_MAX="1000": times COURIER_MAX_INFLIGHT (auto:101) is 101000 messages in batches at once, more than the 100000 courier holds: lower one of them`
	if len(got) != 1 || got[0] != want {
		t.Errorf("problems:\n%s\nwant\n%s", strings.Join(got, "\n"), want)
	}
	mustLoad(t, with(map[string]string{"COURIER_MAX_INFLIGHT": "100", "COURIER_BATCH_MAX": "1000", "COURIER_MAX_ACK_PENDING": "200000"}))
	mustLoad(t, with(map[string]string{"COURIER_MAX_INFLIGHT": "10000", "COURIER_MAX_ACK_PENDING": "200000"}))

	// A subscription's own values are held to the same bound, named as it
	// names them.
	got = problems(t, map[string]string{
		"COURIER_SUBSCRIPTIONS":              "orders",
		"COURIER_SUB_ORDERS_STREAM":          "ORDERS",
		"COURIER_SUB_ORDERS_APP_URL":         "http://127.0.0.1:8080/orders",
		"COURIER_SUB_ORDERS_MAX_INFLIGHT":    "200",
		"COURIER_SUB_ORDERS_BATCH_MAX":       "1000",
		"COURIER_SUB_ORDERS_MAX_ACK_PENDING": "300000",
	})
	if len(got) != 1 || !strings.Contains(got[0], "COURIER_SUB_ORDERS_BATCH_MAX=") || !strings.Contains(got[0], "COURIER_SUB_ORDERS_MAX_INFLIGHT (200)") {
		t.Errorf("a subscription's batches past the bound: problems\n%s\nwant one naming COURIER_SUB_ORDERS_BATCH_MAX and COURIER_SUB_ORDERS_MAX_INFLIGHT", strings.Join(got, "\n"))
	}
}
