package modeltest

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/internal/golden"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/internal/wire"
)

// CheckGolden compares a request body with testdata/<name>, after normalising it
// (sorted keys, indentation). With -update (internal/golden) it rewrites the file instead.
func CheckGolden(t *testing.T, name string, body []byte) {
	t.Helper()
	var v any
	if err := DecodeJSON(body, &v); err != nil {
		t.Fatalf("body is not JSON: %v\n%s", err, body)
	}
	got, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("testdata", name), append(got, '\n'))
}

// Tools are the tool contracts of the translation tests.
func Tools() []toolbus.ToolContract {
	return []toolbus.ToolContract{
		{Name: "lookup_incident", Description: "Look up an incident by id.", ReadOnly: true,
			InputSchema: json.RawMessage(`{"type":"object","properties":{"incident_id":{"type":"string","pattern":"^INC-[0-9]+$"}},"required":["incident_id"],"additionalProperties":false}`)},
		{Name: "calculator", Description: "Evaluate an arithmetic expression.", ReadOnly: true,
			InputSchema: json.RawMessage(`{"type":"object","properties":{"expression":{"type":"string","maxLength":256}},"required":["expression"]}`)},
	}
}

// The raw parts of the first assistant message of RichHistory, one per provider, so
// every adapter has to pick its own and leave the others alone.
const (
	ChatRaw      = `{"reasoning_content":"Two lookups and a computation are needed."}`
	ResponsesRaw = `[` +
		`{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"Two lookups are needed."}],"encrypted_content":"gAAAA-opaque"},` +
		`{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Let me look.","annotations":[]}]},` +
		`{"id":"fc_1","type":"function_call","call_id":"call_a","name":"lookup_incident","arguments":"{\"incident_id\":\"INC-404\"}","status":"completed"},` +
		`{"id":"fc_2","type":"function_call","call_id":"call_b","name":"calculator","arguments":"{\"expression\":\"17*38+55\"}","status":"completed"},` +
		`{"id":"fc_3","type":"function_call","call_id":"call_c","name":"calculator","arguments":"{\"expression\": \"1/0\"","status":"completed"}]`
	AnthropicRaw = `[` +
		`{"type":"thinking","thinking":"Two lookups and a computation are needed.","signature":"EqQBCgIYAhIM-opaque-signature"},` +
		`{"type":"redacted_thinking","data":"EmwKAhgBEgy-redacted"},` +
		`{"type":"text","text":"Let me look."},` +
		`{"type":"tool_use","id":"call_a","name":"lookup_incident","input":{"incident_id":"INC-404"}},` +
		`{"type":"tool_use","id":"call_b","name":"calculator","input":{"expression":"17*38+55"}},` +
		`{"type":"tool_use","id":"call_c","name":"calculator","input":{"expression":"1/0"}}]`
)

// RichHistory is a two-step history with everything the translation must keep: a
// system prompt, reasoning with a signature and opaque provider parts, three parallel
// calls (one with malformed arguments) whose results were recorded out of call order
// (two of them errors), a second step made by another model (no raw parts), and a
// user follow-up.
func RichHistory() []toolbus.Message {
	raw, err := json.Marshal(wire.RawParts{
		OpenAIChat:      json.RawMessage(ChatRaw),
		OpenAIResponses: json.RawMessage(ResponsesRaw),
		Anthropic:       json.RawMessage(AnthropicRaw),
	})
	if err != nil {
		panic(err)
	}
	return []toolbus.Message{
		{Role: toolbus.RoleSystem, Content: "You are an operations assistant."},
		{Role: toolbus.RoleUser, Content: "What is going on with INC-404? Also compute 17*38+55."},
		{Role: toolbus.RoleAssistant, Content: "Let me look.", Reasoning: "Two lookups and a computation are needed.",
			ReasoningSignature: "EqQBCgIYAhIM-opaque-signature", Raw: raw,
			ToolCalls: []toolbus.ToolCall{
				{CallID: "call_a", Tool: "lookup_incident", Arguments: `{"incident_id":"INC-404"}`},
				{CallID: "call_b", Tool: "calculator", Arguments: `{"expression":"17*38+55"}`},
				{CallID: "call_c", Tool: "calculator", Arguments: `{"expression": "1/0"`},
			}},
		{Role: toolbus.RoleTool, ToolCallID: "call_b", Name: "calculator", Content: `{"value":701}`},
		{Role: toolbus.RoleTool, ToolCallID: "call_c", Name: "calculator", IsError: true,
			Content: "invalid_arguments: the arguments are not valid JSON: unexpected end of JSON input"},
		{Role: toolbus.RoleTool, ToolCallID: "call_a", Name: "lookup_incident", IsError: true,
			Content: "incident_not_found: no incident INC-404"},
		{Role: toolbus.RoleAssistant, Content: "INC-404 does not exist; INC-001 is the open incident.", Reasoning: "unsigned thoughts",
			ToolCalls: []toolbus.ToolCall{{CallID: "call_d", Tool: "lookup_incident", Arguments: `{"incident_id":"INC-001"}`}}},
		{Role: toolbus.RoleTool, ToolCallID: "call_d", Name: "lookup_incident", Content: `{"incident_id":"INC-001","severity":"high"}`},
		{Role: toolbus.RoleUser, Content: "Thanks. Summarize in one line."},
	}
}

