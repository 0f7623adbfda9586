package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDo(t *testing.T) {
	fast := Policy{Initial: time.Millisecond, Max: 2 * time.Millisecond, Jitter: -1}
	errBoom := errors.New("boom")
	tests := []struct {
		name      string
		failFor   int   // op fails this many times first
		permanent bool  // the failures are permanent
		want      error // nil, errBoom
		wantCalls int
		wantWaits int
	}{
		{name: "first try", failFor: 0, wantCalls: 1},
		{name: "after transient failures", failFor: 3, wantCalls: 4, wantWaits: 3},
		{name: "permanent stops at once", failFor: 5, permanent: true, want: errBoom, wantCalls: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls, waits := 0, 0
			err := Do(context.Background(), fast, func(context.Context) error {
				calls++
				if calls <= tc.failFor {
					if tc.permanent {
						return Permanent(errBoom)
					}
					return errBoom
				}
				return nil
			}, func(err error, d time.Duration) {
				waits++
				if !errors.Is(err, errBoom) || d <= 0 {
					t.Errorf("notify(%v, %v)", err, d)
				}
			})
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("Do = %v, want %v", err, tc.want)
			}
			if calls != tc.wantCalls || waits != tc.wantWaits {
				t.Fatalf("calls %d waits %d, want %d and %d", calls, waits, tc.wantCalls, tc.wantWaits)
			}
		})
	}
}

func TestDoReturnsContextError(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Do(ctx, Policy{Initial: time.Hour}, func(context.Context) error {
		calls++
		cancel() // cancelled while the op runs: its failure must not be reported as success or as itself
		return errors.New("transient")
	}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, want context.Canceled", err)
	}
	if calls != 1 {
		t.Fatalf("calls = %d, want 1", calls)
	}
	if err := Do(ctx, Policy{}, func(context.Context) error { t.Fatal("op ran on an ended context"); return nil }, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do on ended ctx = %v", err)
	}
}

func TestPolicySchedule(t *testing.T) {
	b := Policy{Initial: time.Second, Max: 4 * time.Second, Multiplier: 2, Jitter: -1}.backOff()
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second}
	for i, w := range want {
		if got := b.NextBackOff(); got != w {
			t.Fatalf("wait %d = %v, want %v", i, got, w)
		}
	}
}
