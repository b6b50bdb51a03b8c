package worker

import (
	"context"

	"github.com/toolbus/toolbus/connect"
)

// ErrConnectionClosed is returned by Run when the NATS connection closed for good while
// the worker served (connect.ErrConnectionClosed: the rule every role follows).
var ErrConnectionClosed = connect.ErrConnectionClosed

// watchConnection returns ctx, cancelled with an ErrConnectionClosed cause when the bus's
// connection closes for good (connect.WatchClosed), /healthz failing with the reason
// when the Metrics can say it; stop ends the watch.
func (w *Worker) watchConnection(ctx context.Context) (context.Context, func()) {
	f, _ := w.cfg.Metrics.(connect.Failer)
	return connect.WatchClosed(ctx, w.bus.Conn(), "executor", f, func(err error) {
		w.log.Error("executor stopping: it cannot work", "error", err)
	})
}
