package schedule

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

func TestServerSupports(t *testing.T) {
	for v, want := range map[string]bool{"2.12.0": true, "v2.15.2": true, "2.12.0-beta.1": true, "3.0.0": true,
		"2.11.9": false, "2.9.0": false, "": false, "dev": false} {
		if got := ServerSupports(v); got != want {
			t.Errorf("ServerSupports(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestCheck(t *testing.T) {
	ready := jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>", "_sched.ORDERS.>"}, AllowMsgSchedules: true}
	tests := []struct {
		name   string
		adjust func(*jetstream.StreamConfig)
		server string
		why    string // "" for ready
		fix    string
	}{
		{name: "ready", adjust: func(*jetstream.StreamConfig) {}},
		{name: "wider prefix subject", adjust: func(c *jetstream.StreamConfig) { c.Subjects = []string{"orders.>", "_sched.>"} }},
		{name: "old server", adjust: func(*jetstream.StreamConfig) {}, server: "2.11.4", why: "the NATS server is 2.11.4, and message schedules need nats-server 2.12 or later"},
		{name: "flag off", adjust: func(c *jetstream.StreamConfig) { c.AllowMsgSchedules = false }, why: "allow_msg_schedules is off",
			fix: "nats stream edit ORDERS --allow-schedules"},
		{name: "not captured", adjust: func(c *jetstream.StreamConfig) { c.Subjects = []string{"orders.>"} },
			why: "it does not capture _sched.ORDERS.>", fix: "nats stream edit ORDERS --subjects='orders.>,_sched.ORDERS.>'"},
		{name: "neither, discard new", adjust: func(c *jetstream.StreamConfig) {
			c.Subjects, c.AllowMsgSchedules, c.Discard = []string{"orders.>"}, false, jetstream.DiscardNew
		}, why: "allow_msg_schedules is off, and it does not capture", fix: "nats stream edit ORDERS --allow-schedules --discard=old --subjects='orders.>,_sched.ORDERS.>'"},
		{name: "everything", adjust: func(c *jetstream.StreamConfig) { c.Subjects = []string{">"} }, why: `its subject ">" takes in the schedules' subjects _sched.ORDERS.> and others`},
		{name: "mirror", adjust: func(c *jetstream.StreamConfig) { c.Mirror = &jetstream.StreamSource{Name: "X"} }, why: "it is a mirror"},
		{name: "sources", adjust: func(c *jetstream.StreamConfig) { c.Sources = []*jetstream.StreamSource{{Name: "X"}} }, why: "it has sources"},
		{name: "counter", adjust: func(c *jetstream.StreamConfig) { c.AllowMsgCounter = true }, why: "counter stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ready
			cfg.Subjects = slices.Clone(ready.Subjects)
			tt.adjust(&cfg)
			server := tt.server
			if server == "" {
				server = "2.15.2"
			}
			err := Check(cfg, "_sched", server)
			if tt.why == "" {
				if err != nil {
					t.Errorf("Check: %v, want nil", err)
				}
				return
			}
			var nr *NotReady
			if !errors.As(err, &nr) || !strings.Contains(nr.Why, tt.why) || nr.Fix != tt.fix {
				t.Fatalf("Check: %#v, want why containing %q and fix %q", err, tt.why, tt.fix)
			}
			if tt.fix != "" && !strings.Contains(err.Error(), "`"+tt.fix+"`") {
				t.Errorf("error %q does not name the fix", err)
			}
		})
	}
}

func TestLeave(t *testing.T) {
	stream := func(subjects ...string) jetstream.StreamConfig {
		return jetstream.StreamConfig{Name: "ORDERS", Subjects: subjects, AllowMsgSchedules: true}
	}
	tests := []struct {
		name    string
		cfg     jetstream.StreamConfig
		filters []string
		want    []string
		changed bool
		err     string
	}{
		{name: "no schedules, whole stream", cfg: stream("orders.>"), want: nil},
		{name: "no schedules, filters kept", cfg: stream("orders.>"), filters: []string{"orders.paid"}, want: []string{"orders.paid"}},
		{name: "whole stream less the schedules", cfg: stream("orders.>", "_sched.ORDERS.>"), want: []string{"orders.>"}, changed: true},
		{name: "several subjects", cfg: stream("orders.>", "_sched.ORDERS.>", "refunds.*"), want: []string{"orders.>", "refunds.*"}, changed: true},
		{name: "courier's whole prefix", cfg: stream("orders.>", "_sched.>"), want: []string{"orders.>"}, changed: true},
		{name: "filters away from the schedules", cfg: stream("orders.>", "_sched.ORDERS.>"), filters: []string{"orders.paid"}, want: []string{"orders.paid"}},
		{name: "a filter of everything", cfg: stream("orders.>", "_sched.ORDERS.>"), filters: []string{">"}, want: []string{"orders.>"}, changed: true},
		{name: "a filter of tokens", cfg: stream("orders.>", "_sched.ORDERS.>"), filters: []string{"*.>"}, want: []string{"orders.>"}, changed: true},
		{name: "a stream of everything", cfg: stream(">"), want: nil, err: `takes in stream ORDERS's subject ">"`},
		{name: "a stream of everything, no schedules", cfg: jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{">"}}, want: nil},
		{name: "only the schedules", cfg: stream("orders.>", "_sched.ORDERS.>"), filters: []string{"_sched.ORDERS.>"}, err: "every filter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, changed, err := Leave(tt.cfg, tt.filters, "_sched")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("error %v, want one containing %q", err, tt.err)
				}
				if errors.Is(err, ErrCannotLeave) && (!slices.Equal(got, tt.filters) || changed) {
					t.Errorf("Leave = %q, %v; want the filters as they are", got, changed)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) || changed != tt.changed {
				t.Errorf("Leave = %q, %v, %v; want %q, %v", got, changed, err, tt.want, tt.changed)
			}
		})
	}
}

func TestReceives(t *testing.T) {
	for _, tt := range []struct {
		cc   jetstream.ConsumerConfig
		want bool
	}{
		{jetstream.ConsumerConfig{}, true},
		{jetstream.ConsumerConfig{FilterSubject: "orders.>"}, false},
		{jetstream.ConsumerConfig{FilterSubject: ">"}, true},
		{jetstream.ConsumerConfig{FilterSubjects: []string{"orders.>", "_sched.ORDERS.x"}}, true},
		{jetstream.ConsumerConfig{FilterSubject: "_sched.PAYMENTS.>"}, false},
	} {
		if got := Receives(tt.cc, "_sched", "ORDERS"); got != tt.want {
			t.Errorf("Receives(%+v) = %v, want %v", tt.cc, got, tt.want)
		}
	}
}
