package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/testutil"
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

// `toolbus call` says what its waiting call waits for, from what the tool's executor
// recorded: an executor running it (its last report), then its question, with the
// exact `toolbus answer` command that moves it on (which, filled in, answers it).
func TestCallSaysWhatItWaitsFor(t *testing.T) {
	old := waitHint
	waitHint = 200 * time.Millisecond
	t.Cleanup(func() { waitHint = old })
	gate := make(chan struct{})
	schema := json.RawMessage(`{"type":"object","properties":{"account":{"type":"string","enum":["checking","savings"]}},"required":["account"]}`)
	payout := executor.Tool{
		Name: "payout", Description: "reports, waits, then asks which account to pay from",
		InputSchema: json.RawMessage(`{"type":"object"}`), Timeout: 10 * time.Minute,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			_ = executor.Progress(ctx, 1, 2, "checking the balance")
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			a, err := executor.Ask(ctx, "Which account?", schema)
			if err != nil {
				return nil, err
			}
			return map[string]any{"paid_from": a.Content}, nil
		},
	}
	p := startOpsPipeline(t, nil, payout)
	var errOut testutil.Buffer
	type exit struct {
		code int
		out  string
	}
	done := make(chan exit, 1)
	go func() {
		var out bytes.Buffer
		code := run(p.ctx, []string{"call", "--id", "call-payout", "payout"}, &out, &errOut)
		done <- exit{code, out.String()}
	}()
	waitFor := func(want string) {
		t.Helper()
		eventstest.Eventually(t, time.Minute, func() error {
			if !strings.Contains(errOut.String(), want) {
				return fmt.Errorf("stderr lacks %q:\n%s", want, errOut.String())
			}
			return nil
		})
	}
	waitFor("(waiting for call_0 payout, which an executor is running (last report: progress 1/2 (50%): checking the balance))")
	close(gate)
	const answer = `toolbus answer call-payout call_0 '{"account":<"checking"|"savings">}' (or --decline)`
	waitFor(`(waiting for an answer to the question of call_0 payout: "Which account?"; answer it: ` + answer + ")")

	// The command as printed, its placeholder filled in, answers the question.
	code, out, stderr := p.toolbus("answer", "call-payout", "call_0", `{"account":"savings"}`)
	wantCode(t, "the printed answer command", code, 0, out, stderr)
	select {
	case e := <-done:
		wantCode(t, "toolbus call payout", e.code, 0, e.out, errOut.String())
		wantContains(t, "toolbus call payout", e.out, `"account": "savings"`)
	case <-time.After(time.Minute):
		t.Fatalf("toolbus call did not return once answered:\n%s", errOut.String())
	}
}
