package anthropic

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/modeltest"
)

var discardLog = slog.New(slog.DiscardHandler)

// messagesProvider is the Messages wire format for the conformance suite.
var messagesProvider = modeltest.Provider{
	Name: "anthropic",
	Path: "/v1/messages",
	New: func(t *testing.T, url string, retry planner.RetryPolicy) planner.Model {
		return newTestAnthropic(t, url, func(o *Options) { o.Retry = retry })
	},
	Decode:       decodeMessagesRequest,
	DecodeAnswer: decodeMessagesAnswer,
	Answer: func(a modeltest.Answer) string {
		var blocks []any
		if a.Reasoning != "" {
			blocks = append(blocks,
				map[string]any{"type": "thinking", "thinking": a.Reasoning, "signature": "sig-0"},
				map[string]any{"type": "redacted_thinking", "data": "opaque"}) // only the raw blocks bring it back
		}
		if a.Text != "" {
			blocks = append(blocks, textBlock(a.Text))
		}
		stop := "end_turn"
		for _, c := range a.Calls {
			var input any
			if err := modeltest.DecodeJSON([]byte(c.Arguments), &input); err != nil {
				panic(err)
			}
			blocks = append(blocks, toolUse(c.CallID, c.Tool, input))
			stop = "tool_use"
		}
		return anthropicMessage(stop, blocks...)
	},
	ErrorBody:   anthropicErrorBody,
	FlagsErrors: true,
}

func TestMessagesConformance(t *testing.T) { modeltest.Run(t, messagesProvider) }

// messagesAssistant reads the content blocks of an assistant message as an entry.
func messagesAssistant(i int, blocks []any) (modeltest.Entry, error) {
	e := modeltest.Entry{Role: "assistant"}
	var opaque, text []any
	for k, bv := range blocks {
		b := modeltest.Obj(bv)
		switch modeltest.Str(b["type"]) {
		case "text":
			text = append(text, modeltest.Str(b["text"]))
		case "tool_use":
			if modeltest.Obj(b["input"]) == nil {
				return e, fmt.Errorf("messages.%d.content.%d: a tool_use block needs an object input", i, k)
			}
			e.Calls = append(e.Calls, modeltest.Call{ID: modeltest.Str(b["id"]), Name: modeltest.Str(b["name"]), Args: modeltest.Canon(b["input"])})
		case "thinking":
			if modeltest.Str(b["signature"]) == "" {
				return e, fmt.Errorf("messages.%d.content.%d.signature: Field required", i, k)
			}
			opaque = append(opaque, b)
		case "redacted_thinking":
			opaque = append(opaque, b)
		case "tool_result":
			return e, fmt.Errorf("messages.%d.content.%d: tool_result blocks are only accepted in user messages", i, k)
		}
	}
	for n, t := range text {
		if n > 0 {
			e.Text += "\n"
		}
		e.Text += t.(string)
	}
	if len(opaque) > 0 {
		e.Opaque = modeltest.Canon(opaque)
	}
	return e, nil
}

func decodeMessagesRequest(body []byte) ([]modeltest.Entry, error) {
	var req map[string]any
	if err := modeltest.DecodeJSON(body, &req); err != nil {
		return nil, fmt.Errorf("the body is not JSON: %v", err)
	}
	if modeltest.Str(req["model"]) == "" {
		return nil, errors.New("model: Field required")
	}
	if n := fmt.Sprint(req["max_tokens"]); n == "<nil>" || n == "0" {
		return nil, errors.New("max_tokens: Field required")
	}
	for i, tv := range modeltest.Arr(req["tools"]) {
		tool := modeltest.Obj(tv)
		if !toolbus.ValidToolName(modeltest.Str(tool["name"])) || modeltest.Str(modeltest.Obj(tool["input_schema"])["type"]) != "object" {
			return nil, fmt.Errorf("tools.%d: a tool needs a valid name and an object input_schema", i)
		}
	}
	var out []modeltest.Entry
	for _, bv := range modeltest.Arr(req["system"]) {
		b := modeltest.Obj(bv)
		if modeltest.Str(b["type"]) != "text" {
			return nil, errors.New("system: only text blocks are accepted")
		}
		out = append(out, modeltest.Entry{Role: "system", Text: modeltest.Str(b["text"])})
	}
	msgs := modeltest.Arr(req["messages"])
	if len(msgs) == 0 {
		return nil, errors.New("messages: at least one message is required")
	}
	prev := ""
	for i, mv := range msgs {
		m := modeltest.Obj(mv)
		role := modeltest.Str(m["role"])
		switch {
		case role != "user" && role != "assistant":
			return nil, fmt.Errorf("messages.%d.role: Input should be 'user' or 'assistant'", i)
		case i == 0 && role != "user":
			return nil, errors.New("messages: first message must use the \"user\" role")
		case role == prev:
			return nil, fmt.Errorf("messages.%d: roles must alternate between \"user\" and \"assistant\"", i)
		}
		prev = role
		blocks := modeltest.Arr(m["content"])
		if c, ok := m["content"].(string); ok {
			blocks = []any{map[string]any{"type": "text", "text": c}}
		}
		if len(blocks) == 0 {
			return nil, fmt.Errorf("messages.%d: all messages must have non-empty content", i)
		}
		if role == "assistant" {
			e, err := messagesAssistant(i, blocks)
			if err != nil {
				return nil, err
			}
			out = append(out, e)
			continue
		}
		var text []string
		for k, bv := range blocks {
			b := modeltest.Obj(bv)
			switch modeltest.Str(b["type"]) {
			case "tool_result":
				if len(text) > 0 {
					return nil, fmt.Errorf("messages.%d.content.%d: tool_result blocks must come first in the user message content", i, k)
				}
				e := modeltest.Entry{Role: "tool", CallID: modeltest.Str(b["tool_use_id"])}
				if v, ok := b["is_error"]; ok {
					isErr, isBool := v.(bool)
					if !isBool {
						return nil, fmt.Errorf("messages.%d.content.%d.is_error: Input should be a valid boolean", i, k)
					}
					e.IsError = isErr
				}
				for _, cv := range modeltest.Arr(b["content"]) {
					e.Text += modeltest.Str(modeltest.Obj(cv)["text"])
				}
				out = append(out, e)
			case "text":
				if modeltest.Str(b["text"]) == "" {
					return nil, fmt.Errorf("messages.%d.content.%d.text: text content blocks must be non-empty", i, k)
				}
				text = append(text, modeltest.Str(b["text"]))
			}
		}
		if len(text) > 0 {
			out = append(out, modeltest.Entry{Role: "user", Text: strings.Join(text, "\n")})
		}
	}
	return out, nil
}

