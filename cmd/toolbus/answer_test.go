package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/planner"
)

// A tool asks its run's caller a question mid-call (executor.Ask); `toolbus answer`
// refuses an answer its schema does not accept and a call that asked nothing, then
// answers as the run's principal: the tool reads the answer and the run completes with
// it; a second answer is refused.
func TestAnswerCommand(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"account":{"type":"string","enum":["checking","savings"]}},"required":["account"]}`)
	pick := executor.Tool{
		Name: "pick_account", Description: "asks which account to use",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			a, err := executor.Ask(ctx, "Which account?", schema)
			if err != nil {
				return nil, err
			}
			return map[string]any{"action": a.Action, "answer": a.Content, "by": a.Who}, nil
		},
	}
	p := startOpsPipeline(t, map[string]*planner.Script{
		"ask-1": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(opsCall("p", "pick_account", `{}`)),
			planner.Answer("done"),
		}},
	}, pick)
	p.submit("ask-1", toolbus.Limits{})
	p.waitEvent("ask-1", events.TypeToolQuestion)

	code, out, errOut := p.toolbus("answer", "ask-1", "p", `{"account":"brokerage"}`, "--who", "tester")
	wantCode(t, "an answer the schema refuses", code, 1, out, errOut)
	wantContains(t, "an answer the schema refuses", errOut, "does not match the question's schema")
	code, out, errOut = p.toolbus("answer", "ask-1", "nope", `{"account":"savings"}`, "--who", "tester")
	wantCode(t, "a call that asked nothing", code, 1, out, errOut)
	wantContains(t, "a call that asked nothing", errOut, "call nope of run ask-1 asked no question")
	code, out, errOut = p.toolbus("answer", "ask-1", "p")
	wantCode(t, "no answer", code, 2, out, errOut)

	code, out, errOut = p.toolbus("answer", "ask-1", "p", `{"account":"savings"}`, "--who", "tester")
	wantCode(t, "answer", code, 0, out, errOut)
	wantContains(t, "answer", out, `answered the question of call p pick_account of run ask-1 ("Which account?"), by tester`)
	p.waitStatus("ask-1", toolbus.RunCompleted)
	res, _, err := p.Bus.Store().Step(p.Ctx, "ask-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Results[0]; r == nil || r.Status != toolbus.StatusSucceeded || !strings.Contains(r.Content, `"account":"savings"`) {
		t.Fatalf("the tool's result does not carry the answer: %+v", r)
	}
	code, out, errOut = p.toolbus("answer", "ask-1", "p", `{"account":"checking"}`, "--who", "tester")
	wantCode(t, "a second answer", code, 1, out, errOut)
}
