package connect

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

// ErrConnectionClosed is the cause of a process's stop when its NATS connection closed
// for good: nats.go gives up on a server that refused the credentials twice in a row, a
// credential revoked with no new file to take instead (a rotated one, whose file was
// rewritten, is taken on the reconnection: userCredentials reads the file at every
// connection). Such a process cannot work again, so every role (executor, planner,
// injector) stops and the process exits non-zero with the reason, its /healthz failing
// meanwhile, as the TypeScript executor does; staying up would leave a process that
// looks alive and does nothing.
var ErrConnectionClosed = errors.New("the NATS connection closed for good")

// Failer is implemented by what makes /healthz fail with a reason (telemetry.Metrics).
type Failer interface{ Failed(reason string) }

// WatchClosed returns ctx, cancelled with an ErrConnectionClosed cause (prefixed with
// who) when nc closes for good with an error (nats.go gave up on it; a connection its
// owner closed is a shutdown), after telling f (when not nil) and calling report with
// that cause; stop ends the watch.
func WatchClosed(ctx context.Context, nc *nats.Conn, who string, f Failer, report func(error)) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	closed := nc.StatusChanged(nats.CLOSED)
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-closed:
		}
		last := nc.LastError()
		if last == nil || transient(last) {
			// Closed by its owner (a shutdown), not given up on: nats.go keeps the last
			// error of a connection that goes on (a refused publish, a slow consumer), so
			// only an error that closes a connection says that nats.go gave up on it.
			return
		}
		err := fmt.Errorf("%s: %w: %v (a revoked credential? give the process its new credentials file, TOOLBUS_NATS_CREDS)", who, ErrConnectionClosed, last)
		if f != nil {
			f.Failed(err.Error())
		}
		if report != nil {
			report(err)
		}
		cancel(err)
	}()
	return ctx, func() {
		close(done)
		nc.RemoveStatusListener(closed)
		cancel(nil)
	}
}

// transient reports whether err is one that nats.go records on a connection that goes
// on working (processTransientError, a slow consumer): never why it closed.
func transient(err error) bool {
	return errors.Is(err, nats.ErrPermissionViolation) || errors.Is(err, nats.ErrMaxSubscriptionsExceeded) ||
		errors.Is(err, nats.ErrSlowConsumer)
}
