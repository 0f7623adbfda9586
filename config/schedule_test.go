package config

import (
	"strings"
	"testing"
)

// TestSchedulePrefix: COURIER_SCHEDULE_PREFIX is _sched unless set; one
// that is not literal subject tokens, that NATS reserves, or that holds
// courier's own dead letters is a problem naming it.
func TestSchedulePrefix(t *testing.T) {
	if cfg := mustLoad(t, minimal()); cfg.SchedulePrefix != "_sched" {
		t.Errorf("default %q, want _sched", cfg.SchedulePrefix)
	}
	if cfg := mustLoad(t, with(map[string]string{"COURIER_SCHEDULE_PREFIX": "app.delayed"})); cfg.SchedulePrefix != "app.delayed" {
		t.Errorf("set %q, want app.delayed", cfg.SchedulePrefix)
	}
	tests := []struct{ value, want string }{
		{"_sched.>", `COURIER_SCHEDULE_PREFIX="_sched.>": must be literal subject tokens`},
		{"a..b", `COURIER_SCHEDULE_PREFIX="a..b": is not a valid subject`},
		{"$JS", `COURIER_SCHEDULE_PREFIX="$JS": subjects starting with $JS. are reserved by NATS`},
		{"_INBOX", `COURIER_SCHEDULE_PREFIX="_INBOX": subjects starting with _INBOX. are reserved by NATS`},
		{"dlq", `COURIER_SCHEDULE_PREFIX="dlq": COURIER_DLQ_SUBJECT "dlq.ORDERS.courier" is under it`},
	}
	for _, tt := range tests {
		got := problems(t, with(map[string]string{"COURIER_SCHEDULE_PREFIX": tt.value}))
		if len(got) != 1 || !strings.HasPrefix(got[0], tt.want) {
			t.Errorf("%q: problems\n%s\nwant one starting\n %s", tt.value, strings.Join(got, "\n"), tt.want)
		}
	}
}
