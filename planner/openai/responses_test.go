package openai

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/modeltest"
)

// responsesProvider is the Responses wire format for the conformance suite.
var responsesProvider = modeltest.Provider{
	Name: "openai-responses",
	Path: "/v1/responses",
	New: func(t *testing.T, url string, retry planner.RetryPolicy) planner.Model {
		return newTestResponses(t, url+"/v1", func(o *ResponsesOptions) { o.Retry = retry })
	},
	Decode:       decodeResponsesRequest,
	DecodeAnswer: decodeResponsesAnswer,
	Answer: func(a modeltest.Answer) string {
		var items []any
		if a.Reasoning != "" {
			items = append(items, respReasoning("rs_1", a.Reasoning)) // encrypted: only the raw item brings it back
		}
		if a.Text != "" {
			items = append(items, respMessage(a.Text))
		}
		for i, c := range a.Calls {
			items = append(items, respCall(fmt.Sprintf("fc_%d", i), c.CallID, c.Tool, c.Arguments))
		}
		return responseBody("completed", items...)
	},
	ErrorBody: openaiErrorBody,
}

func TestResponsesConformance(t *testing.T) { modeltest.Run(t, responsesProvider) }

// responsesEntries reads input or output items as entries: the reasoning, message and
// function_call items of one assistant turn make one assistant entry.
func responsesEntries(items []any) ([]modeltest.Entry, error) {
	var out []modeltest.Entry
	var reasoning []any
	turn := func() *modeltest.Entry {
		if n := len(out); n == 0 || out[n-1].Role != "assistant" {
			out = append(out, modeltest.Entry{Role: "assistant"})
			reasoning = nil
		}
		return &out[len(out)-1]
	}
	for i, iv := range items {
		it := modeltest.Obj(iv)
		typ := modeltest.Str(it["type"])
		if typ == "" && it["role"] != nil {
			typ = "message"
		}
		switch typ {
		case "message":
			text := modeltest.Str(it["content"])
			for _, cv := range modeltest.Arr(it["content"]) {
				c := modeltest.Obj(cv)
				text += modeltest.Str(c["text"]) + modeltest.Str(c["refusal"])
			}
			switch role := modeltest.Str(it["role"]); role {
			case "assistant":
				e := turn()
				e.Text += text
			case "system", "developer":
				out = append(out, modeltest.Entry{Role: "system", Text: text})
			case "user":
				out = append(out, modeltest.Entry{Role: "user", Text: text})
			default:
				return nil, fmt.Errorf("invalid value: '%s'. Supported values are: 'assistant', 'system', 'developer', and 'user'", role)
			}
		case "reasoning":
			e := turn()
			reasoning = append(reasoning, it)
			e.Opaque = modeltest.Canon(reasoning)
		case "function_call":
			args, ok := it["arguments"].(string)
			if !ok {
				return nil, fmt.Errorf("input[%d].arguments must be a string", i)
			}
			e := turn()
			e.Calls = append(e.Calls, modeltest.Call{ID: modeltest.Str(it["call_id"]), Name: modeltest.Str(it["name"]), Args: args})
		case "function_call_output":
			text, err := functionCallOutput(i, it["output"])
			if err != nil {
				return nil, err
			}
			out = append(out, modeltest.Entry{Role: "tool", CallID: modeltest.Str(it["call_id"]), Text: text})
		default:
			return nil, fmt.Errorf("invalid value: '%s' (input[%d].type)", typ, i)
		}
	}
	return out, nil
}

