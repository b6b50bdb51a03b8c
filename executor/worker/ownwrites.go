package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/internal/retry"
)

// writeLater runs op, a write of the worker's own (its instance record, its tools'
// contracts), again while it fails in a way that passes by itself, for up to
// busRetryFor: nothing answers (in the accounts layout a team's writes go through the
// core's write service, which no injector may be serving yet: a fleet started in any
// order must come up), a timeout, the team over its bytes per second (429: another
// instance of the team may be spending the budget) or a forward that failed (503). Any
// other failure (a permission, a refused form, a contract that differs) returns at
// once: waiting cannot fix it.
func (w *Worker) writeLater(ctx context.Context, what string, op func() error) error {
	return retry.Do(ctx, retry.Policy{For: busRetryFor, Base: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: true,
		OnError: func(n int, err error, wait time.Duration) (time.Duration, error) {
			if !passing(err) {
				return 0, err
			}
			w.log.Warn("bus write failed, retrying (in a team account: is an injector, which serves the core's write service, running?)",
				"op", what, "retry", n, "error", err)
			return wait, nil
		}}, func(context.Context) error { return op() })
}

// passing reports whether err is a failure of a write that may pass when tried again.
func passing(err error) bool {
	return events.WritePassesLater(err) || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)
}
