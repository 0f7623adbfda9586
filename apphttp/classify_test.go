package apphttp

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want Class
	}{
		{"2xx", nil, Success},
		{"429", &AppError{Kind: KindStatus, Status: 429}, Transient},
		{"503", &AppError{Kind: KindStatus, Status: 503}, Transient},
		{"500", &AppError{Kind: KindStatus, Status: 500}, Transient},
		{"501 is permanent", &AppError{Kind: KindStatus, Status: 501}, Permanent},
		{"400", &AppError{Kind: KindStatus, Status: 400}, Permanent},
		{"404", &AppError{Kind: KindStatus, Status: 404}, Permanent},
		{"302 is an answer", &AppError{Kind: KindStatus, Status: 302}, Permanent},
		{"408", &AppError{Kind: KindStatus, Status: 408}, Transient},
		{"timeout", &AppError{Kind: KindTimeout, Err: context.DeadlineExceeded}, Transient},
		{"transport", &AppError{Kind: KindTransport, Err: errors.New("reset")}, Transient},
		{"unreachable", &AppError{Kind: KindUnreachable, Err: errors.New("refused")}, Unavailable},
		{"other error", errors.New("boom"), Transient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.err, retryable); got != tt.want {
				t.Fatalf("Classify = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"", 0, false},
		{"7", 7 * time.Second, true},
		{" 0 ", 0, true},
		{"-3", 0, false},
		{"+5", 0, false}, // delay-seconds is digits only (RFC 9110)
		{"+0", 0, false},
		{"-0", 0, false},
		{"5s", 0, false},
		{"1.5", 0, false},
		{"0x10", 0, false},
		{"1_0", 0, false},
		{"1 2", 0, false},
		{"\t12\t", 12 * time.Second, true},
		{"007", 7 * time.Second, true},
		{"-99999999999999999999999", 0, false},
		{"+99999999999999999999999", 0, false},
		{"abc", 0, false},
		{"99999999999", time.Minute, true},
		{"99999999999999999999999", time.Minute, true}, // past int64: still capped, not ignored
		{now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{now.Add(time.Hour).Format(http.TimeFormat), time.Minute, true},
	}
	for _, tt := range tests {
		got, ok := RetryAfter(tt.in, now, time.Minute)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("RetryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}