// functionCallOutput checks the output of function_call_output item i as the API
// documents it (a string, or a list of input_text, input_image and input_file items)
// and returns its text.
func functionCallOutput(i int, v any) (string, error) {
	if s, ok := v.(string); ok {
		return s, nil
	}
	items, ok := v.([]any)
	if !ok {
		return "", fmt.Errorf("input[%d].output must be a string or an array of input items", i)
	}
	var text string
	for j, iv := range items {
		c := modeltest.Obj(iv)
		switch modeltest.Str(c["type"]) {
		case "input_text":
			if _, ok := c["text"].(string); !ok {
				return "", fmt.Errorf("input[%d].output[%d].text must be a string", i, j)
			}
			text += modeltest.Str(c["text"])
		case "input_image":
			if !strings.HasPrefix(modeltest.Str(c["image_url"]), "data:image/") && modeltest.Str(c["file_id"]) == "" {
				return "", fmt.Errorf("input[%d].output[%d]: an input_image needs image_url or file_id", i, j)
			}
		case "input_file":
			if modeltest.Str(c["file_data"]) != "" && modeltest.Str(c["filename"]) == "" {
				return "", fmt.Errorf("input[%d].output[%d]: file_data needs a filename", i, j)
			}
			if modeltest.Str(c["file_data"]) == "" && modeltest.Str(c["file_id"]) == "" && modeltest.Str(c["file_url"]) == "" {
				return "", fmt.Errorf("input[%d].output[%d]: an input_file needs file_data, file_id or file_url", i, j)
			}
		default:
			return "", fmt.Errorf("invalid value: '%s' (input[%d].output[%d].type)", modeltest.Str(c["type"]), i, j)
		}
	}
	return text, nil
}

func decodeResponsesRequest(body []byte) ([]modeltest.Entry, error) {
	var req map[string]any
	if err := modeltest.DecodeJSON(body, &req); err != nil {
		return nil, fmt.Errorf("the body is not JSON: %v", err)
	}
	if modeltest.Str(req["model"]) == "" {
		return nil, errors.New("missing required parameter: 'model'")
	}
	for _, tv := range modeltest.Arr(req["tools"]) {
		tool := modeltest.Obj(tv)
		params := modeltest.Obj(tool["parameters"])
		if modeltest.Str(tool["type"]) != "function" || !toolbus.ValidToolName(modeltest.Str(tool["name"])) || modeltest.Str(params["type"]) != "object" {
			return nil, errors.New("invalid 'tools': a function tool needs a valid name and object parameters")
		}
		if tool["strict"] != false && params["additionalProperties"] != false {
			return nil, fmt.Errorf("invalid schema for function '%s': 'additionalProperties' is required to be supplied and to be false", modeltest.Str(tool["name"]))
		}
	}
	input := modeltest.Arr(req["input"])
	if len(input) == 0 {
		return nil, errors.New("missing required parameter: 'input'")
	}
	return responsesEntries(input)
}

func decodeResponsesAnswer(body []byte) (modeltest.Entry, bool) {
	var r map[string]any
	if modeltest.DecodeJSON(body, &r) != nil {
		return modeltest.Entry{}, false
	}
	es, err := responsesEntries(modeltest.Arr(r["output"]))
	if err != nil || len(es) != 1 {
		return modeltest.Entry{}, false
	}
	return es[0], true
}

// newResponsesServer is a fake Responses server; base is its API base URL.
func newResponsesServer(t *testing.T, reply func(n int, body []byte) modeltest.Reply) (*modeltest.Server, string) {
	t.Helper()
	s := modeltest.NewServer(t, responsesProvider, reply)
	return s, s.URL + "/v1"
}

// responseBody is a Responses answer with the given output items.
func responseBody(status string, output ...any) string {
	return modeltest.Canon(map[string]any{
		"id": "resp_1", "object": "response", "created_at": 1, "status": status, "model": "fake-model",
		"output": output, "error": nil, "incomplete_details": nil, "parallel_tool_calls": true, "tools": []any{},
		"usage": map[string]any{"input_tokens": 13, "output_tokens": 5, "total_tokens": 18,
			"input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens_details": map[string]any{"reasoning_tokens": 2}},
	})
}

