package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/mcpserver"
)

// hostTool asks, at once, its caller's user a name, the host's model a greeting and
// the host's roots, and says what came back.
func hostTool(name string) executor.Tool {
	return executor.Tool{Name: name, Description: "Asks the host three things at once.", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			as, err := executor.AskAll(ctx,
				executor.Question{Key: "user_name", Message: "What is your name?", Schema: json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`)},
				executor.SamplingQuestion("greeting", &mcp.CreateMessageParams{MaxTokens: 50, Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "Generate a greeting"}}}}),
				executor.RootsQuestion("client_roots"))
			if err != nil {
				return nil, err
			}
			var out []string
			for _, a := range as {
				out = append(out, fmt.Sprintf("%s %s %s", a.Action, a.Content, a.Reason))
			}
			return strings.Join(out, "; "), nil
		}}
}

// hostCall is a 2026-07-28 tools/call of tool from a host that declared caps; state and
// responses make it the retry of an input_required result.
func hostCall(tool string, caps map[string]any, state string, responses map[string]any) map[string]any {
	p := map[string]any{"name": tool, "arguments": map[string]any{}, "_meta": map[string]any{
		mcp.MetaKeyProtocolVersion: mcpserver.Protocol2026, mcp.MetaKeyClientCapabilities: caps,
	}}
	if state != "" {
		p["requestState"], p["inputResponses"] = state, responses
	}
	return p
}

// TestMCPToolAsksTheHost: a tool asks its host's user (elicitation), its model
// (sampling) and its roots at once (executor.AskAll), through the bus: a 2026-07-28 host
// gets one input_required result with the three input requests, its answers resume the
// call; a tampered requestState is refused and answers nothing, a replayed one is
// refused as used (the control, carol's retry, completes the call). A host that
// declared only sampling is asked only the greeting (the others are cancelled with the
// reason); one that declared none of a lone sampling question's capability gets -32021
// naming sampling.
func TestMCPToolAsksTheHost(t *testing.T) {
	sampleOnly := executor.Tool{Name: "sample_only", Description: "Asks the host's model.", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			res, err := executor.Sample(ctx, "q", &mcp.CreateMessageParams{MaxTokens: 10, Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "hi"}}}})
			if err != nil {
				return nil, err
			}
			return res.Content.(*mcp.TextContent).Text, nil
		}}
	p := startPipeline(t, hostTool("ask_host"), hostTool("ask_host_partly"), sampleOnly)
	d := startDoor(t, p, mcpserver.Config{StateKey: mcpserver.NewStateKey()})
	all := map[string]any{"elicitation": map[string]any{}, "sampling": map[string]any{}, "roots": map[string]any{}}
	first, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "ask_host", hostCall("ask_host", all, "", nil))
	state, _ := first["requestState"].(string)
	reqs, _ := first["inputRequests"].(map[string]any)
	methods := map[string]string{}
	for k, r := range reqs {
		methods[k], _ = r.(map[string]any)["method"].(string)
	}
	if rpcErr != nil || state == "" || methods["user_name"] != "elicitation/create" || methods["greeting"] != "sampling/createMessage" || methods["client_roots"] != "roots/list" {
		t.Fatalf("first round: %v %v, want input_required asking the three at once", first, rpcErr)
	}
	run := strings.TrimSpace(runOfQuestion(t, p, "ask_host"))
	responses := map[string]any{
		"user_name":    map[string]any{"action": "accept", "content": map[string]any{"name": "Alice"}},
		"greeting":     map[string]any{"role": "assistant", "content": map[string]any{"type": "text", "text": "Hello there!"}, "model": "m", "stopReason": "endTurn"},
		"client_roots": map[string]any{"roots": []any{map[string]any{"uri": "file:///work", "name": "work"}}},
	}
	tampered := []byte(state)
	tampered[len(tampered)/2] ^= 1
	if res, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "ask_host", hostCall("ask_host", all, string(tampered), responses)); rpcErr == nil || rpcErr["code"] != -32602.0 {
		t.Fatalf("tampered state: %v %v, want -32602", res, rpcErr)
	}
	if n := answersOf(t, p, run); n != 0 {
		t.Fatalf("%d answers published by a tampered state", n)
	}
	final, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "ask_host", hostCall("ask_host", all, state, responses))
	for _, want := range []string{`accept {\"name\":\"Alice\"}`, `Hello there!`, `file:///work`} {
		if rpcErr != nil || final["isError"] == true || !strings.Contains(mustJSON(final), want) {
			t.Fatalf("carol's answers: %v %v, want the call's result with %s", final, rpcErr, want)
		}
	}
	if res, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "ask_host", hostCall("ask_host", all, state, responses)); rpcErr == nil || !strings.Contains(mustJSON(rpcErr), "used") {
		t.Fatalf("replayed state: %v %v, want -32602 saying it was used", res, rpcErr)
	}
	if n := answersOf(t, p, run); n != 3 {
		t.Fatalf("%d answers on the run, want carol's 3", n)
	}
	t.Run("only sampling declared", func(t *testing.T) {
		caps := map[string]any{"sampling": map[string]any{}}
		first, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "ask_host_partly", hostCall("ask_host_partly", caps, "", nil))
		reqs, _ := first["inputRequests"].(map[string]any)
		if _, ok := reqs["greeting"]; rpcErr != nil || len(reqs) != 1 || !ok {
			t.Fatalf("%v %v, want input_required asking only the greeting", first, rpcErr)
		}
		state, _ := first["requestState"].(string)
		final, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "ask_host_partly", hostCall("ask_host_partly", caps, state, map[string]any{"greeting": responses["greeting"]}))
		if rpcErr != nil || !strings.Contains(mustJSON(final), "declared no elicitation") || !strings.Contains(mustJSON(final), "declared no roots capability") || !strings.Contains(mustJSON(final), "Hello there!") {
			t.Fatalf("%v %v, want the greeting and the reasons for the others", final, rpcErr)
		}
	})
	t.Run("no sampling declared", func(t *testing.T) {
		res, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "sample_only", hostCall("sample_only", map[string]any{"elicitation": map[string]any{}}, "", nil))
		if rpcErr == nil || rpcErr["code"] != float64(mcp.CodeMissingRequiredClientCapabilities) || !strings.Contains(mustJSON(rpcErr), `"sampling":{}`) {
			t.Fatalf("%v %v, want -32021 naming sampling", res, rpcErr)
		}
	})
}

