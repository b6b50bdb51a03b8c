package planner

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
)

// anthropicRules are the Messages API rules the fake enforces: only user and assistant
// roles (system is a top-level parameter), the first message from the user, every
// tool_use answered by a tool_result in the very next user message, no tool_result
// without its tool_use in the previous message, tool_result blocks first in their
// message, non-empty content, thinking blocks sent back unmodified; plus toolbus's own:
// strict alternation and results in call order.
func anthropicRules(f *fake, req map[string]any) string {
	if jstr(req["model"]) == "" {
		return "model: Field required"
	}
	if n := fmt.Sprint(req["max_tokens"]); n == "<nil>" || n == "0" {
		return "max_tokens: Field required"
	}
	for i, tv := range jarr(req["tools"]) {
		tool := jobj(tv)
		if !toolbus.ValidToolName(jstr(tool["name"])) || jstr(jobj(tool["input_schema"])["type"]) != "object" {
			return fmt.Sprintf("tools.%d: a tool needs a valid name and an object input_schema", i)
		}
	}
	if sys, ok := req["system"]; ok {
		for _, b := range jarr(sys) {
			if jstr(jobj(b)["type"]) != "text" {
				return "system: only text blocks are accepted"
			}
		}
	}
	// The assistant contents the fake sent, keyed by their first tool_use id.
	sent := map[string]string{}
	for _, s := range f.sentJSON() {
		for _, bv := range jarr(s["content"]) {
			if b := jobj(bv); jstr(b["type"]) == "tool_use" {
				sent[jstr(b["id"])] = canon(s["content"])
				break
			}
		}
	}
	msgs := jarr(req["messages"])
	if len(msgs) == 0 {
		return "messages: at least one message is required"
	}
	missing := func(i int, ids []string) string {
		return fmt.Sprintf("messages.%d: `tool_use` ids were found without `tool_result` blocks immediately after: %s. "+
			"Each `tool_use` block must have a corresponding `tool_result` block in the next message.", i, strings.Join(ids, ", "))
	}
	prevRole := ""
	var uses []string
	for i, mv := range msgs {
		m := jobj(mv)
		role := jstr(m["role"])
		switch {
		case role == "system":
			return "messages: Unexpected role \"system\". The Messages API accepts a top-level `system` parameter, not \"system\" as an input message role."
		case role != "user" && role != "assistant":
			return fmt.Sprintf("messages.%d.role: Input should be 'user' or 'assistant'", i)
		case i == 0 && role != "user":
			return "messages: first message must use the \"user\" role"
		case role == prevRole:
			return fmt.Sprintf("messages.%d: roles must alternate between \"user\" and \"assistant\"", i)
		}
		var blocks []any
		switch c := m["content"].(type) {
		case string:
			blocks = []any{map[string]any{"type": "text", "text": c}}
		case []any:
			blocks = c
		}
		if len(blocks) == 0 {
			return fmt.Sprintf("messages.%d: all messages must have non-empty content except for the optional final assistant message", i)
		}
		if role == "assistant" {
			if len(uses) > 0 {
				return missing(i-1, uses)
			}
			for k, bv := range blocks {
				b := jobj(bv)
				switch jstr(b["type"]) {
				case "tool_use":
					if jstr(b["id"]) == "" || jobj(b["input"]) == nil {
						return fmt.Sprintf("messages.%d.content.%d: a tool_use block needs an id and an object input", i, k)
					}
					uses = append(uses, jstr(b["id"]))
				case "thinking":
					if jstr(b["signature"]) == "" {
						return fmt.Sprintf("messages.%d.content.%d.signature: Field required", i, k)
					}
				case "tool_result":
					return fmt.Sprintf("messages.%d.content.%d: tool_result blocks are only accepted in user messages", i, k)
				}
			}
			if len(uses) > 0 {
				if orig, ok := sent[uses[0]]; ok && orig != canon(blocks) {
					return fmt.Sprintf("messages.%d.content: `thinking` or `redacted_thinking` blocks in the latest assistant message cannot be modified. "+
						"These blocks must remain as they were in the original response.", i)
				}
			}
		} else {
			var results []string
			for k, bv := range blocks {
				b := jobj(bv)
				switch jstr(b["type"]) {
				case "tool_result":
					if k != len(results) {
						return fmt.Sprintf("messages.%d.content.%d: tool_result blocks must come first in the user message content", i, k)
					}
					id := jstr(b["tool_use_id"])
					if !slices.Contains(uses, id) {
						return fmt.Sprintf("messages.%d.content.%d: unexpected `tool_use_id` found in `tool_result` blocks: %s. "+
							"Each `tool_result` block must have a corresponding `tool_use` block in the previous message.", i, k, id)
					}
					if v, ok := b["is_error"]; ok {
						if _, isBool := v.(bool); !isBool {
							return fmt.Sprintf("messages.%d.content.%d.is_error: Input should be a valid boolean", i, k)
						}
					}
					results = append(results, id)
				case "text":
					if jstr(b["text"]) == "" {
						return fmt.Sprintf("messages.%d.content.%d.text: text content blocks must be non-empty", i, k)
					}
				}
			}
			var unanswered []string
			for _, id := range uses {
				if !slices.Contains(results, id) {
					unanswered = append(unanswered, id)
				}
			}
			if len(unanswered) > 0 {
				return missing(i-1, unanswered)
			}
			if !slices.Equal(results, uses) {
				return fmt.Sprintf("messages.%d: tool_result blocks must answer the tool_use blocks in order", i)
			}
			uses = nil
		}
		prevRole = role
	}
	if len(uses) > 0 {
		return missing(len(msgs)-1, uses)
	}
	return ""
}

