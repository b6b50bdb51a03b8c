package planner

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
)

// responsesRules are the Responses API rules the fake enforces: every function_call in
// the input is answered by a function_call_output with its call_id before any other
// item ("No tool output found"), no output without its call ("No tool call found"),
// known message roles, function calls sent back with the reasoning item that preceded
// them, non-strict schemas marked strict=false; plus toolbus's own: outputs in call
// order.
func responsesRules(f *fake, req map[string]any) string {
	if jstr(req["model"]) == "" {
		return "Missing required parameter: 'model'."
	}
	for _, tv := range jarr(req["tools"]) {
		tool := jobj(tv)
		params := jobj(tool["parameters"])
		if jstr(tool["type"]) != "function" || !toolbus.ValidToolName(jstr(tool["name"])) || jstr(params["type"]) != "object" {
			return "Invalid 'tools': a function tool needs a valid name and object parameters"
		}
		if tool["strict"] != false && params["additionalProperties"] != false {
			return fmt.Sprintf("Invalid schema for function '%s': In context=(), 'additionalProperties' is required to be supplied and to be false.", jstr(tool["name"]))
		}
	}
	// What the fake sent: items by id, and the reasoning item before each function call.
	sentItems := map[string]string{}
	reasoningOf := map[string]string{}
	for _, s := range f.sentJSON() {
		last := ""
		for _, iv := range jarr(s["output"]) {
			it := jobj(iv)
			sentItems[jstr(it["id"])] = canon(it)
			switch jstr(it["type"]) {
			case "reasoning":
				last = jstr(it["id"])
			case "function_call":
				if last != "" {
					reasoningOf[jstr(it["id"])] = last
				}
			}
		}
	}
	input := jarr(req["input"])
	if len(input) == 0 {
		return "Missing required parameter: 'input'."
	}
	seenIDs := map[string]bool{}
	calls := map[string]bool{}
	answered := map[string]bool{}
	var pending []string
	prev := ""
	for i, iv := range input {
		it := jobj(iv)
		typ := jstr(it["type"])
		if typ == "" && it["role"] != nil {
			typ = "message"
		}
		if id := jstr(it["id"]); id != "" {
			if orig, ok := sentItems[id]; ok && orig != canon(it) {
				return fmt.Sprintf("input[%d]: item '%s' differs from the item the model produced", i, id)
			}
			seenIDs[id] = true
		}
		if len(pending) > 0 && typ != "function_call_output" && !(typ == "function_call" && prev == "function_call") {
			return fmt.Sprintf("No tool output found for function call %s.", pending[0])
		}
		switch typ {
		case "message":
			switch jstr(it["role"]) {
			case "user", "assistant", "system", "developer":
			default:
				return fmt.Sprintf("Invalid value: '%s'. Supported values are: 'assistant', 'system', 'developer', and 'user'.", jstr(it["role"]))
			}
		case "reasoning":
		case "function_call":
			id := jstr(it["call_id"])
			if id == "" || jstr(it["name"]) == "" {
				return fmt.Sprintf("input[%d]: a function_call needs a call_id and a name", i)
			}
			if _, ok := it["arguments"].(string); !ok {
				return fmt.Sprintf("input[%d].arguments must be a string", i)
			}
			if rs, ok := reasoningOf[jstr(it["id"])]; ok && !seenIDs[rs] {
				return fmt.Sprintf("Item '%s' of type 'function_call' was provided without its required 'reasoning' item: '%s'.", jstr(it["id"]), rs)
			}
			if calls[id] {
				return fmt.Sprintf("input[%d]: duplicate call_id %s", i, id)
			}
			calls[id] = true
			pending = append(pending, id)
		case "function_call_output":
			id := jstr(it["call_id"])
			if !calls[id] {
				return fmt.Sprintf("No tool call found for function call output with call_id %s.", id)
			}
			if answered[id] {
				return fmt.Sprintf("input[%d]: call_id %s is answered twice", i, id)
			}
			if len(pending) == 0 || pending[0] != id {
				return fmt.Sprintf("input[%d]: function_call_output items must answer the calls in call order: got %s", i, id)
			}
			if _, ok := it["output"].(string); !ok {
				return fmt.Sprintf("input[%d].output must be a string", i)
			}
			answered[id] = true
			pending = pending[1:]
		default:
			return fmt.Sprintf("Invalid value: '%s' (input[%d].type).", typ, i)
		}
		prev = typ
	}
	if len(pending) > 0 {
		return fmt.Sprintf("No tool output found for function call %s.", pending[0])
	}
	return ""
}

