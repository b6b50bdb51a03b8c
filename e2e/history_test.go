package e2e_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/planner"
)

// A 3 MB output is over NATS's max payload (1 MB): the event carries the bounded content and a
// reference, the object store keeps the whole output, the model reads the bounded content.
func TestHugeOutputKeptWhole(t *testing.T) {
	// Not parallel: it moves megabytes through the bus and is bound by the CPU, so it
	// gains nothing beside other tests and would stretch it past its deadlines.
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
	// Not parallel: it moves megabytes through the bus and is bound by the CPU, so it
	// gains nothing beside other tests and would stretch it past its deadlines.
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

// The model.requested of step 1 carries the joined results of step 0 (a failed call, a
// large output truncated for the model, arguments rejected by the input schema), and
// the planner, which recorded step 0 itself, plans step 1 from them: the model reads
// exactly the history the store holds (what a planner that reads the store builds).
func TestCarriedResultsAreTheStoresHistory(t *testing.T) {
	t.Parallel()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("c_fail", "fail", `{"code":"not_found","message":"no such thing"}`),
			call("c_big", "big_output", `{"bytes":200000}`),
			call("c_bad", "calculator", `{"nope":1}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model)
	s.startAll()
	s.submit("carry-1", toolbus.Limits{})
	if ended := s.waitEnd("carry-1"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("status %s (%s)", ended.Status, ended.Reason)
	}
	var carried []toolbus.ToolResult
	for _, ev := range s.runEvents("carry-1") {
		if ev.Meta.Type != events.TypeModelRequested || ev.Meta.Step != 1 {
			continue
		}
		var mr toolbus.ModelRequested
		if err := json.Unmarshal(ev.Data, &mr); err != nil {
			t.Fatal(err)
		}
		carried = mr.PrevResults
	}
	rec, _, err := s.bus.Store().Step(s.ctx, "carry-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(carried) != 3 || len(rec.Results) != 3 {
		t.Fatalf("step 1's request carried %d results, the store holds %d; want 3", len(carried), len(rec.Results))
	}
	for i, want := range []toolbus.Status{toolbus.StatusFailed, toolbus.StatusSucceeded, toolbus.StatusRejected} {
		if carried[i].Status != want {
			t.Errorf("result %d: %s, want %s", i, carried[i].Status, want)
		}
	}
	if carried[1].Truncated == nil || len(carried[1].Output) != 0 {
		t.Errorf("the large result: truncated %+v, output %d bytes; want truncated and no output", carried[1].Truncated, len(carried[1].Output))
	}
	for i, r := range rec.Results {
		if got, want := mustJSON(t, carried[i]), mustJSON(t, *r); string(got) != string(want) {
			t.Errorf("result %d carried:\n%s\nstored:\n%s", i, got, want)
		}
	}
	want, err := runlog.History(s.ctx, s.bus, "carry-1", 1)
	if err != nil {
		t.Fatal(err)
	}
	req, ok := s.seenReq.forStep("carry-1", 1)
	if !ok {
		t.Fatal("the model was not asked for step 1")
	}
	if got, want := mustJSON(t, req.Messages), mustJSON(t, want); string(got) != string(want) {
		t.Errorf("the model read for step 1:\n%s\nthe store's history is:\n%s", got, want)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