func anthropicErrorBody(msg string) string {
	return canon(map[string]any{"type": "error", "error": map[string]any{"type": "invalid_request_error", "message": msg}})
}

func newAnthropicFake(t *testing.T, reply func(n int, req map[string]any) fakeReply) (*fake, string) {
	t.Helper()
	f := &fake{t: t, path: "/v1/messages", rules: anthropicRules, errorBody: anthropicErrorBody, reply: reply}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

// anthropicMessage is a Messages answer with the given content blocks.
func anthropicMessage(stop string, content ...any) string {
	return canon(map[string]any{
		"id": "msg_1", "type": "message", "role": "assistant", "model": "fake-claude", "content": content,
		"stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": 21, "output_tokens": 8, "cache_creation_input_tokens": 3, "cache_read_input_tokens": 4},
	})
}

func textBlock(s string) map[string]any { return map[string]any{"type": "text", "text": s} }

func toolUse(id, name string, input any) map[string]any {
	return map[string]any{"type": "tool_use", "id": id, "name": name, "input": input}
}

func newTestAnthropic(t *testing.T, base string, mod func(*AnthropicOptions)) *Anthropic {
	t.Helper()
	opts := AnthropicOptions{APIKey: "test-key", BaseURL: base, Model: "claude-test", Retry: RetryPolicy{MaxAttempts: 1}, Logger: discardLog}
	if mod != nil {
		mod(&opts)
	}
	m, err := NewAnthropic(opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestAnthropicRequest(t *testing.T) {
	f, base := newAnthropicFake(t, always(fakeReply{body: anthropicMessage("end_turn", textBlock("INC-404 does not exist."))}))
	m := newTestAnthropic(t, base, func(o *AnthropicOptions) { o.MaxTokens, o.ThinkingBudget = 2048, 1024 })
	resp, err := m.Complete(context.Background(), Request{RunID: "r1", Step: 2, Messages: richHistory(), Tools: fixtureTools()})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Message.Content != "INC-404 does not exist." || resp.Usage != (toolbus.Usage{InputTokens: 28, OutputTokens: 8}) || resp.Model != "fake-claude" {
		t.Fatalf("resp %+v", resp)
	}
	body := f.lastRequest()
	checkGolden(t, "anthropic_request.golden.json", body)

	req := decodeBody(t, body)
	if canon(req["system"]) != `[{"text":"You are an operations assistant.","type":"text"}]` {
		t.Errorf("system %v", req["system"])
	}
	msgs := jarr(req["messages"])
	var shape []string
	for _, mv := range msgs {
		m := jobj(mv)
		var parts []string
		for _, bv := range jarr(m["content"]) {
			b := jobj(bv)
			p := jstr(b["type"])
			switch p {
			case "tool_use":
				p += ":" + jstr(b["id"])
			case "tool_result":
				p += ":" + jstr(b["tool_use_id"])
				if b["is_error"] == true {
					p += "!"
				}
			}
			parts = append(parts, p)
		}
		shape = append(shape, jstr(m["role"])+"["+strings.Join(parts, ",")+"]")
	}
	want := "user[text] " +
		"assistant[thinking,redacted_thinking,text,tool_use:call_a,tool_use:call_b,tool_use:call_c] " +
		"user[tool_result:call_a!,tool_result:call_b,tool_result:call_c!] " +
		"assistant[text,tool_use:call_d] " +
		"user[tool_result:call_d,text]"
	if got := strings.Join(shape, " "); got != want {
		t.Errorf("messages\n got %s\nwant %s", got, want)
	}
	var fixture []any
	if err := jsonUnmarshalNumber(fixtureAnthropicRaw, &fixture); err != nil {
		t.Fatal(err)
	}
	if got := canon(jobj(msgs[1])["content"]); got != canon(fixture) {
		t.Errorf("the raw blocks were not sent back as they came:\n got %s\nwant %s", got, canon(fixture))
	}
	if canon(req["thinking"]) != `{"budget_tokens":1024,"type":"enabled"}` || fmt.Sprint(req["max_tokens"]) != "2048" {
		t.Errorf("thinking %v max_tokens %v", req["thinking"], req["max_tokens"])
	}
}

func TestNewAnthropicOptions(t *testing.T) {
	if _, err := NewAnthropic(AnthropicOptions{Model: "m", MaxTokens: 2000, ThinkingBudget: 2000}); err == nil {
		t.Fatal("a thinking budget above max tokens was accepted")
	}
	if _, err := NewAnthropic(AnthropicOptions{}); err == nil || !strings.HasPrefix(err.Error(), "planner: anthropic:") {
		t.Fatalf("err = %v", err)
	}
	if _, err := NewOpenAI(OpenAIOptions{}); err == nil || !strings.HasPrefix(err.Error(), "planner: openai:") {
		t.Fatalf("err = %v", err)
	}
	if _, err := NewOpenAIResponses(OpenAIResponsesOptions{}); err == nil || !strings.HasPrefix(err.Error(), "planner: openai-responses:") {
		t.Fatalf("err = %v", err)
	}
}

func TestAnthropicRoundTrip(t *testing.T) {
	step0 := anthropicMessage("tool_use",
		map[string]any{"type": "thinking", "thinking": "2+3 needs the calculator.", "signature": "sig-0"},
		map[string]any{"type": "redacted_thinking", "data": "opaque"},
		textBlock("I will compute it."),
		toolUse("toolu_1", "calculator", map[string]any{"expression": "2+3"}))
	step1 := anthropicMessage("end_turn", textBlock("2+3 = 5."))
	f, base := newAnthropicFake(t, func(n int, _ map[string]any) fakeReply { return fakeReply{body: []string{step0, step1}[min(n, 1)]} })
	m := newTestAnthropic(t, base, nil)
	ctx := context.Background()
	r0, err := m.Complete(ctx, Request{Step: 0, Messages: []toolbus.Message{{Role: toolbus.RoleSystem, Content: "sys"}, {Role: toolbus.RoleUser, Content: "What is 2+3?"}}, Tools: fixtureTools()})
	if err != nil {
		t.Fatal(err)
	}
	want := toolbus.ToolCall{CallID: "toolu_1", Tool: "calculator", Arguments: `{"expression":"2+3"}`}
	if r0.Message.Reasoning != "2+3 needs the calculator." || r0.Message.ReasoningSignature != "sig-0" ||
		len(r0.Message.ToolCalls) != 1 || r0.Message.ToolCalls[0] != want {
		t.Fatalf("step 0: %+v", r0.Message)
	}
	history := twoStep(r0.Message, `{"value":5}`)
	history[3].IsError = true // an error result is flagged, never turned into text
	r1, err := m.Complete(ctx, Request{Step: 1, Messages: history, Tools: fixtureTools()})
	if err != nil || r1.Message.Content != "2+3 = 5." {
		t.Fatalf("step 1: %v %+v", err, r1.Message)
	}
	if _, accepted, rejected := f.counts(); accepted != 2 || len(rejected) != 0 {
		t.Fatalf("accepted %d rejected %v", accepted, rejected)
	}

	// Rebuilt without the raw blocks, the message loses its redacted_thinking block:
	// the API refuses a modified thinking turn, and the run fails with its message.
	stripped := r0.Message
	stripped.Raw = nil
	_, err = m.Complete(ctx, Request{Step: 1, Messages: twoStep(stripped, `{"value":5}`)})
	if !errors.Is(err, ErrPermanent) || !strings.Contains(err.Error(), "cannot be modified") {
		t.Fatalf("err = %v, want a permanent error with the API's message", err)
	}
}

func TestAnthropicToolUse(t *testing.T) {
	step0 := anthropicMessage("tool_use",
		toolUse("", "calculator", map[string]any{"expression": "2 + 3", "precision": 2}),
		toolUse("dup", "calculator", map[string]any{}),
		toolUse("dup", "lookup_incident", nil))
	f, base := newAnthropicFake(t, func(n int, _ map[string]any) fakeReply {
		return fakeReply{body: []string{step0, anthropicMessage("end_turn", textBlock("done"))}[min(n, 1)]}
	})
	m := newTestAnthropic(t, base, nil)
	r0, err := m.Complete(context.Background(), Request{Step: 6, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []toolbus.ToolCall{
		{CallID: "call_6_0", Tool: "calculator", Arguments: `{"expression":"2 + 3","precision":2}`},
		{CallID: "dup", Tool: "calculator", Arguments: `{}`},
		{CallID: "call_6_2", Tool: "lookup_incident", Arguments: `{}`},
	}
	if !slices.Equal(r0.Message.ToolCalls, want) {
		t.Fatalf("calls %+v\nwant %+v", r0.Message.ToolCalls, want)
	}
	history := []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}, r0.Message}
	for _, c := range r0.Message.ToolCalls {
		history = append(history, toolbus.Message{Role: toolbus.RoleTool, ToolCallID: c.CallID, Content: "r", IsError: true})
	}
	f.mu.Lock()
	f.sent = nil // the ids were rewritten on purpose; only check they line up
	f.mu.Unlock()
	if _, err := m.Complete(context.Background(), Request{Step: 7, Messages: history}); err != nil {
		t.Fatalf("normalized ids were not sent back consistently: %v", err)
	}
}

func TestAnthropicFakeEnforcesRules(t *testing.T) {
	_, base := newAnthropicFake(t, always(fakeReply{body: anthropicMessage("end_turn", textBlock("ok"))}))
	url := base + "/v1/messages"
	user := `{"role":"user","content":"q"}`
	asst := `{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"calculator","input":{}},{"type":"tool_use","id":"b","name":"calculator","input":{}}]}`
	result := func(id string) string { return `{"type":"tool_result","tool_use_id":"` + id + `","content":"5"}` }
	results := func(blocks ...string) string { return `{"role":"user","content":[` + strings.Join(blocks, ",") + `]}` }
	tests := []struct{ name, msgs, want string }{
		{"valid", user + "," + asst + "," + results(result("a"), result("b"), `{"type":"text","text":"go on"}`), ""},
		{"orphan tool result", user + `,{"role":"assistant","content":"hi"},` + results(result("a")), "unexpected `tool_use_id` found in `tool_result` blocks: a"},
		{"missing tool result", user + "," + asst + "," + results(result("a")), "without `tool_result` blocks immediately after: b"},
		{"tool result as user text", user + "," + asst + `,{"role":"user","content":"a returned 5, b returned 5"}`, "without `tool_result` blocks immediately after: a, b"},
		{"wrong role", `{"role":"system","content":"sys"},` + user, "Unexpected role \\\"system\\\""},
		{"wrong order", user + "," + asst + "," + results(result("b"), result("a")), "in order"},
		{"tool result after text", user + "," + asst + "," + results(`{"type":"text","text":"here"}`, result("a"), result("b")), "must come first"},
		{"not alternating", user + "," + user, "must alternate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := post(t, url, `{"model":"m","max_tokens":10,"messages":[`+tt.msgs+`]}`)
			if tt.want == "" {
				if status != 200 {
					t.Fatalf("status %d: %s", status, body)
				}
				return
			}
			if status != 400 || !strings.Contains(body, tt.want) {
				t.Fatalf("status %d body %s, want 400 with %q", status, body, tt.want)
			}
		})
	}
}

func sse(events ...string) string {
	var b strings.Builder
	for _, e := range events {
		typ, data, _ := strings.Cut(e, " ")
		fmt.Fprintf(&b, "event: %s\ndata: %s\n\n", typ, data)
	}
	return b.String()
}

var anthropicStream = []string{
	`message_start {"type":"message_start","message":{"id":"msg_s","type":"message","role":"assistant","model":"fake-claude","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":30,"output_tokens":1}}}`,
	`ping {"type":"ping"}`,
	`content_block_start {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
	`content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Needs the "}}`,
	`content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"calculator."}}`,
	`content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig-s"}}`,
	`content_block_stop {"type":"content_block_stop","index":0}`,
	`content_block_start {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`,
	`content_block_delta {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Computing."}}`,
	`content_block_stop {"type":"content_block_stop","index":1}`,
	`content_block_start {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_s","name":"calculator","input":{}}}`,
	`content_block_delta {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"expres"}}`,
	`content_block_delta {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"sion\": \"2+3\"}"}}`,
	`content_block_stop {"type":"content_block_stop","index":2}`,
	`message_delta {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":15}}`,
	`message_stop {"type":"message_stop"}`,
}

func TestAnthropicStream(t *testing.T) {
	f, base := newAnthropicFake(t, func(n int, _ map[string]any) fakeReply {
		if n == 0 {
			return fakeReply{sse: true, body: sse(anthropicStream...)}
		}
		return fakeReply{sse: true, body: sse(strings.Replace(anthropicStream[0], `"content":[]`, `"content":[{"type":"text","text":"5"}]`, 1),
			`message_delta {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}`,
			`message_stop {"type":"message_stop"}`)}
	})
	m := newTestAnthropic(t, base, func(o *AnthropicOptions) { o.Stream = true })
	r0, err := m.Complete(context.Background(), Request{Step: 0, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
	if err != nil {
		t.Fatal(err)
	}
	checkAnswer(t, r0)
	if r0.Message.Content != "Computing." || r0.Message.Reasoning != "Needs the calculator." || r0.Message.ReasoningSignature != "sig-s" ||
		len(r0.Message.ToolCalls) != 1 || r0.Message.ToolCalls[0].Arguments != `{"expression":"2+3"}` || r0.Usage != (toolbus.Usage{InputTokens: 30, OutputTokens: 15}) {
		t.Fatalf("resp %+v", r0)
	}
	if decodeBody(t, f.lastRequest())["stream"] != true {
		t.Fatal("the request did not ask for a stream")
	}
	// The aggregated blocks go back as the model made them.
	if _, err := m.Complete(context.Background(), Request{Step: 1, Messages: twoStep(r0.Message, "5")}); err != nil {
		t.Fatal(err)
	}
	req := decodeBody(t, f.lastRequest())
	got := canon(jobj(jarr(req["messages"])[1])["content"])
	want := `[{"signature":"sig-s","thinking":"Needs the calculator.","type":"thinking"},{"text":"Computing.","type":"text"},{"id":"toolu_s","input":{"expression":"2+3"},"name":"calculator","type":"tool_use"}]`
	if got != want {
		t.Fatalf("sent back\n got %s\nwant %s", got, want)
	}
}

func TestAnthropicStreamFailures(t *testing.T) {
	tests := map[string]string{
		"cut short":         sse(anthropicStream[:9]...),
		"error event":       sse(anthropicStream[0], `error {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`),
		"garbage event":     sse(anthropicStream[0], `content_block_delta {"type":"content_block_delta","index":7,"delta":{"type":"text_delta","text":"x"}}`),
		"not an SSE stream": `{"type":"message"}`,
	}
	for name, body := range tests {
		t.Run(name, func(t *testing.T) {
			_, base := newAnthropicFake(t, always(fakeReply{sse: true, body: body}))
			_, err := newTestAnthropic(t, base, func(o *AnthropicOptions) { o.Stream = true }).
				Complete(context.Background(), Request{Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
			var pe *ProviderError
			if err == nil || errors.Is(err, ErrPermanent) || !errors.As(err, &pe) || !pe.Retryable {
				t.Fatalf("err = %v, want a retryable provider error", err)
			}
		})
	}
}

func TestAnthropicRetries(t *testing.T) {
	replies := []fakeReply{
		{status: 529, header: map[string]string{"Retry-After": "4"}, body: canon(map[string]any{"type": "error", "error": map[string]any{"type": "overloaded_error", "message": "Overloaded"}})},
		{body: anthropicMessage("end_turn", textBlock("done"))},
	}
	f, base := newAnthropicFake(t, func(n int, _ map[string]any) fakeReply { return replies[min(n, 1)] })
	var s sleeps
	m := newTestAnthropic(t, base, func(o *AnthropicOptions) { o.Retry = fastRetry(3, &s) })
	resp, err := m.Complete(context.Background(), Request{Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
	if err != nil || resp.Message.Content != "done" {
		t.Fatalf("err %v resp %+v", err, resp)
	}
	if reqs, _, _ := f.counts(); reqs != 2 || !slices.Equal(s.waits(), []time.Duration{4 * time.Second}) {
		t.Fatalf("%d requests, waits %v", reqs, s.waits())
	}

	_, base2 := newAnthropicFake(t, always(fakeReply{status: 400, body: anthropicErrorBody("max_tokens: 100000 > 64000, which is the maximum allowed")}))
	_, err = newTestAnthropic(t, base2, nil).Complete(context.Background(), Request{Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
	if !errors.Is(err, ErrPermanent) || !strings.Contains(err.Error(), "anthropic: 400 Bad Request: max_tokens: 100000 > 64000") {
		t.Fatalf("err = %v", err)
	}
}

func FuzzAnthropicResponse(f *testing.F) {
	f.Add([]byte(anthropicMessage("tool_use", textBlock("hi"), toolUse("", "calculator", map[string]any{"a": 1}), toolUse("", "x", "not an object"))), false)
	f.Add([]byte(`{"content":[{"type":"tool_use","input":null},{"type":"thinking"},{"type":"mystery","data":[1]}],"usage":{"input_tokens":-1}}`), false)
	f.Add([]byte(`{"content":null}`), false)
	f.Add([]byte(sse(anthropicStream...)), true)
	f.Add([]byte(sse(anthropicStream[:5]...)), true)
	f.Add([]byte("event: content_block_start\ndata: {\"index\":-1}\n\n"), true)
	f.Fuzz(func(t *testing.T, body []byte, stream bool) {
		ct := "application/json"
		if stream {
			ct = "text/event-stream"
		}
		m, err := NewAnthropic(AnthropicOptions{APIKey: "k", BaseURL: "http://fake.invalid", Model: "m", Stream: stream,
			HTTPClient: &http.Client{Transport: bytesTransport{status: 200, contentType: ct, body: body}},
			Retry:      RetryPolicy{MaxAttempts: 1}})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := m.Complete(context.Background(), Request{Step: 1, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
		if err == nil {
			checkAnswer(t, resp)
		}
	})
}
