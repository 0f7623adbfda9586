package schedule

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestWhen(t *testing.T) {
	now := time.Date(2026, 5, 1, 8, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	tests := []struct {
		name      string
		delay, at []string
		want      time.Time
		given     bool
		err       string
	}{
		{name: "none"},
		{name: "duration", delay: []string{"90s"}, want: now.Add(90 * time.Second).UTC(), given: true},
		{name: "minutes", delay: []string{"15m"}, want: now.Add(15 * time.Minute).UTC(), given: true},
		{name: "seconds", delay: []string{"90"}, want: now.Add(90 * time.Second).UTC(), given: true},
		{name: "zero", delay: []string{"0"}, want: now.UTC(), given: true},
		{name: "spaces", delay: []string{" 2s "}, want: now.Add(2 * time.Second).UTC(), given: true},
		{name: "time", at: []string{"2026-05-02T10:00:00+02:00"}, want: time.Date(2026, 5, 2, 8, 0, 0, 0, time.UTC), given: true},
		{name: "nanoseconds", at: []string{"2026-05-02T08:00:00.123456789Z"}, want: time.Date(2026, 5, 2, 8, 0, 0, 123456789, time.UTC), given: true},
		{name: "past", at: []string{"2020-01-01T00:00:00Z"}, want: time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), given: true},
		{name: "negative", delay: []string{"-1s"}, given: true, err: "negative"},
		{name: "word", delay: []string{"soon"}, given: true, err: "neither a duration"},
		{name: "float seconds", delay: []string{"1.5"}, given: true, err: "neither a duration"},
		{name: "too many seconds", delay: []string{"99999999999999"}, given: true, err: "more seconds than a delay may be"},
		{name: "not RFC 3339", at: []string{"May 1"}, given: true, err: "not an RFC 3339 time"},
		{name: "no zone", at: []string{"2026-05-02T08:00:00"}, given: true, err: "not an RFC 3339 time"},
		{name: "both", delay: []string{"1s"}, at: []string{"2026-05-02T08:00:00Z"}, given: true, err: "give one of them"},
		{name: "twice", delay: []string{"1s", "2s"}, given: true, err: "more than one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, given, err := When(tt.delay, tt.at, now)
			if given != tt.given {
				t.Errorf("given %v, want %v", given, tt.given)
			}
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil || !got.Equal(tt.want) || got.Location() != time.UTC {
				t.Errorf("When = %s, %v; want %s UTC", got, err, tt.want)
			}
		})
	}
}

func TestID(t *testing.T) {
	id := ID{Stream: "ORDERS", Token: KeyToken("order-1")}
	if got := id.Subject("_sched"); got != "_sched.ORDERS."+id.Token {
		t.Errorf("Subject %q", got)
	}
	back, err := ParseID(id.String())
	if err != nil || back != id {
		t.Errorf("ParseID(%q) = %+v, %v", id, back, err)
	}
	for _, bad := range []string{"", "ORDERS", "ORDERS.", ".tok", "ORDERS.a.b", "ORDERS.*", "ORDERS.>", "OR DERS.x", "a/b.x", "ORDERS.t k"} {
		if _, err := ParseID(bad); !errors.Is(err, ErrBadID) {
			t.Errorf("ParseID(%q) = %v, want ErrBadID", bad, err)
		}
	}
	a, again, b := KeyToken("a"), KeyToken("a"), KeyToken("b")
	if a == b || a != again || len(a) != 26 {
		t.Errorf("KeyToken: %q, %q again, %q for b", a, again, b)
	}
	n1, n2 := NewToken(), NewToken()
	if !validToken(a) || !validToken(n1) || n1 == n2 {
		t.Error("tokens are not unique subject tokens")
	}
}
