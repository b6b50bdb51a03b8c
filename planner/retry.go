package planner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/toolbus/toolbus/internal/retry"
)

// RetryPolicy is how a provider adapter retries a call that failed with a retryable
// ProviderError (429, 408, 5xx, a transport failure or timeout, an unreadable answer).
// The SDKs' own retries are switched off, so this policy is the only one in force.
//
// The wait before attempt n+1 is the provider's Retry-After (or Retry-After-Ms) when it
// sent one, else an exponential backoff with jitter: between half and all of
// BaseDelay·2^(n-1), capped at MaxDelay. The adapter stops early, returning the last
// error as a transient one (the planner then redelivers the step later), when the
// provider asks for a wait longer than MaxDelay or when the wait would outlast the
// caller's deadline. Waiting ends as soon as the context does.
type RetryPolicy struct {
	// MaxAttempts bounds the attempts of one call, the first included (default 4; 1
	// disables retries).
	MaxAttempts int
	// BaseDelay is the first backoff (default 500ms).
	BaseDelay time.Duration
	// MaxDelay caps one wait, backoff or Retry-After (default 30s).
	MaxDelay time.Duration
	// AttemptTimeout bounds one attempt; an attempt that runs out is retried (default 0:
	// only the caller's context bounds the call).
	AttemptTimeout time.Duration

	// Sleep waits d or until ctx ends (nil: a timer); tests set it to observe the waits
	// instead of sleeping.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Default values of RetryPolicy.
const (
	DefaultMaxAttempts = 4
	DefaultBaseDelay   = 500 * time.Millisecond
	DefaultMaxDelay    = 30 * time.Second
)

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = DefaultBaseDelay
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = DefaultMaxDelay
	}
	if p.MaxDelay < p.BaseDelay {
		p.MaxDelay = p.BaseDelay
	}
	return p
}

// backoff is the wait after the given failed attempt (1-based), with jitter.
func (p RetryPolicy) backoff(attempt int) time.Duration { return p.retry().Backoff(attempt) }

func (p RetryPolicy) retry() retry.Policy {
	return retry.Policy{Attempts: p.MaxAttempts, Base: p.BaseDelay, Max: p.MaxDelay, Jitter: true, Sleep: p.Sleep}
}

// Do runs call until it succeeds, fails with an error that is not retryable, or the
// policy gives up. log may be nil.
func (p RetryPolicy) Do(ctx context.Context, log *slog.Logger, call func(ctx context.Context) error) error {
	p = p.withDefaults()
	rp := p.retry()
	rp.OnError = func(attempt int, err error, wait time.Duration) (time.Duration, error) {
		var pe *ProviderError
		if !errors.As(err, &pe) || errors.Is(err, ErrPermanent) {
			return 0, err
		}
		if !pe.Retryable {
			return 0, Permanent(err) // the provider refused the request: fail the run with its message
		}
		if attempt >= p.MaxAttempts {
			return 0, fmt.Errorf("giving up after %d attempts: %w", attempt, err)
		}
		if pe.RetryAfter > 0 {
			if pe.RetryAfter > p.MaxDelay {
				return 0, fmt.Errorf("provider asks to retry after %s, more than the %s cap: %w",
					pe.RetryAfter.Round(time.Millisecond), p.MaxDelay, err)
			}
			wait = pe.RetryAfter
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return 0, fmt.Errorf("no time left for another attempt: %w", err)
		}
		if log != nil {
			log.Warn("model call failed, retrying", "provider", pe.Provider, "status", pe.Status,
				"attempt", attempt, "wait", wait, "error", err)
		}
		return wait, nil
	}
	// The caller's context ending stops the retries with the call's error: the planner
	// decides what happens to the step.
	return retry.Do(ctx, rp, func(ctx context.Context) error {
		if p.AttemptTimeout <= 0 {
			return call(ctx)
		}
		actx, cancel := context.WithTimeout(ctx, p.AttemptTimeout)
		defer cancel()
		return call(actx)
	})
}
