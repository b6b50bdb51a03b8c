package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/internal/testutil"
)

// An executor takes over the claim of a call whose owner is gone, and the owner's
// result, sent before it was cut off, is stored just after the take-over: the new
// attempt does not run the tool, and marks its claim yielded so that the injector
// joins that late result instead of waiting for this attempt's.
func TestTakeOverYieldsToALateResult(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{Memory: true})
	ctx := eventstest.Context(t, time.Minute)
	var ran atomic.Int32
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "side", Description: "a side effect",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(context.Context, json.RawMessage) (any, error) {
			ran.Add(1)
			return "done again", nil
		}}); err != nil {
		t.Fatal(err)
	}
	const run = "yield"
	startRun(t, ctx, bus, run)
	// The first attempt's executor (no instance record: gone) claimed the call.
	if _, _, err := bus.Store().ClaimCall(ctx, "side", run, 0, "c1", store.Claim{Instance: "exec-a", Boot: "b1", Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	late := time.Now().Add(-time.Minute).UTC()
	var once sync.Once
	worker.SetTakeoverHook(func() {
		once.Do(func() {
			if _, err := bus.PublishEvent(ctx, events.ToolFinishedEvent(events.Source("executor", "exec-a"), toolbus.ToolFinished{
				RunID: run, Step: 0, CallIndex: 0, CallCount: 1, ToolResult: toolbus.ToolResult{CallID: "c1", Tool: "side",
					Status: toolbus.StatusSucceeded, Content: "done once", Attempt: 1, LeaseUntil: &late, Executor: "exec-a"}})); err != nil {
				t.Error(err)
			}
		})
	})
	w, err := worker.New(bus, testutil.Must(executor.New(reg)), worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "exec-b"}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done; worker.SetTakeoverHook(nil) })
	eventstest.Eventually(t, 30*time.Second, func() error {
		_, err := bus.QueueStream().Consumer(ctx, events.ToolConsumer("side"))
		return err
	})
	if _, err := bus.PublishEvent(ctx, events.ToolRequestedEvent("test", toolbus.ToolRequested{RunID: run, Step: 0, CallIndex: 0, CallCount: 1,
		Call: toolbus.ToolCall{CallID: "c1", Tool: "side", Arguments: `{}`}}, true)); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		c, _, err := bus.Store().CurrentClaim(ctx, "side", run, 0, "c1")
		if err != nil {
			return err
		}
		if c.Attempt != 2 || !c.Yielded || c.Instance != "exec-b" {
			return fmt.Errorf("claim %+v, want attempt 2 of exec-b, yielded", c)
		}
		return nil
	})
	// The call's message is settled, with no result of attempt 2 and no second run.
	eventstest.Eventually(t, 30*time.Second, func() error {
		cons, err := bus.QueueStream().Consumer(ctx, events.ToolConsumer("side"))
		if err != nil {
			return err
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if ci.NumPending != 0 || ci.NumAckPending != 0 {
			return fmt.Errorf("call not settled: %d pending, %d unacknowledged", ci.NumPending, ci.NumAckPending)
		}
		return nil
	})
	if n := ran.Load(); n != 0 {
		t.Errorf("the tool ran %d times after the take-over, want 0", n)
	}
	evs, err := runlog.Read(ctx, bus.EventStream(), events.SubjectRun(run))
	if err != nil {
		t.Fatal(err)
	}
	results := 0
	for _, ev := range evs {
		if ev.Meta.Type == events.TypeToolFinished {
			results++
		}
	}
	if results != 1 {
		t.Errorf("%d results stored, want only the late one", results)
	}
}
