package e2e_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/planner"
)

func TestScratchApproval(t *testing.T) {
	var ran atomic.Int64
	deploy := executor.Tool{Name: "deploy", Description: "deploys", InputSchema: objectSchema, NeedsApproval: true,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) { ran.Add(1); return map[string]string{"deployed": "yes"}, nil }}
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`), call("b", "deploy", `{}`), call("c", "calculator", `{"expression":"1+2"}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model, deploy)
	s.startAll()
	s.submit("ap-1", events.Limits{})
	ended := s.waitEnd("ap-1", events.RunWaitingForApproval)
	t.Logf("ended %+v", ended)
	_, err := s.bus.Publish(s.ctx, events.SubjectApproval("ap-1", true), events.Meta{ID: events.IDApproval("ap-1", "b", true), Type: events.TypeApprovalGranted, Source: "/test", RunID: "ap-1"},
		events.Approval{RunID: "ap-1", CallID: "b", Who: "me"})
	if err != nil {
		t.Fatal(err)
	}
	ended = s.waitEnd("ap-1", events.RunCompleted, events.RunFailed)
	t.Logf("ended %+v ran %d", ended, ran.Load())
	req, _ := s.seenReq.forStep("ap-1", 1)
	t.Logf("history %s", toolRoles(req.Messages))
	for _, m := range req.Messages { t.Logf("%+v", m) }
}
