package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/internal/wire"
	"github.com/toolbus/toolbus/planner/modeltest"
)

var discardLog = slog.New(slog.DiscardHandler)

// chatProvider is the Chat Completions wire format for the conformance suite.
var chatProvider = modeltest.Provider{
	Name: "openai",
	Path: "/v1/chat/completions",
	New: func(t *testing.T, url string, retry planner.RetryPolicy) planner.Model {
		return newTestChat(t, url+"/v1", func(o *ChatOptions) { o.Retry = retry })
	},
	Decode:       decodeChatRequest,
	DecodeAnswer: decodeChatAnswer,
	Answer: func(a modeltest.Answer) string {
		msg := map[string]any{"content": a.Text}
		if a.Reasoning != "" {
			msg["reasoning_content"] = a.Reasoning // DeepSeek's thinking mode: it must come back
		}
		var calls []any
		for _, c := range a.Calls {
			calls = append(calls, chatCall(c.CallID, c.Tool, c.Arguments))
		}
		if len(calls) > 0 {
			msg["tool_calls"] = calls
			return chatCompletion(msg, "tool_calls")
		}
		return chatCompletion(msg, "stop")
	},
	ErrorBody: openaiErrorBody,
}

func TestChatConformance(t *testing.T) { modeltest.Run(t, chatProvider) }

// chatReasoningKeys are the fields compatible servers carry reasoning in; what they
// hold must come back unmodified.
var chatReasoningKeys = []string{"reasoning_content", "reasoning"}

// chatEntry reads a Chat Completions message (request or answer) as an entry.
func chatEntry(i int, m map[string]any) (modeltest.Entry, error) {
	e := modeltest.Entry{Role: modeltest.Str(m["role"]), Text: modeltest.Str(m["content"])}
	switch e.Role {
	case "developer":
		e.Role = "system"
	case "assistant":
		for k, tcv := range modeltest.Arr(m["tool_calls"]) {
			tc := modeltest.Obj(tcv)
			fn := modeltest.Obj(tc["function"])
			args, ok := fn["arguments"].(string)
			if modeltest.Str(tc["type"]) != "function" || !ok {
				return e, fmt.Errorf("messages[%d].tool_calls[%d]: a tool call needs type function and string arguments", i, k)
			}
			e.Calls = append(e.Calls, modeltest.Call{ID: modeltest.Str(tc["id"]), Name: modeltest.Str(fn["name"]), Args: args})
		}
		opaque := map[string]any{}
		for _, k := range chatReasoningKeys {
			if v, ok := m[k]; ok && v != nil {
				opaque[k] = v
			}
		}
		if len(opaque) > 0 {
			e.Opaque = modeltest.Canon(opaque)
		}
		return e, nil
	case "tool":
		e.CallID = modeltest.Str(m["tool_call_id"])
	}
	if _, ok := m["content"].(string); !ok {
		return e, fmt.Errorf("messages[%d].content must be a string", i)
	}
	return e, nil
}

func decodeChatRequest(body []byte) ([]modeltest.Entry, error) {
	var req map[string]any
	if err := modeltest.DecodeJSON(body, &req); err != nil {
		return nil, fmt.Errorf("the body is not JSON: %v", err)
	}
	if modeltest.Str(req["model"]) == "" {
		return nil, errors.New("you must provide a model parameter")
	}
	for i, tv := range modeltest.Arr(req["tools"]) {
		tool := modeltest.Obj(tv)
		fn := modeltest.Obj(tool["function"])
		if modeltest.Str(tool["type"]) != "function" || !toolbus.ValidToolName(modeltest.Str(fn["name"])) || modeltest.Str(modeltest.Obj(fn["parameters"])["type"]) != "object" {
			return nil, fmt.Errorf("invalid 'tools[%d]': a function tool needs a valid name and object parameters", i)
		}
	}
	msgs := modeltest.Arr(req["messages"])
	if len(msgs) == 0 {
		return nil, errors.New("'messages' must contain at least one message")
	}
	out := make([]modeltest.Entry, 0, len(msgs))
	for i, mv := range msgs {
		e, err := chatEntry(i, modeltest.Obj(mv))
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func decodeChatAnswer(body []byte) (modeltest.Entry, bool) {
	var cc map[string]any
	if modeltest.DecodeJSON(body, &cc) != nil || len(modeltest.Arr(cc["choices"])) == 0 {
		return modeltest.Entry{}, false
	}
	e, err := chatEntry(0, modeltest.Obj(modeltest.Obj(modeltest.Arr(cc["choices"])[0])["message"]))
	return e, err == nil && e.Role == "assistant"
}

func openaiErrorBody(msg string) string {
	return modeltest.Canon(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "param": nil, "code": nil}})
}

