package e2e_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/planner"
)

// TestPrePlannedRunCallsNoModel: a run with RunStarted.Calls (how `toolbus mcp` runs a
// tools/call) runs those calls as step 0 through the executors, with the run's
// allowlist, and ends completed after step 1 without any model call.
func TestPrePlannedRunCallsNoModel(t *testing.T) {
	t.Parallel()
	model := planner.ModelFunc(func(context.Context, planner.Request) (planner.Response, error) {
		t.Error("the model was called for a pre-planned run")
		return planner.Response{}, planner.Permanent(errors.New("no model here"))
	})
	s := newStack(t, model)
	s.startAll()
	run := "pre-planned-1"
	err := s.bus.StartRun(s.ctx, events.Source("test", t.Name()), toolbus.RunStarted{
		RunID: run, Principal: toolbus.Principal{ID: "tester"}, AllowedTools: []string{"calculator"},
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "pre-planned"}},
		Limits:   toolbus.Limits{MaxSteps: 2, Deadline: time.Now().Add(time.Minute)},
		Calls: []toolbus.ToolCall{
			{CallID: "c1", Tool: "calculator", Arguments: `{"expression":"2^10"}`},
			{CallID: "c2", Tool: "lookup_incident", Arguments: `{"incident_id":"INC-404"}`}, // not allowed
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ended := s.waitEnd(run)
	if ended.Status != toolbus.RunCompleted || ended.StepsUsed != 2 {
		t.Fatalf("run ended %s after %d steps (%s %s), want completed after 2", ended.Status, ended.StepsUsed, ended.Code, ended.Reason)
	}
	got := map[string]toolbus.ToolResult{}
	for _, tf := range s.finished(run) {
		got[tf.CallID] = tf.ToolResult
	}
	if r := got["c1"]; r.Status != toolbus.StatusSucceeded || r.Content == "" {
		t.Errorf("c1 (calculator) = %s %q, want succeeded", r.Status, r.Content)
	}
	if r := got["c2"]; r.Status != toolbus.StatusRejected || r.Code() != toolbus.CodeNotAuthorized {
		t.Errorf("c2 (lookup_incident, not allowed) = %s %s, want rejected not_authorized", r.Status, r.Code())
	}
	evs := s.runEvents(run)
	if n := countType(evs, events.TypeToolRequested); n != 2 {
		t.Errorf("%d tool.requested events, want 2", n)
	}
	if n := countType(evs, events.TypeModelResponded); n != 2 {
		t.Errorf("%d model.responded events, want 2 (the recorded step 0 and the closing step 1)", n)
	}
	if s.seenReq != nil {
		s.seenReq.mu.Lock()
		n := len(s.seenReq.reqs)
		s.seenReq.mu.Unlock()
		if n != 0 {
			t.Errorf("the model got %d request(s)", n)
		}
	}
}