// TwoStep is the history of a run whose first step (first) called a tool once.
func TwoStep(first toolbus.Message, result string) []toolbus.Message {
	return []toolbus.Message{
		{Role: toolbus.RoleSystem, Content: "sys"},
		{Role: toolbus.RoleUser, Content: "What is 2+3?"},
		first,
		{Role: toolbus.RoleTool, ToolCallID: first.ToolCalls[0].CallID, Name: first.ToolCalls[0].Tool, Content: result},
	}
}

// Question is a one-message history.
func Question() []toolbus.Message {
	return []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}
}

// CheckAnswer asserts the invariants of any successful answer: the assistant role,
// non-empty call ids unique within the step, a Raw that is JSON.
func CheckAnswer(t *testing.T, resp planner.Response) {
	t.Helper()
	if resp.Message.Role != toolbus.RoleAssistant {
		t.Fatalf("role %q", resp.Message.Role)
	}
	seen := map[string]bool{}
	for _, c := range resp.Message.ToolCalls {
		if c.CallID == "" || seen[c.CallID] {
			t.Fatalf("call ids not unique and non-empty: %+v", resp.Message.ToolCalls)
		}
		seen[c.CallID] = true
	}
	if len(resp.Message.Raw) > 0 && !json.Valid(resp.Message.Raw) {
		t.Fatalf("raw is not JSON: %s", resp.Message.Raw)
	}
}

// Sleeps records the waits of a RetryPolicy instead of waiting.
type Sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

// Sleep records d and returns at once (ctx's error, if it ended).
func (s *Sleeps) Sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

// Waits returns the recorded waits.
func (s *Sleeps) Waits() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// FastRetry is a policy with a tiny backoff and a one-minute cap whose waits are
// recorded in s, not slept.
func FastRetry(attempts int, s *Sleeps) planner.RetryPolicy {
	return planner.RetryPolicy{MaxAttempts: attempts, BaseDelay: time.Microsecond, MaxDelay: time.Minute, Sleep: s.Sleep}
}

// AttachmentHistory is a history whose one tool result carries attachments: a PNG, a
// PDF, a CSV, a WAV and an image kept by reference whose bytes were not read (what
// each adapter passes, or describes, is in its own test).
func AttachmentHistory() []toolbus.Message {
	return []toolbus.Message{
		{Role: toolbus.RoleSystem, Content: "You are an operations assistant."},
		{Role: toolbus.RoleUser, Content: "Show me the CPU chart."},
		{Role: toolbus.RoleAssistant, ToolCalls: []toolbus.ToolCall{{CallID: "call_img", Tool: "chart", Arguments: `{"metric":"cpu"}`}}},
		{Role: toolbus.RoleTool, ToolCallID: "call_img", Name: "chart", Content: "the CPU chart", Attachments: AttachmentFiles()},
	}
}

// AttachmentFiles are the attachments of AttachmentHistory's tool result.
func AttachmentFiles() []toolbus.Attachment {
	return []toolbus.Attachment{
		{MediaType: "image/png", Name: "cpu.png", Data: []byte("PNGDATA"), Size: 7},
		{MediaType: "application/pdf", Name: "report.pdf", Data: []byte("%PDF-1"), Size: 6},
		{MediaType: "text/csv", Name: "cpu.csv", Data: []byte("t,cpu\n1,93\n"), Size: 11},
		{MediaType: "audio/wav", Data: []byte("RIFF"), Size: 4},
		{MediaType: "image/png", Name: "big.png", Ref: "kv://toolbus_outputs/chart.r.0.call_img.a4", Size: 900000},
	}
}
