package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/internal/testutil"
)

// TestProgressPublishedThrottled: a running call's reports reach the bus as
// tool.progress events of its attempt, fewer than the reports (throttled), in sequence,
// the last report published before the call's one tool.finished.
func TestProgressPublishedThrottled(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{Memory: true})
	ctx := eventstest.Context(t, 2*time.Minute)
	const bursts, perBurst = 3, 100
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "crawl", Description: "reports a lot", InputSchema: json.RawMessage(`{"type":"object"}`),
		Timeout: time.Minute, HeartbeatTimeout: 30 * time.Second,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			n := 0
			for b := 0; b < bursts; b++ {
				for i := 0; i < perBurst; i++ {
					n++
					if err := executor.Progress(ctx, float64(n), bursts*perBurst+1, fmt.Sprintf("page %d", n)); err != nil {
						return nil, err
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			return "done", executor.Progress(ctx, bursts*perBurst+1, bursts*perBurst+1, "last page")
		}}); err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(bus, testutil.Must(executor.New(reg)), worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "prog"}, ProgressInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	serveWorker(t, ctx, bus, w, "crawl")
	const run = "progress-1"
	startRun(t, ctx, bus, run)
	if _, err := bus.PublishEvent(ctx, events.ToolRequestedEvent("test", toolbus.ToolRequested{
		RunID: run, Step: 0, CallIndex: 0, CallCount: 1, Call: toolbus.ToolCall{CallID: "c0", Tool: "crawl", Arguments: `{}`}}, true)); err != nil {
		t.Fatal(err)
	}
	evs := eventsWithResult(t, ctx, bus, run, 60*time.Second)
	var (
		progress []toolbus.ToolProgress
		finished = false
	)
	for _, e := range evs {
		switch e.Meta.Type {
		case events.TypeToolProgress:
			if finished {
				t.Fatal("a tool.progress after the call's tool.finished")
			}
			var tp toolbus.ToolProgress
			if err := json.Unmarshal(e.Data, &tp); err != nil {
				t.Fatal(err)
			}
			if n := len(progress); n > 0 && tp.Seq <= progress[n-1].Seq {
				t.Fatalf("report seq %d after %d", tp.Seq, progress[n-1].Seq)
			}
			progress = append(progress, tp)
		case events.TypeToolFinished:
			finished = true
		}
	}
	if len(progress) == 0 || len(progress) >= bursts*perBurst {
		t.Fatalf("%d tool.progress events for %d reports: want some, throttled", len(progress), bursts*perBurst+1)
	}
	last := progress[len(progress)-1]
	if last.Message != "last page" || last.Seq != bursts*perBurst+1 || last.CallID != "c0" || last.Attempt != 1 || last.Tool != "crawl" {
		t.Fatalf("last tool.progress %+v: want the last report (seq %d) of attempt 1", last, bursts*perBurst+1)
	}
}