func newResponsesFake(t *testing.T, reply func(n int, req map[string]any) fakeReply) (*fake, string) {
	t.Helper()
	f := &fake{t: t, path: "/v1/responses", rules: responsesRules, errorBody: openaiErrorBody, reply: reply}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL + "/v1"
}

// responseBody is a Responses answer with the given output items.
func responseBody(status string, output ...any) string {
	return canon(map[string]any{
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

func newTestResponses(t *testing.T, base string, mod func(*OpenAIResponsesOptions)) *OpenAIResponses {
	t.Helper()
	opts := OpenAIResponsesOptions{APIKey: "test-key", BaseURL: base, Model: "gpt-test", Retry: RetryPolicy{MaxAttempts: 1}, Logger: discardLog}
	if mod != nil {
		mod(&opts)
	}
	m, err := NewOpenAIResponses(opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestOpenAIResponsesRequest(t *testing.T) {
	f, base := newResponsesFake(t, always(fakeReply{body: responseBody("completed", respMessage("INC-404 does not exist."))}))
	m := newTestResponses(t, base, func(o *OpenAIResponsesOptions) {
		o.MaxTokens, o.ReasoningEffort, o.Stateless = 512, "low", true
	})
	resp, err := m.Complete(context.Background(), Request{RunID: "r1", Step: 2, Messages: richHistory(), Tools: fixtureTools()})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Message.Content != "INC-404 does not exist." || resp.Usage != (toolbus.Usage{InputTokens: 13, OutputTokens: 5}) {
		t.Fatalf("resp %+v", resp)
	}
	body := f.lastRequest()
	checkGolden(t, "openai_responses_request.golden.json", body)

	req := decodeBody(t, body)
	var seq []string
	for _, iv := range jarr(req["input"]) {
		it := jobj(iv)
		switch typ := jstr(it["type"]); typ {
		case "function_call", "function_call_output":
			seq = append(seq, typ+":"+jstr(it["call_id"]))
		case "message", "":
			seq = append(seq, "message:"+jstr(it["role"]))
			if jstr(it["role"]) == "user" && strings.Contains(canon(it), "incident_not_found") {
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
	if err := jsonUnmarshalNumber(fixtureResponsesRaw, &fixture); err != nil {
		t.Fatal(err)
	}
	if got := canon(jarr(req["input"])[2:7]); got != canon(fixture) {
		t.Errorf("raw items changed:\n got %s\nwant %s", got, canon(fixture))
	}
	if jobj(jarr(req["tools"])[1])["strict"] != false || req["store"] != false || canon(req["include"]) != `["reasoning.encrypted_content"]` {
		t.Errorf("tools %v store %v include %v", req["tools"], req["store"], req["include"])
	}
}

func TestOpenAIResponsesRoundTrip(t *testing.T) {
	step0 := responseBody("completed", respReasoning("rs_9", "Needs the calculator."),
		respCall("fc_9", "call_x", "calculator", `{"expression":"2+3"}`))
	step1 := responseBody("completed", respMessage("2+3 = 5."))
	f, base := newResponsesFake(t, func(n int, _ map[string]any) fakeReply { return fakeReply{body: []string{step0, step1}[min(n, 1)]} })
	m := newTestResponses(t, base, nil)
	ctx := context.Background()
	r0, err := m.Complete(ctx, Request{Step: 0, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "What is 2+3?"}}, Tools: fixtureTools()})
	if err != nil {
		t.Fatal(err)
	}
	if r0.Message.Reasoning != "Needs the calculator." || len(r0.Message.ToolCalls) != 1 || r0.Message.ToolCalls[0].Arguments != `{"expression":"2+3"}` {
		t.Fatalf("step 0: %+v", r0.Message)
	}
	r1, err := m.Complete(ctx, Request{Step: 1, Messages: twoStep(r0.Message, `{"value":5}`), Tools: fixtureTools()})
	if err != nil || r1.Message.Content != "2+3 = 5." {
		t.Fatalf("step 1: %v %+v", err, r1.Message)
	}
	if _, accepted, rejected := f.counts(); accepted != 2 || len(rejected) != 0 {
		t.Fatalf("accepted %d rejected %v", accepted, rejected)
	}

	// Rebuilt from the portable fields (a history made by another model), the call
	// goes back as a plain function_call item, which the API accepts.
	portable := r0.Message
	portable.Raw = nil
	if _, err := m.Complete(ctx, Request{Step: 1, Messages: twoStep(portable, `{"value":5}`)}); err != nil {
		t.Fatalf("portable history: %v", err)
	}
	// Raw items that lost the reasoning item are refused by the API; the run fails
	// with the API's message.
	broken := r0.Message
	broken.Raw = rawParts{OpenAIResponses: []byte(canon([]any{respCall("fc_9", "call_x", "calculator", `{"expression":"2+3"}`)}))}.encode()
	_, err = m.Complete(ctx, Request{Step: 1, Messages: twoStep(broken, `{"value":5}`)})
	if !errors.Is(err, ErrPermanent) || !strings.Contains(err.Error(), "without its required 'reasoning' item: 'rs_9'") {
		t.Fatalf("err = %v, want a permanent error with the API's message", err)
	}
}

func TestOpenAIResponsesPatchesNormalizedIDs(t *testing.T) {
	step0 := responseBody("completed",
		respCall("fc_1", "", "calculator", `{"expression":"2+3"}`),
		respCall("fc_2", "dup", "calculator", `{"expression":"2+4"}`),
		respCall("fc_3", "dup", "calculator", `{"expression": oops`))
	f, base := newResponsesFake(t, func(n int, _ map[string]any) fakeReply {
		return fakeReply{body: []string{step0, responseBody("completed", respMessage("done"))}[min(n, 1)]}
	})
	m := newTestResponses(t, base, nil)
	r0, err := m.Complete(context.Background(), Request{Step: 4, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
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
	f.mu.Lock()
	f.sent = nil
	f.mu.Unlock()
	if _, err := m.Complete(context.Background(), Request{Step: 5, Messages: history}); err != nil {
		t.Fatalf("the normalized ids were not sent back consistently: %v", err)
	}
	req := decodeBody(t, f.lastRequest())
	var got []string
	for _, iv := range jarr(req["input"]) {
		if it := jobj(iv); jstr(it["type"]) == "function_call" {
			got = append(got, jstr(it["id"])+"="+jstr(it["call_id"]))
		}
	}
	if strings.Join(got, ",") != "fc_1=call_4_0,fc_2=dup,fc_3=call_4_2" {
		t.Fatalf("function_call items %v", got)
	}
}

func TestOpenAIResponsesFakeEnforcesRules(t *testing.T) {
	_, base := newResponsesFake(t, always(fakeReply{body: responseBody("completed", respMessage("ok"))}))
	url := base + "/responses"
	user := `{"role":"user","content":"q"}`
	call := func(id string) string {
		return `{"type":"function_call","call_id":"` + id + `","name":"calculator","arguments":"{}"}`
	}
	out := func(id string) string { return `{"type":"function_call_output","call_id":"` + id + `","output":"5"}` }
	tests := []struct{ name, input, want string }{
		{"valid", user + "," + call("a") + "," + call("b") + "," + out("a") + "," + out("b"), ""},
		{"orphan output", user + "," + out("a"), "No tool call found for function call output with call_id a."},
		{"missing output", user + "," + call("a") + "," + call("b") + "," + out("a") + "," + user, "No tool output found for function call b."},
		{"tool result as user text", user + "," + call("a") + `,{"role":"user","content":"a returned 5"}`, "No tool output found for function call a."},
		{"wrong role", `{"role":"tool","content":"5"}`, "Invalid value: 'tool'"},
		{"wrong order", user + "," + call("a") + "," + call("b") + "," + out("b") + "," + out("a"), "in call order"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := post(t, url, `{"model":"m","input":[`+tt.input+`]}`)
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

func TestOpenAIResponsesAnswers(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		check   func(t *testing.T, r Response)
		wantErr string
	}{
		{name: "incomplete answers are used", body: responseBody("incomplete", respCall("fc", "c1", "calculator", `{"expression": "1+`)),
			check: func(t *testing.T, r Response) {
				if r.Message.ToolCalls[0].Arguments != `{"expression": "1+` {
					t.Fatalf("arguments %q", r.Message.ToolCalls[0].Arguments)
				}
			}},
		{name: "refusal", body: responseBody("completed", map[string]any{"id": "m", "type": "message", "role": "assistant",
			"content": []any{map[string]any{"type": "refusal", "refusal": "No."}}}),
			check: func(t *testing.T, r Response) {
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
			_, base := newResponsesFake(t, always(fakeReply{body: tt.body}))
			resp, err := newTestResponses(t, base, nil).Complete(context.Background(), Request{Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
			if tt.wantErr != "" {
				var pe *ProviderError
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || errors.Is(err, ErrPermanent) || !errors.As(err, &pe) || !pe.Retryable {
					t.Fatalf("err = %v, want a retryable %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkAnswer(t, resp)
			tt.check(t, resp)
		})
	}
}

func TestOpenAIResponsesRetries(t *testing.T) {
	replies := []fakeReply{
		{status: 429, header: map[string]string{"Retry-After-Ms": "1500"}, body: openaiErrorBody("Rate limit reached")},
		{status: 500, body: openaiErrorBody("boom")},
		{body: responseBody("completed", respMessage("done"))},
	}
	f, base := newResponsesFake(t, func(n int, _ map[string]any) fakeReply { return replies[min(n, 2)] })
	var s sleeps
	m := newTestResponses(t, base, func(o *OpenAIResponsesOptions) { o.Retry = fastRetry(3, &s) })
	resp, err := m.Complete(context.Background(), Request{Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
	if err != nil || resp.Message.Content != "done" {
		t.Fatalf("err %v resp %+v", err, resp)
	}
	if reqs, _, _ := f.counts(); reqs != 3 {
		t.Fatalf("%d requests", reqs)
	}
	if w := s.waits(); len(w) != 2 || w[0] != 1500*time.Millisecond || w[1] > time.Microsecond*2 {
		t.Fatalf("waits %v: want Retry-After-Ms then a tiny backoff", w)
	}

	f2, base2 := newResponsesFake(t, always(fakeReply{status: 404, body: openaiErrorBody("The model 'gpt-nope' does not exist")}))
	_, err = newTestResponses(t, base2, nil).Complete(context.Background(), Request{Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
	if !errors.Is(err, ErrPermanent) || !strings.Contains(err.Error(), "gpt-nope") {
		t.Fatalf("err = %v", err)
	}
	if reqs, _, _ := f2.counts(); reqs != 1 {
		t.Fatalf("%d requests for a 404", reqs)
	}
}

func FuzzOpenAIResponsesResponse(f *testing.F) {
	f.Add([]byte(responseBody("completed", respReasoning("rs", "s"), respMessage("hi"), respCall("fc", "", "calculator", `{"x`))))
	f.Add([]byte(`{"status":"completed","output":[{"type":"function_call","arguments":{"a":[1]},"call_id":7}]}`))
	f.Add([]byte(`{"status":"completed","output":null}`))
	f.Add([]byte(`{"output":[{"type":"message","content":[{"type":"output_text","text":null}]}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := NewOpenAIResponses(OpenAIResponsesOptions{APIKey: "k", BaseURL: "http://fake.invalid/v1", Model: "m",
			HTTPClient: &http.Client{Transport: bytesTransport{status: 200, contentType: "application/json", body: body}},
			Retry:      RetryPolicy{MaxAttempts: 1}})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := m.Complete(context.Background(), Request{Step: 2, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}})
		if err == nil {
			checkAnswer(t, resp)
		}
	})
}