// TestMCPTaskRequiredTool: a tool that requires a task is refused to a host that takes
// no tasks with -32021 naming the Tasks extension; the control, a host
// that declares the extension, gets a task at once.
func TestMCPTaskRequiredTool(t *testing.T) {
	needs := executor.Tool{Name: "needs_task", Description: "Works as a task.", InputSchema: json.RawMessage(`{"type":"object"}`),
		Timeout: time.Minute, HeartbeatTimeout: 30 * time.Second, TaskRequired: true,
		Func: func(context.Context, json.RawMessage) (any, error) { return "done", nil }}
	p := startPipeline(t, needs)
	d := startDoor(t, p, mcpserver.Config{})
	res, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "needs_task", hostCall("needs_task", map[string]any{}, "", nil))
	if rpcErr == nil || rpcErr["code"] != float64(mcp.CodeMissingRequiredClientCapabilities) || !strings.Contains(mustJSON(rpcErr), mcpserver.ExtTasks) {
		t.Fatalf("%v %v, want -32021 naming the Tasks extension", res, rpcErr)
	}
	res, rpcErr, _ = post2026(t, d, d.carol, "tools/call", "needs_task", map[string]any{"name": "needs_task", "arguments": map[string]any{}})
	if rpcErr != nil || res["resultType"] != "task" {
		t.Fatalf("with the extension: %v %v, want a task", res, rpcErr)
	}
}

