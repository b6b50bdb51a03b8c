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

// startupWaitFor bounds how long a starting worker waits for the bus to take its first
// writes (its instance record, its tools' contracts) before it gives up.
const startupWaitFor = busRetryFor

// startupWrite runs one of a starting worker's writes, again while it fails in a way
// that passes by itself: nothing answers (in the accounts layout a team's writes go
// through the core's write service, which no injector may be serving yet: a fleet
// started in any order must come up), a timeout, a tenant over its bytes per second
// (429) or a forward that failed (503). Any other failure (a permission, a refused form,
// a contract that differs) is returned at once: waiting cannot fix it.
func (w *Worker) startupWrite(ctx context.Context, what string, op func() error) error {
	return retry.Do(ctx, retry.Policy{For: startupWaitFor, Base: 200 * time.Millisecond, Max: 2 * time.Second, Jitter: true,
		OnError: func(n int, err error, wait time.Duration) (time.Duration, error) {
			if !passing(err) {
				return 0, err
			}
			w.log.Warn("bus write at start-up failed, retrying (in a team or client account: is an injector, which serves the core's write service, running?)",
				"op", what, "retry", n, "error", err)
			return wait, nil
		}}, func(context.Context) error { return op() })
}

// passing reports whether err is a failure of a write that may pass when tried again.
func passing(err error) bool {
	return events.WritePassesLater(err) || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)
}
