package injector_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
)

// TestQuotaRefusesOneTenantNotTheOthers: with a quota of 2 runs in flight and 4 KiB of
// run.started per principal, mallory's third run while two of hers hold a tool, and her
// oversized run, end failed with code quota_exceeded and a reason naming the bound,
// without a step; alice's run, started while mallory is at her bound, completes. Once
// mallory's runs ended, her next run is admitted and completes.
func TestQuotaRefusesOneTenantNotTheOthers(t *testing.T) {
	release := make(chan struct{})
	hold := executor.Tool{Name: "hold", Description: "holds until released", ReadOnly: true,
		InputSchema: json.RawMessage(`{"type":"object"}`), Timeout: 2 * time.Minute,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			select {
			case <-release:
				return "released", nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}}
	holding := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(toolbus.ToolCall{CallID: "h", Tool: "hold", Arguments: `{}`}), planner.Answer("held")}}
	answering := func() *planner.Script {
		return &planner.Script{Steps: []func(planner.Request) planner.Response{
			planner.Calls(toolbus.ToolCall{CallID: "c", Tool: "calculator", Arguments: `{"expression":"1+1"}`}), planner.Answer("2")}}
	}
	scripts := map[string]*planner.Script{"m-1": holding, "m-2": holding, "m-3": answering(), "m-big": answering(),
		"a-1": answering(), "m-4": answering()}
	quota := injector.Quota{MaxRunsInFlight: 2, MaxStartBytes: 4096}
	p := testpipe.StartWith(t, 3*time.Minute, testpipe.ScriptByRun(scripts, nil), testpipe.Options{Quota: quota}, hold)
	ended := func(run string) toolbus.RunEnded {
		t.Helper()
		st, _, err := p.Bus.Store().RunState(p.Ctx, run)
		if err != nil || st.Ended == nil {
			t.Fatalf("run %s: %v %+v", run, err, st)
		}
		return *st.Ended
	}
	wantQuota := func(run, says string) {
		t.Helper()
		p.WaitStatus(run, toolbus.RunFailed)
		if e := ended(run); e.Code != toolbus.CodeQuotaExceeded || !strings.Contains(e.Reason, says) || e.StepsUsed != 0 {
			t.Fatalf("run %s ended %+v, want quota_exceeded saying %q, no step", run, e, says)
		}
	}

	p.SubmitAs("m-1", "mallory", "hold", toolbus.Limits{})
	p.SubmitAs("m-2", "mallory", "hold", toolbus.Limits{})
	p.WaitEvent("m-1", "toolbus.tool.requested")
	p.WaitEvent("m-2", "toolbus.tool.requested")
	p.SubmitAs("m-3", "mallory", "one more", toolbus.Limits{})
	wantQuota("m-3", "principal mallory has 2 runs in flight")
	p.SubmitAs("m-big", "mallory", strings.Repeat("x", 8192), toolbus.Limits{})
	wantQuota("m-big", "over the bound of 4096 (TOOLBUS_MAX_START_BYTES)")

	p.SubmitAs("a-1", "alice", "add", toolbus.Limits{})
	p.WaitStatus("a-1", toolbus.RunCompleted)

	close(release)
	p.WaitStatus("m-1", toolbus.RunCompleted)
	p.WaitStatus("m-2", toolbus.RunCompleted)
	p.SubmitAs("m-4", "mallory", "add", toolbus.Limits{})
	p.WaitStatus("m-4", toolbus.RunCompleted)
}
