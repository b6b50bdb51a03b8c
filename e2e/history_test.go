package e2e_test

import (
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
)

// A 3 MB output is over NATS's max payload (1 MB): the event carries the bounded content and a
// reference, the object store keeps the whole output, the model reads the bounded content.
func TestHugeOutputKeptWhole(t *testing.T) {
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("big", "big_output", `{"bytes":3145728}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model)
	s.startAll()
	s.submit("huge-1", toolbus.Limits{})
	if ended := s.waitEnd("huge-1"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("status %s (%s)", ended.Status, ended.Reason)
	}
	res := s.finished("huge-1")
	if len(res) != 1 {
		t.Fatalf("%d results", len(res))
	}
	r := res[0].ToolResult
	if r.Status != toolbus.StatusSucceeded || r.Truncated == nil || r.Truncated.Ref == "" || len(r.Output) != 0 {
		t.Fatalf("result: status %s truncated %+v output %d bytes", r.Status, r.Truncated, len(r.Output))
	}
	if r.Truncated.OriginalBytes < 3<<20 || len(r.Content) > 16384 {
		t.Fatalf("bounds: original %d, content %d", r.Truncated.OriginalBytes, len(r.Content))
	}
	whole, err := s.bus.Store().Output(s.ctx, r.Truncated.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if len(whole) < 3<<20 || !strings.HasPrefix(string(whole), `{"data":"xxx`) {
		t.Fatalf("kept output: %d bytes, starts %.20q", len(whole), whole)
	}
	req, _ := s.seenReq.forStep("huge-1", 1)
	if got := req.Messages[len(req.Messages)-1]; got.Role != toolbus.RoleTool || len(got.Content) > 16384 || got.Content != r.Content {
		t.Fatalf("the model read %d bytes of role %s", len(got.Content), got.Role)
	}
}

// 50 steps with 5 MB of tool output in total: the history is read from the store, never
// re-sent whole, so no event grows with the run.
func TestLongRunWithLargeHistory(t *testing.T) {
	const steps = 50
	script := &planner.Script{}
	for i := 0; i < steps-1; i++ {
		script.Steps = append(script.Steps, planner.Calls(call("call_0", "big_output", `{"bytes":107000}`)))
	}
	script.Steps = append(script.Steps, func(req planner.Request) planner.Response {
		tools := 0
		for _, m := range req.Messages {
			if m.Role == toolbus.RoleTool {
				tools++
			}
		}
		return planner.Answer(strings.Repeat("t", tools))(req)
	})
	s := newStack(t, script)
	s.startAll()
	s.submit("long-1", toolbus.Limits{MaxSteps: steps})
	ended := s.waitEnd("long-1")
	if ended.Status != toolbus.RunCompleted || ended.StepsUsed != steps {
		t.Fatalf("status %s after %d steps (%s)", ended.Status, ended.StepsUsed, ended.Reason)
	}
	if len(ended.Answer) != steps-1 {
		t.Fatalf("the last step saw %d tool messages, want %d", len(ended.Answer), steps-1)
	}
	total := 0
	for _, tf := range s.finished("long-1") {
		if tf.ToolResult.Truncated != nil {
			total += tf.ToolResult.Truncated.OriginalBytes
		} else {
			total += len(tf.ToolResult.Output)
		}
	}
	if total < 5<<20-1<<16 {
		t.Fatalf("only %d bytes of output in total", total)
	}
}