func decodeMessagesAnswer(body []byte) (modeltest.Entry, bool) {
	var m map[string]any
	if modeltest.DecodeJSON(body, &m) != nil || modeltest.Str(m["type"]) != "message" {
		return modeltest.Entry{}, false
	}
	e, err := messagesAssistant(0, modeltest.Arr(m["content"]))
	return e, err == nil
}

// newAnthropicServer is a fake Messages server; base is its API base URL.
func newAnthropicServer(t *testing.T, reply func(n int, body []byte) modeltest.Reply) (*modeltest.Server, string) {
	t.Helper()
	s := modeltest.NewServer(t, messagesProvider, reply)
	return s, s.URL
}

func anthropicErrorBody(msg string) string {
	return modeltest.Canon(map[string]any{"type": "error", "error": map[string]any{"type": "invalid_request_error", "message": msg}})
}

// anthropicMessage is a Messages answer with the given content blocks.
func anthropicMessage(stop string, content ...any) string {
	return modeltest.Canon(map[string]any{
		"id": "msg_1", "type": "message", "role": "assistant", "model": "fake-claude", "content": content,
		"stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": 21, "output_tokens": 8, "cache_creation_input_tokens": 3, "cache_read_input_tokens": 4},
	})
}

func textBlock(s string) map[string]any { return map[string]any{"type": "text", "text": s} }

func toolUse(id, name string, input any) map[string]any {
	return map[string]any{"type": "tool_use", "id": id, "name": name, "input": input}
}

