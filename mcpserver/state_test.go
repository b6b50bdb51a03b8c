package mcpserver_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/mcpserver"
)

// askCall is a 2026-07-28 tools/call of tool with args from a host that can show forms;
// state and answer make it the retry of an input_required result.
func askCall(tool string, args map[string]any, state string, answer map[string]any) map[string]any {
	p := map[string]any{"name": tool, "arguments": args, "_meta": map[string]any{
		mcp.MetaKeyProtocolVersion:    mcpserver.Protocol2026,
		mcp.MetaKeyClientCapabilities: map[string]any{"elicitation": map[string]any{"form": map[string]any{}}},
	}}
	if state != "" {
		p["requestState"] = state
		p["inputResponses"] = map[string]any{mcpserver.QuestionKey: answer}
	}
	return p
}

// replicaOf is a second `toolbus mcp --http` over the same bus and access list as d,
// configured with cfg (its own state key, or the deployment's).
func replicaOf(t *testing.T, d *testDoor, cfg mcpserver.Config) *testDoor {
	t.Helper()
	access, err := door.NewSource(door.Entry("carol", d.carol, []string{"ops"})+"; "+door.Entry("dave", d.dave, nil)+"; "+door.Entry("carol", d.carol2, []string{"ops"}), "")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Source, cfg.Logger = "/mcp-test-replica", quiet()
	srv, err := mcpserver.New(d.p.ctx, d.p.bus, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := *d
	r.url = serveDoor(t, srv, access)
	return &r
}

// TestMCPRequestStateRefused: the requestState of a tool's question (2026-07-28
// input_required) is sealed under the deployment's state key and bound to the token
// and the request: presented tampered with, by another token (of another name or of
// carol's own), with other arguments, or at a door of another key, it is refused
// (-32602) and nothing is answered; the control, carol's own retry, answers it, at a
// replica of the same key too (the second question), and a replay of a used state is
// refused. Expiry: TestSealerRefuses (a clock).
func TestMCPRequestStateRefused(t *testing.T) {
	key := mcpserver.NewStateKey()
	p := startPipeline(t, whichTool("which_sealed"))
	d := startDoor(t, p, mcpserver.Config{StateKey: key})
	replica := replicaOf(t, d, mcpserver.Config{StateKey: key})
	stranger := replicaOf(t, d, mcpserver.Config{StateKey: mcpserver.NewStateKey()})
	args := map[string]any{}
	first, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "which_sealed", askCall("which_sealed", args, "", nil))
	state, _ := first["requestState"].(string)
	if rpcErr != nil || first["resultType"] != "input_required" || state == "" {
		t.Fatalf("first round: %v %v, want input_required with a requestState", first, rpcErr)
	}
	run := strings.TrimSpace(runOfQuestion(t, p, "which_sealed"))
	answer := map[string]any{"action": "accept", "content": map[string]any{"incident": "INC-401"}}
	tampered := []byte(state)
	tampered[len(tampered)/2] ^= 1
	refusals := []struct {
		name, token, state, why string
		door                    *testDoor
		args                    map[string]any
	}{
		{"tampered", d.carol, string(tampered), "integrity", d, args},
		{"another token's", d.dave, state, "", d, args},
		{"carol's other token", d.carol2, state, "another token", d, args},
		{"other arguments", d.carol, state, "another request", d, map[string]any{"incident": "x"}},
		{"another deployment's key", d.carol, state, "integrity", stranger, args},
	}
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) {
			res, rpcErr, _ := post2026(t, r.door, r.token, "tools/call", "which_sealed", askCall("which_sealed", r.args, r.state, answer))
			msg, _ := rpcErr["message"].(string)
			if rpcErr == nil || rpcErr["code"] != -32602.0 || !strings.Contains(msg, r.why) {
				t.Fatalf("result %v, error %v; want -32602 saying %q", res, rpcErr, r.why)
			}
		})
	}
	if n := answersOf(t, p, run); n != 0 {
		t.Fatalf("%d answers published by refused states", n)
	}
	// The control: carol's retry answers the question; the tool asks again (INC-401).
	second, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "which_sealed", askCall("which_sealed", args, state, answer))
	next, _ := second["requestState"].(string)
	if rpcErr != nil || second["resultType"] != "input_required" || next == "" || next == state {
		t.Fatalf("carol's retry: %v %v, want the second question", second, rpcErr)
	}
	t.Run("replayed", func(t *testing.T) {
		res, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "which_sealed", askCall("which_sealed", args, state, answer))
		if msg, _ := rpcErr["message"].(string); rpcErr == nil || !strings.Contains(msg, "used") {
			t.Fatalf("replay: result %v, error %v; want -32602 saying it was used", res, rpcErr)
		}
	})
	// Any replica of the deployment resumes the second question.
	final, rpcErr, _ := post2026(t, replica, d.carol, "tools/call", "which_sealed", askCall("which_sealed", args, next,
		map[string]any{"action": "accept", "content": map[string]any{"incident": "INC-404"}}))
	if rpcErr != nil || final["isError"] == true || !strings.Contains(mustJSON(final), `INC-404`) {
		t.Fatalf("carol's answer at the replica: %v %v, want the call's result", final, rpcErr)
	}
	if n := answersOf(t, p, run); n != 2 {
		t.Fatalf("%d answers on the run, want carol's 2", n)
	}
	t.Run("no elicitation", func(t *testing.T) {
		// A 2026-07-28 request that declared no elicitation: the door relies on no
		// capability the client did not declare (-32021 naming elicitation).
		params := askCall("which_sealed", args, "", nil)
		params["_meta"].(map[string]any)[mcp.MetaKeyClientCapabilities] = map[string]any{}
		res, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "which_sealed", params)
		if rpcErr == nil || rpcErr["code"] != float64(mcp.CodeMissingRequiredClientCapabilities) || !strings.Contains(mustJSON(rpcErr), "elicitation") {
			t.Fatalf("result %v, error %v; want -32021 naming elicitation", res, rpcErr)
		}
	})
}

// runOfQuestion returns the run of the first question of tool on the bus.
func runOfQuestion(t *testing.T, p *pipeline, tool string) string {
	t.Helper()
	ev, err := runlog.First(p.ctx, p.bus, events.SubjectPrefix+".*.tool.question."+tool)
	if err != nil {
		t.Fatal(err)
	}
	return ev.Meta.RunID
}

// answersOf counts the answers published on run.
func answersOf(t *testing.T, p *pipeline, run string) int {
	t.Helper()
	evs, err := runlog.Events(p.ctx, p.bus, run)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	v := audit.Visitor{ToolAnswer: func(runlog.StoredEvent, toolbus.ToolAnswer) { n++ }}
	v.Walk(evs)
	return n
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
