package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
)

// chatRules are the Chat Completions rules the fake enforces: the documented ones
// (every tool_call_id answered by a tool message before any other message, no tool
// message without a preceding assistant tool call, known roles) plus toolbus's own
// (results in call order), and the one DeepSeek adds in thinking mode (an assistant
// message that came with reasoning_content goes back with it).
func chatRules(f *fake, req map[string]any) string {
	if jstr(req["model"]) == "" {
		return "you must provide a model parameter"
	}
	msgs := jarr(req["messages"])
	if len(msgs) == 0 {
		return "'messages' must contain at least one message"
	}
	for i, tv := range jarr(req["tools"]) {
		tool := jobj(tv)
		fn := jobj(tool["function"])
		if jstr(tool["type"]) != "function" || !toolbus.ValidToolName(jstr(fn["name"])) || jstr(jobj(fn["parameters"])["type"]) != "object" {
			return fmt.Sprintf("Invalid 'tools[%d]': a function tool needs a valid name and object parameters", i)
		}
	}
	missing := func(pending []string) string {
		return "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. " +
			"The following tool_call_ids did not have response messages: " + strings.Join(pending, ", ")
	}
	sent := f.sentJSON()
	var pending []string
	answerable := map[string]bool{}
	for i, mv := range msgs {
		m := jobj(mv)
		switch role := jstr(m["role"]); role {
		case "system", "developer", "user", "assistant":
			if len(pending) > 0 {
				return missing(pending)
			}
			answerable = map[string]bool{}
			if role != "assistant" {
				if _, ok := m["content"].(string); !ok {
					return fmt.Sprintf("messages[%d].content must be a string", i)
				}
				continue
			}
			for k, tcv := range jarr(m["tool_calls"]) {
				tc := jobj(tcv)
				fn := jobj(tc["function"])
				if jstr(tc["id"]) == "" || jstr(tc["type"]) != "function" || jstr(fn["name"]) == "" {
					return fmt.Sprintf("messages[%d].tool_calls[%d]: a tool call needs an id, type function and a name", i, k)
				}
				if _, ok := fn["arguments"].(string); !ok {
					return fmt.Sprintf("messages[%d].tool_calls[%d].function.arguments must be a string", i, k)
				}
				pending = append(pending, jstr(tc["id"]))
				answerable[jstr(tc["id"])] = true
			}
			if msg := chatSentBack(sent, i, m); msg != "" {
				return msg
			}
		case "tool":
			id := jstr(m["tool_call_id"])
			if !answerable[id] {
				return "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."
			}
			if !slices.Contains(pending, id) {
				return fmt.Sprintf("messages[%d]: tool_call_id %s is answered twice", i, id)
			}
			if pending[0] != id {
				return fmt.Sprintf("messages[%d]: tool messages must answer the tool calls in call order: expected %s, got %s", i, pending[0], id)
			}
			pending = pending[1:]
			if _, ok := m["content"].(string); !ok {
				return fmt.Sprintf("messages[%d].content must be a string", i)
			}
		default:
			return fmt.Sprintf("Invalid value: '%s'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'.", role)
		}
	}
	if len(pending) > 0 {
		return missing(pending)
	}
	return ""
}

// chatSentBack checks that an assistant message the fake sent comes back whole.
func chatSentBack(sent []map[string]any, i int, m map[string]any) string {
	calls := jarr(m["tool_calls"])
	if len(calls) == 0 {
		return ""
	}
	first := jstr(jobj(calls[0])["id"])
	for _, s := range sent {
		orig := jobj(jobj(jarr(s["choices"])[0])["message"])
		oc := jarr(orig["tool_calls"])
		if len(oc) == 0 || jstr(jobj(oc[0])["id"]) != first {
			continue
		}
		if canon(oc) != canon(calls) {
			return fmt.Sprintf("messages[%d]: the tool calls differ from the ones the model made", i)
		}
		if jstr(orig["content"]) != jstr(m["content"]) {
			return fmt.Sprintf("messages[%d]: the assistant content differs from the model's", i)
		}
		if r, ok := orig["reasoning_content"]; ok && canon(m["reasoning_content"]) != canon(r) {
			return fmt.Sprintf("Missing `reasoning_content` field in the assistant message at message index %d", i)
		}
	}
	return ""
}