func newTestAnthropic(t *testing.T, base string, mod func(*Options)) *Messages {
	t.Helper()
	opts := Options{APIKey: modeltest.APIKey, BaseURL: base, Model: "claude-test", Retry: planner.RetryPolicy{MaxAttempts: 1}, Logger: discardLog}
	if mod != nil {
		mod(&opts)
	}
	m, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestAnthropicRequest(t *testing.T) {
	f, base := newAnthropicServer(t, modeltest.Always(modeltest.Reply{Body: anthropicMessage("end_turn", textBlock("INC-404 does not exist."))}))
	m := newTestAnthropic(t, base, func(o *Options) { o.MaxTokens, o.ThinkingBudget = 2048, 1024 })
	resp, err := m.Complete(context.Background(), planner.Request{RunID: "r1", Step: 2, Messages: modeltest.RichHistory(), Tools: modeltest.Tools()})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Message.Content != "INC-404 does not exist." || resp.Usage != (toolbus.Usage{InputTokens: 28, OutputTokens: 8}) || resp.Model != "fake-claude" {
		t.Fatalf("resp %+v", resp)
	}
	body := f.LastRequest()
	modeltest.CheckGolden(t, "anthropic_request.golden.json", body)

	req := decodeBody(t, body)
	if modeltest.Canon(req["system"]) != `[{"text":"You are an operations assistant.","type":"text"}]` {
		t.Errorf("system %v", req["system"])
	}
	msgs := modeltest.Arr(req["messages"])
	var shape []string
	for _, mv := range msgs {
		m := modeltest.Obj(mv)
		var parts []string
		for _, bv := range modeltest.Arr(m["content"]) {
			b := modeltest.Obj(bv)
			p := modeltest.Str(b["type"])
			switch p {
			case "tool_use":
				p += ":" + modeltest.Str(b["id"])
			case "tool_result":
				p += ":" + modeltest.Str(b["tool_use_id"])
				if b["is_error"] == true {
					p += "!"
				}
			}
			parts = append(parts, p)
		}
		shape = append(shape, modeltest.Str(m["role"])+"["+strings.Join(parts, ",")+"]")
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
	if err := modeltest.DecodeJSON([]byte(modeltest.AnthropicRaw), &fixture); err != nil {
		t.Fatal(err)
	}
	if got := modeltest.Canon(modeltest.Obj(msgs[1])["content"]); got != modeltest.Canon(fixture) {
		t.Errorf("the raw blocks were not sent back as they came:\n got %s\nwant %s", got, modeltest.Canon(fixture))
	}
	if modeltest.Canon(req["thinking"]) != `{"budget_tokens":1024,"type":"enabled"}` || fmt.Sprint(req["max_tokens"]) != "2048" {
		t.Errorf("thinking %v max_tokens %v", req["thinking"], req["max_tokens"])
	}
}

func TestNewOptions(t *testing.T) {
	if _, err := New(Options{Model: "m", MaxTokens: 2000, ThinkingBudget: 2000}); err == nil {
		t.Fatal("a thinking budget above max tokens was accepted")
	}
	if _, err := New(Options{}); err == nil || !strings.HasPrefix(err.Error(), "anthropic:") {
		t.Fatalf("err = %v", err)
	}
}

func TestAnthropicToolUse(t *testing.T) {
	step0 := anthropicMessage("tool_use",
		toolUse("", "calculator", map[string]any{"expression": "2 + 3", "precision": 2}),
		toolUse("dup", "calculator", map[string]any{}),
		toolUse("dup", "lookup_incident", nil))
	f, base := newAnthropicServer(t, func(n int, _ []byte) modeltest.Reply {
		return modeltest.Reply{Body: []string{step0, anthropicMessage("end_turn", textBlock("done"))}[min(n, 1)]}
	})
	m := newTestAnthropic(t, base, nil)
	r0, err := m.Complete(context.Background(), planner.Request{Step: 6, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
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
	f.Forget() // the ids were rewritten on purpose; only check they line up
	if _, err := m.Complete(context.Background(), planner.Request{Step: 7, Messages: history}); err != nil {
		t.Fatalf("normalized ids were not sent back consistently: %v", err)
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
	f, base := newAnthropicServer(t, func(n int, _ []byte) modeltest.Reply {
		if n == 0 {
			return modeltest.Reply{SSE: true, Body: sse(anthropicStream...)}
		}
		return modeltest.Reply{SSE: true, Body: sse(strings.Replace(anthropicStream[0], `"content":[]`, `"content":[{"type":"text","text":"5"}]`, 1),
			`message_delta {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}`,
			`message_stop {"type":"message_stop"}`)}
	})
	m := newTestAnthropic(t, base, func(o *Options) { o.Stream = true })
	r0, err := m.Complete(context.Background(), planner.Request{Step: 0, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
	if err != nil {
		t.Fatal(err)
	}
	modeltest.CheckAnswer(t, r0)
	if r0.Message.Content != "Computing." || r0.Message.Reasoning != "Needs the calculator." || r0.Message.ReasoningSignature != "sig-s" ||
		len(r0.Message.ToolCalls) != 1 || r0.Message.ToolCalls[0].Arguments != `{"expression":"2+3"}` || r0.Usage != (toolbus.Usage{InputTokens: 30, OutputTokens: 15}) {
		t.Fatalf("resp %+v", r0)
	}
	if decodeBody(t, f.LastRequest())["stream"] != true {
		t.Fatal("the request did not ask for a stream")
	}
	// The aggregated blocks go back as the model made them.
	if _, err := m.Complete(context.Background(), planner.Request{Step: 1, Messages: modeltest.TwoStep(r0.Message, "5")}); err != nil {
		t.Fatal(err)
	}
	req := decodeBody(t, f.LastRequest())
	got := modeltest.Canon(modeltest.Obj(modeltest.Arr(req["messages"])[1])["content"])
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
			_, base := newAnthropicServer(t, modeltest.Always(modeltest.Reply{SSE: true, Body: body}))
			_, err := newTestAnthropic(t, base, func(o *Options) { o.Stream = true }).
				Complete(context.Background(), planner.Request{Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
			var pe *planner.ProviderError
			if err == nil || errors.Is(err, planner.ErrPermanent) || !errors.As(err, &pe) || !pe.Retryable {
				t.Fatalf("err = %v, want a retryable provider error", err)
			}
		})
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
		m, err := New(Options{APIKey: "k", BaseURL: "http://fake.invalid", Model: "m", Stream: stream,
			HTTPClient: &http.Client{Transport: modeltest.BytesTransport{Status: 200, ContentType: ct, Body: body}},
			Retry:      planner.RetryPolicy{MaxAttempts: 1}})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := m.Complete(context.Background(), planner.Request{Step: 1, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
		if err == nil {
			modeltest.CheckAnswer(t, resp)
		}
	})
}

func decodeBody(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := modeltest.DecodeJSON(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return m
}
