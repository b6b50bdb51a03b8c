package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/internal/testutil"
)

func echoTool(name string) executor.Tool {
	return executor.Tool{Name: name, Description: "echo", ReadOnly: true,
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Func:        func(_ context.Context, args json.RawMessage) (any, error) { return args, nil }}
}

// TestSyncDuringCalls runs Sync (what an MCP server's list_changed triggers) over and
// over while the worker handles calls: under -race it fails if a call reads the set of
// served tools without the lock while Sync replaces it, and every call still gets its
// one result while Syncs talk to the bus.
func TestSyncDuringCalls(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{Memory: true})
	ctx := eventstest.Context(t, 2*time.Minute)
	reg := executor.NewRegistry()
	if err := reg.Register(echoTool("echo")); err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(bus, testutil.Must(executor.New(reg)), worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "sync", Concurrency: 8}})
	if err != nil {
		t.Fatal(err)
	}
	serveWorker(t, ctx, bus, w, "echo")
	const run, calls = "sync-race", 60
	startRun(t, ctx, bus, run)
	syncs := make(chan error, 1)
	syncCtx, stopSync := context.WithCancel(ctx)
	defer stopSync()
	go func() {
		var err error
		for i := 0; syncCtx.Err() == nil && err == nil; i++ {
			name := fmt.Sprintf("extra%d", i%3)
			if i%2 == 0 {
				err = reg.Register(echoTool(name))
			} else {
				reg.Unregister(name)
			}
			if err == nil {
				err = w.Sync(syncCtx)
			}
		}
		if syncCtx.Err() != nil {
			err = nil
		}
		syncs <- err
	}()
	for i := 0; i < calls; i++ {
		call := toolbus.ToolCall{CallID: fmt.Sprintf("c%d", i), Tool: "echo", Arguments: `{}`}
		if _, err := bus.PublishEvent(ctx, events.ToolRequestedEvent("test", toolbus.ToolRequested{
			RunID: run, Step: 0, CallIndex: i, CallCount: calls, Call: call}, true)); err != nil {
			t.Fatal(err)
		}
	}
	eventstest.Eventually(t, 60*time.Second, func() error {
		evs, err := runlog.Events(ctx, bus, run)
		if err != nil {
			return err
		}
		n := 0
		for _, e := range evs {
			if e.Meta.Type == events.TypeToolFinished {
				n++
			}
		}
		if n != calls {
			return fmt.Errorf("%d of %d results", n, calls)
		}
		return nil
	})
	stopSync()
	if err := <-syncs; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Sync: %v", err)
	}
}
