package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
)

// Retries owned by the runtime. A tool whose contract declares a retry policy
// (toolbus.RetryPolicy) does not send a failure the policy names to the model while
// attempts and the run's deadline remain. The attempt is recorded in the call's claim
// (abandoned, Retry, the failure appended to Retries) with a compare-and-set on the
// claim's revision, and the delivery is handed back with a delay (NakWithDelay: the
// backoff with jitter). The next delivery, on any executor of the tool, takes the claim
// over as it takes over an abandoned one and runs the call again with the same
// idempotency key; the final result carries every failed attempt (ToolResult.Retries),
// so the audit sees each one. A crash between attempts loses none of them: they are in
// the claim.

// retryLater hands a failed attempt back for another one when the tool's retry policy
// asks for it; it returns a *consume.DeferError then, nil when the result is final.
func (w *Worker) retryLater(ctx context.Context, d *delivery) error {
	if !d.ran || d.res.Status == toolbus.StatusSucceeded || d.res.Error == nil {
		return nil
	}
	t, ok := w.exec.Registry().Lookup(d.req.Call.Tool)
	if !ok || t.Retry == nil || !t.Retry.Retries(d.res.Error) {
		return nil
	}
	tried := len(d.own.claim.Retries) + 1 // attempts that finished, this one included
	if tried >= t.Retry.MaxAttempts {
		return nil
	}
	backoff := t.Retry.Backoff(tried)
	delay := backoff/2 + rand.N(backoff/2+1) // jitter: half to all of the backoff
	if dl := callDeadline(d.req, d.rs); !dl.IsZero() && time.Now().Add(delay).After(dl) {
		return nil // no time for another attempt: this failure is the result
	}
	if !d.lv.valid() {
		return errLeaseLost
	}
	c := d.own.claim
	c.Abandoned, c.Retry = true, true
	c.Retries = append(slices.Clone(c.Retries), toolbus.FailedAttempt{
		Attempt: c.Attempt, Status: d.res.Status, Error: *d.res.Error, DurationMS: d.res.DurationMS,
		Executor: w.cfg.Instance, At: time.Now().UTC(), RetryAfterMS: delay.Milliseconds()})
	err := w.retry(ctx, d.msg, d.log, "record the failed attempt", func() error {
		_, err := w.bus.Store().TakeOverClaim(ctx, d.queue, d.req.RunID, d.req.Step, d.req.Call.CallID, c, d.own.rev)
		if errors.Is(err, events.ErrConflict) {
			return nil // taken over already (or an earlier try of this write landed)
		}
		return err
	})
	if err != nil {
		return err
	}
	d.log().Info("call failed, retried by the tool's policy", "attempt", c.Attempt, "code", d.res.Code(),
		"retry_after", delay, "max_attempts", t.Retry.MaxAttempts)
	return &consume.DeferError{Delay: delay, Reason: fmt.Sprintf("attempt %d failed (%s): retried by the tool's policy", c.Attempt, d.res.Code())}
}

// callDeadline is the earlier of the call's and its run's deadlines (zero: none).
func callDeadline(req toolbus.ToolRequested, rs *toolbus.RunStarted) time.Time {
	deadline := req.Deadline
	if dl := rs.Limits.Deadline; !dl.IsZero() && (deadline.IsZero() || dl.Before(deadline)) {
		deadline = dl
	}
	return deadline
}
