package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

// ErrConnectionClosed is returned by Run when the NATS connection closed for good while
// the worker served: nats.go gives up on a server that refused the credentials twice in a
// row, a credential revoked with no new file to take instead (a rotated one, whose file
// was rewritten, is taken on the reconnection: nats.UserCredentials reads the file at
// every connection). Such a process cannot work again, so it stops and exits non-zero
// with the reason, its /healthz failing meanwhile, as the TypeScript executor does;
// staying up would leave a process that looks alive and serves nothing.
var ErrConnectionClosed = errors.New("the NATS connection closed for good")

// failer is implemented by Metrics that make /healthz fail with a reason
// (telemetry.Metrics).
type failer interface{ Failed(reason string) }

// watchConnection returns ctx, cancelled with an ErrConnectionClosed cause when the bus's
// connection closes for good with an error (nats.go gave up on it; a connection its owner
// closed is a shutdown); stop ends the watch.
func (w *Worker) watchConnection(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	nc := w.bus.Conn()
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
		if last == nil {
			return // closed by its owner (a shutdown), not given up on
		}
		err := fmt.Errorf("executor: %w: %v (a revoked credential? give the executor its new credentials file, TOOLBUS_NATS_CREDS)", ErrConnectionClosed, last)
		if f, ok := w.cfg.Metrics.(failer); ok {
			f.Failed(err.Error())
		}
		w.log.Error("executor stopping: it cannot work", "error", err)
		cancel(err)
	}()
	return ctx, func() {
		close(done)
		nc.RemoveStatusListener(closed)
		cancel(nil)
	}
}
