package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events/store"
)

// SetTakeoverHook sets the hook that runs right after a claim is taken over (nil
// removes it). Set it before the worker runs and remove it after it stopped.
func SetTakeoverHook(f func()) { takeoverHook = f }

// RetryCallWrite runs op, a write of the call of msg, through the worker's in-place
// retry of a call's bus writes.
func (w *Worker) RetryCallWrite(ctx context.Context, msg jetstream.Msg, op func() error) error {
	return w.retry(ctx, msg, func() *slog.Logger { return w.log }, "test write", op)
}

// Renew writes the worker's instance record as its lease renewal does, sent again for up
// to within while the write service refuses it over the team's quota.
func (w *Worker) Renew(ctx context.Context, in store.Instance, within time.Duration) error {
	_, _, err := w.renew(ctx, &in, within)
	return err
}

// SetReachEvery sets the period of the reach check until the test ends.
func SetReachEvery(t interface{ Cleanup(func()) }, d time.Duration) {
	old := reachEvery
	reachEvery = d
	t.Cleanup(func() { reachEvery = old })
}