// TestMCPTaskAnswersOneByOne: a task whose tool asks the host's model and its roots at
// once reads input_required with both input requests; tasks/update answers one (the
// task still waits for the other only), an answer sent again is not counted twice,
// another token's tasks/update finds no task, and the control, carol's answer to the
// other, completes it with both results.
func TestMCPTaskAnswersOneByOne(t *testing.T) {
	tool := executor.Tool{Name: "two_at_once", Description: "Asks the host's model and roots at once.", InputSchema: json.RawMessage(`{"type":"object"}`),
		Timeout: time.Minute, HeartbeatTimeout: 30 * time.Second,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			as, err := executor.AskAll(ctx,
				executor.SamplingQuestion("greeting", &mcp.CreateMessageParams{MaxTokens: 5, Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "hi"}}}}),
				executor.RootsQuestion("client_roots"))
			if err != nil {
				return nil, err
			}
			return fmt.Sprintf("%s %s", as[0].Content, as[1].Content), nil
		}}
	p := startPipeline(t, tool)
	d := startDoor(t, p, mcpserver.Config{})
	meta := func() map[string]any {
		return map[string]any{mcp.MetaKeyProtocolVersion: mcpserver.Protocol2026, mcp.MetaKeyClientCapabilities: map[string]any{
			"sampling": map[string]any{}, "roots": map[string]any{}, "extensions": map[string]any{mcpserver.ExtTasks: map[string]any{}}}}
	}
	created, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "two_at_once", map[string]any{"name": "two_at_once", "arguments": map[string]any{}, "_meta": meta()})
	id, _ := created["taskId"].(string)
	if rpcErr != nil || id == "" {
		t.Fatalf("tools/call: %v %v, want a task", created, rpcErr)
	}
	task := func(token string) (map[string]any, map[string]any) {
		res, rpcErr, _ := post2026(t, d, token, "tasks/get", id, map[string]any{"taskId": id, "_meta": meta()})
		return res, rpcErr
	}
	update := func(token string, responses map[string]any) map[string]any {
		_, rpcErr, _ := post2026(t, d, token, "tasks/update", id, map[string]any{"taskId": id, "inputResponses": responses, "_meta": meta()})
		return rpcErr
	}
	pending := func(res map[string]any) string {
		reqs, _ := res["inputRequests"].(map[string]any)
		var keys []string
		for _, k := range []string{"greeting", "client_roots"} {
			if _, ok := reqs[k]; ok {
				keys = append(keys, k)
			}
		}
		return fmt.Sprintf("%v %v", res["status"], keys)
	}
	eventstest.Eventually(t, time.Minute, func() error {
		if res, rpcErr := task(d.carol); pending(res) != "input_required [greeting client_roots]" {
			return fmt.Errorf("task %v %v, want both input requests", res, rpcErr)
		}
		return nil
	})
	greeting := map[string]any{"greeting": map[string]any{"role": "assistant", "content": map[string]any{"type": "text", "text": "Hello!"}, "model": "m"}}
	for i := 0; i < 2; i++ { // the second is the same answer again
		if rpcErr := update(d.carol, greeting); rpcErr != nil {
			t.Fatalf("tasks/update: %v", rpcErr)
		}
	}
	if res, rpcErr := task(d.carol); pending(res) != "input_required [client_roots]" {
		t.Fatalf("after the greeting: %v %v, want only the roots pending", res, rpcErr)
	}
	if n := answersOf(t, p, id); n != 1 {
		t.Fatalf("%d answers on the run, want 1", n)
	}
	roots := map[string]any{"client_roots": map[string]any{"roots": []any{map[string]any{"uri": "file:///w"}}}}
	if rpcErr := update(d.dave, roots); rpcErr == nil || !strings.Contains(mustJSON(rpcErr), "not found") {
		t.Fatalf("dave's tasks/update: %v, want not found", rpcErr)
	}
	if rpcErr := update(d.carol, roots); rpcErr != nil {
		t.Fatalf("tasks/update: %v", rpcErr)
	}
	eventstest.Eventually(t, time.Minute, func() error {
		res, rpcErr := task(d.carol)
		if res["status"] != mcpserver.TaskCompleted || !strings.Contains(mustJSON(res), "Hello!") || !strings.Contains(mustJSON(res), "file:///w") {
			return fmt.Errorf("task %v %v, want completed with both answers", res, rpcErr)
		}
		return nil
	})
}
