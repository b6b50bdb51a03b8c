package worker_test

import (
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/planner"
)

// TestFullOutputsBucketStallsNoCall: with the outputs bucket bounded to 400 KiB, a first
// large output (300 KB, over the 256 KiB kept inline) is kept and its result names it; a
// second, another principal's, no longer fits: its call is not retried until its lease
// runs out but answers at once, with its bounded content and no ref, and its run
// completes.
func TestFullOutputsBucketStallsNoCall(t *testing.T) {
	big := func() *planner.Script {
		return &planner.Script{Steps: []func(planner.Request) planner.Response{
			planner.Calls(toolbus.ToolCall{CallID: "g", Tool: "big_output", Arguments: `{"bytes":300000}`}), planner.Answer("big")}}
	}
	p := testpipe.StartWith(t, 3*time.Minute, testpipe.ScriptByRun(map[string]*planner.Script{"o-1": big(), "o-2": big()}, nil),
		testpipe.Options{Bus: events.Config{OutputsMaxBytes: 400 << 10}})
	result := func(run string) *toolbus.ToolResult {
		t.Helper()
		evs, err := runlog.Events(p.Ctx, p.Bus, run)
		if err != nil {
			t.Fatal(err)
		}
		rep := audit.Analyze(run, evs)
		if len(rep.Calls) != 1 || rep.Calls[0].Result == nil {
			t.Fatalf("run %s: calls %+v", run, rep.Calls)
		}
		return rep.Calls[0].Result
	}
	p.SubmitAs("o-1", "alice", "big", toolbus.Limits{})
	p.WaitStatus("o-1", toolbus.RunCompleted)
	if r := result("o-1"); r.Status != toolbus.StatusSucceeded || r.Truncated == nil || r.Truncated.Ref == "" {
		t.Fatalf("o-1's result: %+v, want its output kept with a ref", r)
	}
	p.SubmitAs("o-2", "bob", "big", toolbus.Limits{})
	p.WaitStatus("o-2", toolbus.RunCompleted)
	r := result("o-2")
	if r.Status != toolbus.StatusSucceeded || r.Truncated == nil || r.Truncated.Ref != "" || len(r.Output) != 0 || r.Content == "" || r.Attempt != 1 {
		t.Fatalf("o-2's result: %+v, want succeeded on its first attempt, content, no output, no ref", r)
	}
}