func openaiErrorBody(msg string) string {
	return canon(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "param": nil, "code": nil}})
}

func newChatFake(t *testing.T, reply func(n int, req map[string]any) fakeReply) (*fake, string) {
	t.Helper()
	f := &fake{t: t, path: "/v1/chat/completions", rules: chatRules, errorBody: openaiErrorBody, reply: reply}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL + "/v1"
}

// chatCompletion is a Chat Completions answer carrying msg.
func chatCompletion(msg map[string]any, finish string) string {
	if _, ok := msg["role"]; !ok {
		msg["role"] = "assistant"
	}
	return canon(map[string]any{
		"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "fake-model",
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish, "logprobs": nil}},
		"usage":   map[string]any{"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
	})
}

func chatCall(id, name, args string) map[string]any {
	return map[string]any{"id": id, "type": "function", "function": map[string]any{"name": name, "arguments": args}}
}

func always(r fakeReply) func(int, map[string]any) fakeReply {
	return func(int, map[string]any) fakeReply { return r }
}

func newTestOpenAI(t *testing.T, base string, mod func(*OpenAIOptions)) *OpenAI {
	t.Helper()
	opts := OpenAIOptions{APIKey: "test-key", BaseURL: base, Model: "gpt-test", Retry: RetryPolicy{MaxAttempts: 1}, Logger: discardLog}
	if mod != nil {
		mod(&opts)
	}
	m, err := NewOpenAI(opts)
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

func TestOpenAIChatRequest(t *testing.T) {
	f, base := newChatFake(t, always(fakeReply{body: chatCompletion(map[string]any{"content": "INC-404 does not exist."}, "stop")}))
	m := newTestOpenAI(t, base, func(o *OpenAIOptions) { o.MaxTokens = 512 })
	resp, err := m.Complete(context.Background(), Request{RunID: "r1", Step: 2, Messages: richHistory(), Tools: fixtureTools()})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Message.Content != "INC-404 does not exist." || resp.Usage != (toolbus.Usage{InputTokens: 11, OutputTokens: 7}) || resp.Model != "fake-model" {
		t.Fatalf("resp = %+v", resp)
	}
	body := f.lastRequest()
	checkGolden(t, "openai_chat_request.golden.json", body)

	req := decodeBody(t, body)
	var roles []string
	for _, mv := range jarr(req["messages"]) {
		m := jobj(mv)
		r := jstr(m["role"])
		if r == "tool" {
			r += ":" + jstr(m["tool_call_id"])
		}
		roles = append(roles, r)
		if jstr(m["role"]) == "user" && strings.Contains(jstr(m["content"]), "incident_not_found") {
			t.Errorf("a tool result was sent as user text: %v", m)
		}
	}
	want := "system,user,assistant,tool:call_a,tool:call_b,tool:call_c,assistant,tool:call_d,user"
	if got := strings.Join(roles, ","); got != want {
		t.Errorf("messages %s, want %s (one tool message per call, right after its assistant message, in call order)", got, want)
	}
	first := jobj(jarr(req["messages"])[2])
	if jstr(first["content"]) != "Let me look." || jstr(first["reasoning_content"]) != "Two lookups and a computation are needed." {
		t.Errorf("the assistant message was not sent whole: %v", first)
	}
	if got := jstr(jobj(jobj(jarr(first["tool_calls"])[2])["function"])["arguments"]); got != `{"expression": "1/0"` {
		t.Errorf("malformed arguments were not sent back raw: %q", got)
	}
	if second := jobj(jarr(req["messages"])[6]); second["reasoning_content"] != nil {
		t.Errorf("reasoning without an OpenAI raw part must not be invented: %v", second)
	}
	if jstr(req["model"]) != "gpt-test" || fmt.Sprint(req["max_completion_tokens"]) != "512" {
		t.Errorf("model %v, max_completion_tokens %v", req["model"], req["max_completion_tokens"])
	}
	tools := jarr(req["tools"])
	if len(tools) != 2 || canon(jobj(jobj(tools[0])["function"])["parameters"]) != canon(mustJSON(fixtureTools()[0].InputSchema)) {
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

func TestOpenAIChatRoundTrip(t *testing.T) {
	step0 := chatCompletion(map[string]any{
		"content": "I will compute it.", "reasoning_content": "2+3 needs the calculator.",
		"tool_calls": []any{chatCall("call_x", "calculator", `{"expression":"2+3"}`)},
	}, "tool_calls")
	step1 := chatCompletion(map[string]any{"content": "2+3 = 5."}, "stop")
	f, base := newChatFake(t, func(n int, _ map[string]any) fakeReply {
		return fakeReply{body: []string{step0, step1}[min(n, 1)]}
	})
	m := newTestOpenAI(t, base, nil)
	ctx := context.Background()
	history := []toolbus.Message{{Role: toolbus.RoleSystem, Content: "sys"}, {Role: toolbus.RoleUser, Content: "What is 2+3?"}}
	r0, err := m.Complete(ctx, Request{RunID: "r", Step: 0, Messages: history, Tools: fixtureTools()})
	if err != nil {
		t.Fatal(err)
	}
	if r0.Message.Reasoning != "2+3 needs the calculator." || len(r0.Message.ToolCalls) != 1 {
		t.Fatalf("step 0: %+v", r0.Message)
	}
	r1, err := m.Complete(ctx, Request{RunID: "r", Step: 1, Messages: twoStep(r0.Message, `{"value":5}`), Tools: fixtureTools()})
	if err != nil {
		t.Fatal(err)
	}
	if r1.Message.Content != "2+3 = 5." {
		t.Fatalf("step 1: %+v", r1.Message)
	}
	if _, accepted, rejected := f.counts(); accepted != 2 || len(rejected) != 0 {
		t.Fatalf("accepted %d, rejected %v", accepted, rejected)
	}

	// Dropping what the server sent (here reasoning_content) is refused by the server;
	// the adapter fails the run with the server's own message.
	stripped := r0.Message
	stripped.Raw = nil
	_, err = m.Complete(ctx, Request{RunID: "r", Step: 1, Messages: twoStep(stripped, `{"value":5}`)})
	if !errors.Is(err, ErrPermanent) || !strings.Contains(err.Error(), "Missing `reasoning_content`") {
		t.Fatalf("err = %v, want a permanent error with the provider's message", err)
	}
	var pe *ProviderError
	if !errors.As(err, &pe) || pe.Status != 400 || !strings.HasPrefix(pe.Error(), "openai: 400") {
		t.Fatalf("provider error %+v", pe)
	}
}

func TestOpenAIChatFakeEnforcesRules(t *testing.T) {
	_, base := newChatFake(t, always(fakeReply{body: chatCompletion(map[string]any{"content": "ok"}, "stop")}))
	url := base + "/chat/completions"
	asst := `{"role":"assistant","content":null,"tool_calls":[` +
		`{"id":"a","type":"function","function":{"name":"calculator","arguments":"{}"}},` +
		`{"id":"b","type":"function","function":{"name":"calculator","arguments":"{}"}}]}`
	user := `{"role":"user","content":"q"}`
	tool := func(id string) string { return `{"role":"tool","tool_call_id":"` + id + `","content":"5"}` }
	tests := []struct {
		name, msgs, want string
	}{
		{"valid", user + "," + asst + "," + tool("a") + "," + tool("b"), ""},
		{"orphan tool result", user + "," + tool("a"), "must be a response to a preceeding message with 'tool_calls'"},
		{"tool_call_id with no matching call", user + "," + asst + "," + tool("a") + "," + tool("b") + "," + tool("c"), "must be a response to a preceeding message"},
		{"missing tool result", user + "," + asst + "," + tool("a") + "," + user, "did not have response messages: b"},
		{"tool result as user text", user + "," + asst + `,{"role":"user","content":"results: a=5, b=5"}`, "did not have response messages: a, b"},
		{"wrong role", user + `,{"role":"model","content":"x"}`, "Invalid value: 'model'"},
		{"wrong order", user + "," + asst + "," + tool("b") + "," + tool("a"), "in call order"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := post(t, url, `{"model":"m","messages":[`+tt.msgs+`]}`)
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
				if m.Reasoning != "2+3=5" || string(readRaw(m.Raw).OpenAIChat) != `{"reasoning":"2+3=5"}` {
					t.Fatalf("reasoning %q raw %s", m.Reasoning, m.Raw)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, base := newChatFake(t, always(fakeReply{body: chatCompletion(tt.msg, "tool_calls")}))
			m := newTestOpenAI(t, base, nil)
			var first []toolbus.ToolCall
			for range 2 { // the same answer twice gives the same ids
				resp, err := m.Complete(context.Background(), Request{Step: tt.step, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
				if err != nil {
					t.Fatal(err)
				}
				checkAnswer(t, resp)
				tt.check(t, resp.Message)
				if first != nil && !slices.Equal(first, resp.Message.ToolCalls) {
					t.Fatalf("ids not stable: %v then %v", first, resp.Message.ToolCalls)
				}
				first = resp.Message.ToolCalls
			}
		})
	}
}

func TestOpenAIChatMalformedAnswers(t *testing.T) {
	for name, body := range map[string]string{
		"no choices": `{"id":"x","object":"chat.completion","choices":[]}`,
		"not json":   `<html>bad gateway</html>`,
	} {
		t.Run(name, func(t *testing.T) {
			_, base := newChatFake(t, always(fakeReply{body: body}))
			_, err := newTestOpenAI(t, base, nil).Complete(context.Background(), Request{Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
			var pe *ProviderError
			if err == nil || errors.Is(err, ErrPermanent) || !errors.As(err, &pe) || !pe.Retryable {
				t.Fatalf("err = %v, want a retryable provider error", err)
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
	f, base := newChatFake(t, always(fakeReply{sse: true, body: chatStream}))
	m := newTestOpenAI(t, base, func(o *OpenAIOptions) { o.Stream = true })
	resp, err := m.Complete(context.Background(), Request{Step: 0, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}, Tools: fixtureTools()})
	if err != nil {
		t.Fatal(err)
	}
	checkAnswer(t, resp)
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
	if got := string(readRaw(resp.Message.Raw).OpenAIChat); got != `{"reasoning_content":"Thinking."}` {
		t.Fatalf("raw %s", got)
	}
	req := decodeBody(t, f.lastRequest())
	if req["stream"] != true || jobj(req["stream_options"])["include_usage"] != true {
		t.Fatalf("stream options: %v %v", req["stream"], req["stream_options"])
	}
}

func TestOpenAIChatStreamCutShort(t *testing.T) {
	cut := strings.Join(strings.Split(chatStream, "\n\n")[:6], "\n\n") + "\n\n" // no finish_reason, no [DONE]
	_, base := newChatFake(t, always(fakeReply{sse: true, body: cut}))
	m := newTestOpenAI(t, base, func(o *OpenAIOptions) { o.Stream = true })
	_, err := m.Complete(context.Background(), Request{Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
	var pe *ProviderError
	if !errors.As(err, &pe) || !pe.Retryable || !strings.Contains(err.Error(), "stream ended") {
		t.Fatalf("err = %v, want a retryable cut-stream error", err)
	}
}

func TestOpenAIChatRetries(t *testing.T) {
	ok := fakeReply{body: chatCompletion(map[string]any{"content": "done"}, "stop")}
	tests := []struct {
		name      string
		replies   []fakeReply
		attempts  int
		wantReqs  int
		wantWaits []time.Duration
		wantErr   string
		permanent bool
	}{
		{name: "429 with Retry-After then success", attempts: 4, wantReqs: 2, wantWaits: []time.Duration{2 * time.Second},
			replies: []fakeReply{{status: 429, header: map[string]string{"Retry-After": "2"}, body: openaiErrorBody("Rate limit reached")}, ok}},
		// An hour is past the cap: give up at once; the planner retries the step later.
		{name: "Retry-After as an HTTP date", attempts: 4, wantReqs: 1,
			replies: []fakeReply{{status: 503, header: map[string]string{"Retry-After": time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)}, body: openaiErrorBody("overloaded")}, ok},
			wantErr: "more than the 1m0s cap"},
		{name: "500 every time gives up", attempts: 3, wantReqs: 3,
			replies: []fakeReply{{status: 500, body: openaiErrorBody("The server had an error")}},
			wantErr: "giving up after 3 attempts"},
		{name: "502 with a non-JSON body is retried", attempts: 2, wantReqs: 2,
			replies: []fakeReply{{status: 502, header: map[string]string{"Content-Type": "text/html"}, body: "upstream connect error"}, ok}},
		{name: "400 fails the run with the provider's message", attempts: 4, wantReqs: 1, permanent: true,
			replies: []fakeReply{{status: 400, body: openaiErrorBody("Invalid 'messages[1].content': string too long.")}},
			wantErr: "openai: 400 Bad Request: Invalid 'messages[1].content': string too long."},
		{name: "401 fails the run", attempts: 4, wantReqs: 1, permanent: true,
			replies: []fakeReply{{status: 401, body: openaiErrorBody("Incorrect API key provided")}},
			wantErr: "Incorrect API key provided"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, base := newChatFake(t, func(n int, _ map[string]any) fakeReply { return tt.replies[min(n, len(tt.replies)-1)] })
			var s sleeps
			m := newTestOpenAI(t, base, func(o *OpenAIOptions) { o.Retry = fastRetry(tt.attempts, &s) })
			resp, err := m.Complete(context.Background(), Request{Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
			reqs, _, _ := f.counts()
			if tt.wantErr == "" && (err != nil || resp.Message.Content != "done") {
				t.Fatalf("err = %v resp %+v", err, resp)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			if errors.Is(err, ErrPermanent) != tt.permanent {
				t.Fatalf("permanent = %v, want %v: %v", errors.Is(err, ErrPermanent), tt.permanent, err)
			}
			if reqs != tt.wantReqs {
				t.Fatalf("%d requests, want %d", reqs, tt.wantReqs)
			}
			if tt.wantWaits != nil && !slices.Equal(s.waits(), tt.wantWaits) {
				t.Fatalf("waits %v, want %v", s.waits(), tt.wantWaits)
			}
		})
	}
}

func TestOpenAIChatAttemptTimeoutIsRetried(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices a closed connection only once the body is read
		if n.Add(1) == 1 {
			<-r.Context().Done() // the first attempt hangs until the client gives up on it
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, chatCompletion(map[string]any{"content": "done"}, "stop"))
	}))
	defer srv.Close()
	var s sleeps
	m := newTestOpenAI(t, srv.URL+"/v1", func(o *OpenAIOptions) {
		o.Retry = fastRetry(3, &s)
		o.Retry.AttemptTimeout = 200 * time.Millisecond
	})
	resp, err := m.Complete(context.Background(), Request{Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
	if err != nil || resp.Message.Content != "done" || n.Load() != 2 {
		t.Fatalf("err %v, content %q after %d requests", err, resp.Message.Content, n.Load())
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
		m, err := NewOpenAI(OpenAIOptions{APIKey: "k", BaseURL: "http://fake.invalid/v1", Model: "m", Stream: stream,
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