// chatCompletion is a Chat Completions answer carrying msg.
func chatCompletion(msg map[string]any, finish string) string {
	if _, ok := msg["role"]; !ok {
		msg["role"] = "assistant"
	}
	return modeltest.Canon(map[string]any{
		"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "fake-model",
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish, "logprobs": nil}},
		"usage":   map[string]any{"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
	})
}

func chatCall(id, name, args string) map[string]any {
	return map[string]any{"id": id, "type": "function", "function": map[string]any{"name": name, "arguments": args}}
}

// newChatServer is a fake Chat Completions server; base is its API base URL.
func newChatServer(t *testing.T, reply func(n int, body []byte) modeltest.Reply) (*modeltest.Server, string) {
	t.Helper()
	s := modeltest.NewServer(t, chatProvider, reply)
	return s, s.URL + "/v1"
}

func newTestChat(t *testing.T, base string, mod func(*ChatOptions)) *Chat {
	t.Helper()
	opts := ChatOptions{APIKey: modeltest.APIKey, BaseURL: base, Model: "gpt-test", Retry: planner.RetryPolicy{MaxAttempts: 1}, Logger: discardLog}
	if mod != nil {
		mod(&opts)
	}
	m, err := NewChat(opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func decodeBody(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return m
}

func TestNewRequiresAModel(t *testing.T) {
	if _, err := NewChat(ChatOptions{}); err == nil || !strings.HasPrefix(err.Error(), "openai: ") {
		t.Fatalf("err = %v", err)
	}
	if _, err := NewResponses(ResponsesOptions{}); err == nil || !strings.HasPrefix(err.Error(), "openai-responses: ") {
		t.Fatalf("err = %v", err)
	}
}

func TestOpenAIChatRequest(t *testing.T) {
	f, base := newChatServer(t, modeltest.Always(modeltest.Reply{Body: chatCompletion(map[string]any{"content": "INC-404 does not exist."}, "stop")}))
	m := newTestChat(t, base, func(o *ChatOptions) { o.MaxTokens = 512 })
	resp, err := m.Complete(context.Background(), planner.Request{RunID: "r1", Step: 2, Messages: modeltest.RichHistory(), Tools: modeltest.Tools()})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Message.Content != "INC-404 does not exist." || resp.Usage != (toolbus.Usage{InputTokens: 11, OutputTokens: 7}) || resp.Model != "fake-model" {
		t.Fatalf("resp = %+v", resp)
	}
	body := f.LastRequest()
	modeltest.CheckGolden(t, "openai_chat_request.golden.json", body)

	req := decodeBody(t, body)
	var roles []string
	for _, mv := range modeltest.Arr(req["messages"]) {
		m := modeltest.Obj(mv)
		r := modeltest.Str(m["role"])
		if r == "tool" {
			r += ":" + modeltest.Str(m["tool_call_id"])
		}
		roles = append(roles, r)
		if modeltest.Str(m["role"]) == "user" && strings.Contains(modeltest.Str(m["content"]), "incident_not_found") {
			t.Errorf("a tool result was sent as user text: %v", m)
		}
	}
	want := "system,user,assistant,tool:call_a,tool:call_b,tool:call_c,assistant,tool:call_d,user"
	if got := strings.Join(roles, ","); got != want {
		t.Errorf("messages %s, want %s (one tool message per call, right after its assistant message, in call order)", got, want)
	}
	first := modeltest.Obj(modeltest.Arr(req["messages"])[2])
	if modeltest.Str(first["content"]) != "Let me look." || modeltest.Str(first["reasoning_content"]) != "Two lookups and a computation are needed." {
		t.Errorf("the assistant message was not sent whole: %v", first)
	}
	if got := modeltest.Str(modeltest.Obj(modeltest.Obj(modeltest.Arr(first["tool_calls"])[2])["function"])["arguments"]); got != `{"expression": "1/0"` {
		t.Errorf("malformed arguments were not sent back raw: %q", got)
	}
	if second := modeltest.Obj(modeltest.Arr(req["messages"])[6]); second["reasoning_content"] != nil {
		t.Errorf("reasoning without an OpenAI raw part must not be invented: %v", second)
	}
	if modeltest.Str(req["model"]) != "gpt-test" || fmt.Sprint(req["max_completion_tokens"]) != "512" {
		t.Errorf("model %v, max_completion_tokens %v", req["model"], req["max_completion_tokens"])
	}
	tools := modeltest.Arr(req["tools"])
	if len(tools) != 2 || modeltest.Canon(modeltest.Obj(modeltest.Obj(tools[0])["function"])["parameters"]) != modeltest.Canon(mustJSON(modeltest.Tools()[0].InputSchema)) {
		t.Errorf("tools %v", tools)
	}
}

func mustJSON(b []byte) any {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		panic(err)
	}
	return v
}

func TestOpenAIChatResponses(t *testing.T) {
	tests := []struct {
		name  string
		msg   map[string]any
		step  int
		check func(t *testing.T, m toolbus.Message)
	}{
		{name: "malformed arguments pass through raw", msg: map[string]any{"content": nil,
			"tool_calls": []any{chatCall("c1", "calculator", `{"expression": "1/0"`)}},
			check: func(t *testing.T, m toolbus.Message) {
				if m.ToolCalls[0].Arguments != `{"expression": "1/0"` {
					t.Fatalf("arguments %q", m.ToolCalls[0].Arguments)
				}
			}},
		{name: "arguments sent as an object are kept as JSON", msg: map[string]any{
			"tool_calls": []any{map[string]any{"id": "c1", "type": "function", "function": map[string]any{"name": "calculator", "arguments": map[string]any{"expression": "1+1"}}}}},
			check: func(t *testing.T, m toolbus.Message) {
				if m.ToolCalls[0].Arguments != `{"expression":"1+1"}` {
					t.Fatalf("arguments %q", m.ToolCalls[0].Arguments)
				}
			}},
		{name: "empty and duplicate ids get stable unique ids", step: 3, msg: map[string]any{"tool_calls": []any{
			chatCall("", "calculator", `{}`), chatCall("dup", "calculator", `{}`), chatCall("dup", "calculator", `{}`)}},
			check: func(t *testing.T, m toolbus.Message) {
				var ids []string
				for _, c := range m.ToolCalls {
					ids = append(ids, c.CallID)
				}
				if strings.Join(ids, ",") != "call_3_0,dup,call_3_2" {
					t.Fatalf("ids %v", ids)
				}
			}},
		{name: "refusal becomes the answer", msg: map[string]any{"content": nil, "refusal": "I cannot help with that."},
			check: func(t *testing.T, m toolbus.Message) {
				if m.Content != "I cannot help with that." {
					t.Fatalf("content %q", m.Content)
				}
			}},
		{name: "reasoning field of compatible servers", msg: map[string]any{"content": "5", "reasoning": "2+3=5", "audio": nil},
			check: func(t *testing.T, m toolbus.Message) {
				if m.Reasoning != "2+3=5" || string(wire.ReadRaw(m.Raw).OpenAIChat) != `{"reasoning":"2+3=5"}` {
					t.Fatalf("reasoning %q raw %s", m.Reasoning, m.Raw)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, base := newChatServer(t, modeltest.Always(modeltest.Reply{Body: chatCompletion(tt.msg, "tool_calls")}))
			m := newTestChat(t, base, nil)
			var first []toolbus.ToolCall
			for range 2 { // the same answer twice gives the same ids
				resp, err := m.Complete(context.Background(), planner.Request{Step: tt.step, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
				if err != nil {
					t.Fatal(err)
				}
				modeltest.CheckAnswer(t, resp)
				tt.check(t, resp.Message)
				if first != nil && !slices.Equal(first, resp.Message.ToolCalls) {
					t.Fatalf("ids not stable: %v then %v", first, resp.Message.ToolCalls)
				}
				first = resp.Message.ToolCalls
			}
		})
	}
}

const chatStream = `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":"Think"},"finish_reason":null}]}

data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"reasoning_content":"ing."},"finish_reason":null}]}

data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"content":"Computing."},"finish_reason":null}]}

data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"calculator","arguments":""}}]},"finish_reason":null}]}

data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"expr"}}]},"finish_reason":null}]}

data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"lookup_incident","arguments":"{\"incident_id\":"}}]},"finish_reason":null}]}

data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ession\":\"2+3\"}"}}]},"finish_reason":null}]}

data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"INC-001\"}"}}]},"finish_reason":null}]}

data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}

data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":9,"total_tokens":29}}

data: [DONE]

`

func TestOpenAIChatStream(t *testing.T) {
	f, base := newChatServer(t, modeltest.Always(modeltest.Reply{SSE: true, Body: chatStream}))
	m := newTestChat(t, base, func(o *ChatOptions) { o.Stream = true })
	resp, err := m.Complete(context.Background(), planner.Request{Step: 0, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}, Tools: modeltest.Tools()})
	if err != nil {
		t.Fatal(err)
	}
	modeltest.CheckAnswer(t, resp)
	want := []toolbus.ToolCall{
		{CallID: "call_1", Tool: "calculator", Arguments: `{"expression":"2+3"}`},
		{CallID: "call_2", Tool: "lookup_incident", Arguments: `{"incident_id":"INC-001"}`},
	}
	if !slices.Equal(resp.Message.ToolCalls, want) {
		t.Fatalf("calls %+v, want %+v", resp.Message.ToolCalls, want)
	}
	if resp.Message.Content != "Computing." || resp.Message.Reasoning != "Thinking." || resp.Usage != (toolbus.Usage{InputTokens: 20, OutputTokens: 9}) {
		t.Fatalf("resp %+v", resp)
	}
	if got := string(wire.ReadRaw(resp.Message.Raw).OpenAIChat); got != `{"reasoning_content":"Thinking."}` {
		t.Fatalf("raw %s", got)
	}
	req := decodeBody(t, f.LastRequest())
	if req["stream"] != true || modeltest.Obj(req["stream_options"])["include_usage"] != true {
		t.Fatalf("stream options: %v %v", req["stream"], req["stream_options"])
	}
}

func TestOpenAIChatStreamCutShort(t *testing.T) {
	cut := strings.Join(strings.Split(chatStream, "\n\n")[:6], "\n\n") + "\n\n" // no finish_reason, no [DONE]
	_, base := newChatServer(t, modeltest.Always(modeltest.Reply{SSE: true, Body: cut}))
	m := newTestChat(t, base, func(o *ChatOptions) { o.Stream = true })
	_, err := m.Complete(context.Background(), planner.Request{Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
	var pe *planner.ProviderError
	if !errors.As(err, &pe) || !pe.Retryable || !strings.Contains(err.Error(), "stream ended") {
		t.Fatalf("err = %v, want a retryable cut-stream error", err)
	}
}

func FuzzOpenAIResponse(f *testing.F) {
	f.Add([]byte(chatCompletion(map[string]any{"content": "hi", "tool_calls": []any{chatCall("", "calculator", `{"x`)}}, "tool_calls")), false)
	f.Add([]byte(`{"choices":[{"message":{"tool_calls":[{"id":1,"function":null}]}}],"usage":{"prompt_tokens":"x"}}`), false)
	f.Add([]byte(`{"choices":null}`), false)
	f.Add([]byte(chatStream), true)
	f.Add([]byte("data: {\"choices\":[{\"index\":200,\"delta\":{\"tool_calls\":[{\"index\":-5}]}}]}\n\n"), true)
	f.Add([]byte("data: [DONE]\n\n"), true)
	f.Add([]byte("\x00\xff"), false)
	f.Fuzz(func(t *testing.T, body []byte, stream bool) {
		ct := "application/json"
		if stream {
			ct = "text/event-stream"
		}
		m, err := NewChat(ChatOptions{APIKey: "k", BaseURL: "http://fake.invalid/v1", Model: "m", Stream: stream,
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
