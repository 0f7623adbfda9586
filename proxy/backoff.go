package proxy

import (
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Delay returns the full-jitter backoff before attempt+1: a random duration
// in [0, min(max, initial*multiplier^(attempt-1))]. rnd(n) returns a value in
// [0, n).
func Delay(attempt int, initial, max time.Duration, multiplier float64, rnd func(n int64) int64) time.Duration {
	ceil := scheduleAt(attempt, initial, max, multiplier)
	if ceil <= 0 {
		return 0
	}
	return time.Duration(rnd(int64(ceil) + 1))
}

// scheduleAt is the backoff ceiling at a 1-based attempt, before jitter:
// initial*multiplier^(attempt-1), capped at max. A fresh ExponentialBackOff
// per call, since it is not safe for concurrent use; no randomisation and no
// elapsed-time stop of its own (full jitter is drawn by Delay).
func scheduleAt(attempt int, initial, max time.Duration, multiplier float64) time.Duration {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     initial,
		RandomizationFactor: 0,
		Multiplier:          multiplier,
		MaxInterval:         max,
		MaxElapsedTime:      0,
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	b.Reset()
	d := initial
	for i := 0; i < attempt; i++ {
		d = b.NextBackOff()
		if d >= max {
			return max
		}
	}
	return d
}