func respMessage(text string) map[string]any {
	return map[string]any{"id": "msg_9", "type": "message", "role": "assistant", "status": "completed",
		"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}
}

func respCall(id, callID, name, args string) map[string]any {
	return map[string]any{"id": id, "type": "function_call", "call_id": callID, "name": name, "arguments": args, "status": "completed"}
}

func respReasoning(id, summary string) map[string]any {
	return map[string]any{"id": id, "type": "reasoning", "encrypted_content": "gAAAA-" + id,
		"summary": []any{map[string]any{"type": "summary_text", "text": summary}}}
}

func newTestResponses(t *testing.T, base string, mod func(*ResponsesOptions)) *Responses {
	t.Helper()
	opts := ResponsesOptions{APIKey: modeltest.APIKey, BaseURL: base, Model: "gpt-test", Retry: planner.RetryPolicy{MaxAttempts: 1}, Logger: discardLog}
	if mod != nil {
		mod(&opts)
	}
	m, err := NewResponses(opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestOpenAIResponsesRequest(t *testing.T) {
	f, base := newResponsesServer(t, modeltest.Always(modeltest.Reply{Body: responseBody("completed", respMessage("INC-404 does not exist."))}))
	m := newTestResponses(t, base, func(o *ResponsesOptions) {
		o.MaxTokens, o.ReasoningEffort, o.Stateless = 512, "low", true
	})
	resp, err := m.Complete(context.Background(), planner.Request{RunID: "r1", Step: 2, Messages: modeltest.RichHistory(), Tools: modeltest.Tools()})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Message.Content != "INC-404 does not exist." || resp.Usage != (toolbus.Usage{InputTokens: 13, OutputTokens: 5}) {
		t.Fatalf("resp %+v", resp)
	}
	body := f.LastRequest()
	modeltest.CheckGolden(t, "openai_responses_request.golden.json", body)

	req := decodeBody(t, body)
	var seq []string
	for _, iv := range modeltest.Arr(req["input"]) {
		it := modeltest.Obj(iv)
		switch typ := modeltest.Str(it["type"]); typ {
		case "function_call", "function_call_output":
			seq = append(seq, typ+":"+modeltest.Str(it["call_id"]))
		case "message", "":
			seq = append(seq, "message:"+modeltest.Str(it["role"]))
			if modeltest.Str(it["role"]) == "user" && strings.Contains(modeltest.Canon(it), "incident_not_found") {
				t.Errorf("a tool result was sent as user text: %v", it)
			}
		default:
			seq = append(seq, typ)
		}
	}
	want := "message:system,message:user,reasoning,message:assistant,function_call:call_a,function_call:call_b,function_call:call_c," +
		"function_call_output:call_a,function_call_output:call_b,function_call_output:call_c," +
		"message:assistant,function_call:call_d,function_call_output:call_d,message:user"
	if got := strings.Join(seq, ","); got != want {
		t.Errorf("input items\n got %s\nwant %s", got, want)
	}
	// The raw output items go back exactly as they came.
	var fixture []any
	if err := modeltest.DecodeJSON([]byte(modeltest.ResponsesRaw), &fixture); err != nil {
		t.Fatal(err)
	}
	if got := modeltest.Canon(modeltest.Arr(req["input"])[2:7]); got != modeltest.Canon(fixture) {
		t.Errorf("raw items changed:\n got %s\nwant %s", got, modeltest.Canon(fixture))
	}
	if modeltest.Obj(modeltest.Arr(req["tools"])[1])["strict"] != false || req["store"] != false || modeltest.Canon(req["include"]) != `["reasoning.encrypted_content"]` {
		t.Errorf("tools %v store %v include %v", req["tools"], req["store"], req["include"])
	}
}

func TestOpenAIResponsesPatchesNormalizedIDs(t *testing.T) {
	step0 := responseBody("completed",
		respCall("fc_1", "", "calculator", `{"expression":"2+3"}`),
		respCall("fc_2", "dup", "calculator", `{"expression":"2+4"}`),
		respCall("fc_3", "dup", "calculator", `{"expression": oops`))
	f, base := newResponsesServer(t, func(n int, _ []byte) modeltest.Reply {
		return modeltest.Reply{Body: []string{step0, responseBody("completed", respMessage("done"))}[min(n, 1)]}
	})
	m := newTestResponses(t, base, nil)
	r0, err := m.Complete(context.Background(), planner.Request{Step: 4, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range r0.Message.ToolCalls {
		ids = append(ids, c.CallID)
	}
	if strings.Join(ids, ",") != "call_4_0,dup,call_4_2" || r0.Message.ToolCalls[2].Arguments != `{"expression": oops` {
		t.Fatalf("calls %+v", r0.Message.ToolCalls)
	}
	history := []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}, r0.Message}
	for _, c := range r0.Message.ToolCalls {
		history = append(history, toolbus.Message{Role: toolbus.RoleTool, ToolCallID: c.CallID, Content: "r"})
	}
	// The fake refuses items it did not send unchanged... except call_id, which toolbus
	// may rewrite; so it checks the ids line up with the outputs instead.
	f.Forget()
	if _, err := m.Complete(context.Background(), planner.Request{Step: 5, Messages: history}); err != nil {
		t.Fatalf("the normalized ids were not sent back consistently: %v", err)
	}
	req := decodeBody(t, f.LastRequest())
	var got []string
	for _, iv := range modeltest.Arr(req["input"]) {
		if it := modeltest.Obj(iv); modeltest.Str(it["type"]) == "function_call" {
			got = append(got, modeltest.Str(it["id"])+"="+modeltest.Str(it["call_id"]))
		}
	}
	if strings.Join(got, ",") != "fc_1=call_4_0,fc_2=dup,fc_3=call_4_2" {
		t.Fatalf("function_call items %v", got)
	}
}

func TestOpenAIResponsesAnswers(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		check   func(t *testing.T, r planner.Response)
		wantErr string
	}{
		{name: "incomplete answers are used", body: responseBody("incomplete", respCall("fc", "c1", "calculator", `{"expression": "1+`)),
			check: func(t *testing.T, r planner.Response) {
				if r.Message.ToolCalls[0].Arguments != `{"expression": "1+` {
					t.Fatalf("arguments %q", r.Message.ToolCalls[0].Arguments)
				}
			}},
		{name: "refusal", body: responseBody("completed", map[string]any{"id": "m", "type": "message", "role": "assistant",
			"content": []any{map[string]any{"type": "refusal", "refusal": "No."}}}),
			check: func(t *testing.T, r planner.Response) {
				if r.Message.Content != "No." {
					t.Fatalf("content %q", r.Message.Content)
				}
			}},
		{name: "failed response is retryable", wantErr: "server_error happened",
			body: strings.Replace(responseBody("failed"), `"error":null`, `"error":{"code":"server_error","message":"server_error happened"}`, 1)},
		{name: "still in progress", body: responseBody("in_progress"), wantErr: "still in_progress"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, base := newResponsesServer(t, modeltest.Always(modeltest.Reply{Body: tt.body}))
			resp, err := newTestResponses(t, base, nil).Complete(context.Background(), planner.Request{Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
			if tt.wantErr != "" {
				var pe *planner.ProviderError
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || errors.Is(err, planner.ErrPermanent) || !errors.As(err, &pe) || !pe.Retryable {
					t.Fatalf("err = %v, want a retryable %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			modeltest.CheckAnswer(t, resp)
			tt.check(t, resp)
		})
	}
}

func FuzzOpenAIResponsesResponse(f *testing.F) {
	f.Add([]byte(responseBody("completed", respReasoning("rs", "s"), respMessage("hi"), respCall("fc", "", "calculator", `{"x`))))
	f.Add([]byte(`{"status":"completed","output":[{"type":"function_call","arguments":{"a":[1]},"call_id":7}]}`))
	f.Add([]byte(`{"status":"completed","output":null}`))
	f.Add([]byte(`{"output":[{"type":"message","content":[{"type":"output_text","text":null}]}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := NewResponses(ResponsesOptions{APIKey: "k", BaseURL: "http://fake.invalid/v1", Model: "m",
			HTTPClient: &http.Client{Transport: modeltest.BytesTransport{Status: 200, ContentType: "application/json", Body: body}},
			Retry:      planner.RetryPolicy{MaxAttempts: 1}})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := m.Complete(context.Background(), planner.Request{Step: 2, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
		if err == nil {
			modeltest.CheckAnswer(t, resp)
		}
	})
}
