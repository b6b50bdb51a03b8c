package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/executor/worker"
)

// The steps the tests of one worker's calls share: serve, start a run, wait for its
// result.

// serveWorker runs w until the test ends, and waits until tool's queue is bound.
func serveWorker(t *testing.T, ctx context.Context, bus *events.Bus, w *worker.Worker, tool string) {
	t.Helper()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	eventstest.Eventually(t, 30*time.Second, func() error {
		_, err := bus.QueueStream().Consumer(ctx, events.ToolConsumer(tool))
		return err
	})
}

// startRun starts run as principal "p" with one user message.
func startRun(t *testing.T, ctx context.Context, bus *events.Bus, run string) {
	t.Helper()
	if err := bus.StartRun(ctx, events.Source("test", "t"), toolbus.RunStarted{RunID: run, Model: "m",
		Principal: toolbus.Principal{ID: "p"}, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "x"}}}); err != nil {
		t.Fatal(err)
	}
}

// eventsWithResult polls run's events, within wait, until one is a tool.finished, and
// returns them.
func eventsWithResult(t *testing.T, ctx context.Context, bus *events.Bus, run string, wait time.Duration) []runlog.StoredEvent {
	t.Helper()
	var evs []runlog.StoredEvent
	eventstest.Eventually(t, wait, func() error {
		var err error
		if evs, err = runlog.Events(ctx, bus, run); err != nil {
			return err
		}
		for _, e := range evs {
			if e.Meta.Type == events.TypeToolFinished {
				return nil
			}
		}
		return fmt.Errorf("no result yet (%d events)", len(evs))
	})
	return evs
}
