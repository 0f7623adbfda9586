// Package retry is courier's one "try again later" loop: connecting to NATS,
// setting up streams, storing a dead letter, probing. It is a thin layer on
// cenkalti/backoff/v4 so that every caller shares one schedule shape and one
// cancellation rule: when ctx ends, Do returns ctx.Err(), never nil.
package retry

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Policy is a retry schedule: waits grow from Initial by Multiplier up to Max,
// each jittered by ±Jitter (a fraction). The zero value waits 250ms, doubling
// up to 15s, with ±20% jitter.
type Policy struct {
	Initial    time.Duration
	Max        time.Duration
	Multiplier float64
	// Jitter is the randomization factor in [0, 1); negative means none.
	Jitter float64
}

func (p Policy) backOff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 250 * time.Millisecond
	b.MaxInterval = 15 * time.Second
	b.Multiplier = 2
	b.RandomizationFactor = 0.2
	b.MaxElapsedTime = 0 // retry until ctx ends or the error is permanent
	if p.Initial > 0 {
		b.InitialInterval = p.Initial
	}
	if p.Max > 0 {
		b.MaxInterval = p.Max
	}
	if p.Multiplier >= 1 {
		b.Multiplier = p.Multiplier
	}
	if p.Jitter > 0 && p.Jitter < 1 {
		b.RandomizationFactor = p.Jitter
	} else if p.Jitter < 0 {
		b.RandomizationFactor = 0
	}
	b.Reset()
	return b
}

// Permanent marks err as one retrying cannot fix: Do returns it (unwrapped)
// at once.
func Permanent(err error) error { return backoff.Permanent(err) }

// Do runs op until it returns nil, a Permanent error, or ctx ends. notify,
// if not nil, is called before each wait with op's error and the wait. Do
// returns nil on success, the permanent error unwrapped, or ctx.Err() once
// ctx has ended (even if op's last error was something else). A fresh
// schedule is built per call: Do is safe for concurrent use.
func Do(ctx context.Context, p Policy, op func(ctx context.Context) error, notify func(err error, wait time.Duration)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := backoff.RetryNotify(func() error { return op(ctx) }, backoff.WithContext(p.backOff(), ctx), notify)
	if cerr := ctx.Err(); cerr != nil {
		var perm *backoff.PermanentError
		if err == nil || errors.As(err, &perm) {
			return err
		}
		return cerr
	}
	return err
}
