// Package retry runs an operation again after a failure, with exponential backoff,
// until it succeeds, the caller's context ends or the policy's bounds are reached. It is
// the one retry loop of toolbus: the workers' bus operations, consumer creation, model
// calls and MCP reconnections all use it, each with its own bounds.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy bounds the attempts of one operation. The zero Policy retries forever with no
// wait; set at least Base.
type Policy struct {
	// Attempts bounds the attempts, the first included (0: no bound).
	Attempts int
	// For bounds the time spent retrying, counted from the first failure: no attempt
	// starts after it (0: no bound).
	For time.Duration
	// Base is the wait after the first failure; it doubles after each one.
	Base time.Duration
	// Max caps one wait (0: Base·2^n grows unbounded, saturating).
	Max time.Duration
	// Jitter draws each wait uniformly between half and all of the backoff, so that
	// callers failing together do not retry together.
	Jitter bool
	// OnError, if set, sees each failure (attempt is 1-based) with the wait planned
	// before the next attempt. It returns the wait to use instead (for example a
	// server's Retry-After), or a non-nil error to stop with that error (a failure that
	// retrying cannot fix, or the last one wrapped). It runs before the bounds are
	// checked, so it also sees the last failure.
	OnError func(attempt int, err error, wait time.Duration) (time.Duration, error)
	// Sleep waits d or until ctx ends; nil is Sleep. Tests replace it to observe waits.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Backoff is the wait after the given failed attempt (1-based): Base·2^(attempt-1),
// capped at Max, drawn from its upper half when Jitter is set.
func (p Policy) Backoff(attempt int) time.Duration {
	d := p.Base
	for i := 1; i < attempt && (p.Max <= 0 || d < p.Max); i++ {
		if d > (1<<62)/2 {
			break // saturate rather than overflow
		}
		d *= 2
	}
	if p.Max > 0 && d > p.Max {
		d = p.Max
	}
	if p.Jitter && d > 0 {
		half := d / 2
		d = half + rand.N(d-half+1)
	}
	return d
}

// Do calls op until it returns nil, OnError returns an error, the attempts or the
// retry time run out, or ctx ends. It returns nil, OnError's error, or op's last error
// (not ctx's: the caller learns what failed, and can read ctx itself).
func Do(ctx context.Context, p Policy, op func(ctx context.Context) error) error {
	sleep := p.Sleep
	if sleep == nil {
		sleep = Sleep
	}
	var firstFailure time.Time
	for attempt := 1; ; attempt++ {
		err := op(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		if attempt == 1 {
			firstFailure = time.Now()
		}
		wait := p.Backoff(attempt)
		if p.OnError != nil {
			var stop error
			if wait, stop = p.OnError(attempt, err, wait); stop != nil {
				return stop
			}
		}
		if p.Attempts > 0 && attempt >= p.Attempts {
			return err
		}
		if p.For > 0 && time.Since(firstFailure) >= p.For {
			return err
		}
		if sleep(ctx, wait) != nil {
			return err
		}
	}
}

// Sleep waits d or until ctx ends, returning ctx's error in that case.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
