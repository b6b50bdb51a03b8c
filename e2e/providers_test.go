package e2e_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/anthropic"
	"github.com/toolbus/toolbus/planner/openai"
)

// providerFake is a fake model API for one provider. It answers step 0 with one
// calculator call and step 1 with the answer, and refuses with a 400, in the provider's
// error format, a request that breaks the provider's rules for that exchange: the
// second request must carry the assistant message as it was sent (reasoning included)
// and the calculator result right after it, as that provider's tool result.
type providerFake struct {
	// step tells which step a request body is for.
	step func(req map[string]any) int
	// check returns why a request breaks the rules ("") and the tool result it carries.
	check func(step int, req map[string]any) (problem, result string)
	// reply is the answer to a step.
	reply func(step int) string
	// errorBody formats a rejection.
	errorBody func(msg string) string

	mu       sync.Mutex
	accepted int
	rejected []string
	results  []string // the tool results the step-1 requests carried
}

func (f *providerFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req map[string]any
	problem := ""
	if err := json.Unmarshal(body, &req); err != nil {
		problem = "the body is not JSON"
	}
	step, result := 0, ""
	if problem == "" {
		step = f.step(req)
		problem, result = f.check(step, req)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if problem != "" {
		f.rejected = append(f.rejected, problem)
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, f.errorBody(problem))
		return
	}
	f.accepted++
	if step == 1 {
		f.results = append(f.results, result)
	}
	_, _ = io.WriteString(w, f.reply(step))
}

func (f *providerFake) outcome() (accepted int, rejected, results []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.accepted, append([]string(nil), f.rejected...), append([]string(nil), f.results...)
}

func arr(v any) []any          { a, _ := v.([]any); return a }
func obj(v any) map[string]any { m, _ := v.(map[string]any); return m }
func str(v any) string         { s, _ := v.(string); return s }
func countIf(xs []any, f func(map[string]any) bool) int {
	n := 0
	for _, x := range xs {
		if f(obj(x)) {
			n++
		}
	}
	return n
}

func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

const providerAnswer = "2+3 = 5."

// chatFake is OpenAI Chat Completions: the assistant message with its tool_calls and
// reasoning_content, then one `tool` message with the tool_call_id.
func chatFake() *providerFake {
	call := map[string]any{"id": "call_e2e", "type": "function", "function": map[string]any{"name": "calculator", "arguments": `{"expression":"2+3"}`}}
	completion := func(msg map[string]any, finish string) string {
		msg["role"] = "assistant"
		return js(map[string]any{"id": "c", "object": "chat.completion", "created": 1, "model": "fake-gpt",
			"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
			"usage":   map[string]any{"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}})
	}
	return &providerFake{
		errorBody: func(msg string) string {
			return js(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error"}})
		},
		step: func(req map[string]any) int {
			return countIf(arr(req["messages"]), func(m map[string]any) bool { return m["role"] == "assistant" })
		},
		check: func(step int, req map[string]any) (string, string) {
			msgs := arr(req["messages"])
			for i, mv := range msgs {
				m := obj(mv)
				switch str(m["role"]) {
				case "system", "user", "assistant":
				case "tool":
					prev := obj(msgs[i-1])
					if prev["role"] != "assistant" || len(arr(prev["tool_calls"])) == 0 {
						return "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.", ""
					}
				default:
					return fmt.Sprintf("Invalid value: '%s'.", m["role"]), ""
				}
			}
			if step == 0 {
				return "", ""
			}
			i := len(msgs) - 2
			a, t := obj(msgs[i]), obj(msgs[i+1])
			if a["role"] != "assistant" || js(a["tool_calls"]) != js([]any{call}) {
				return "the assistant message with the tool call was not sent back whole", ""
			}
			if a["reasoning_content"] != "I need the calculator." {
				return "Missing `reasoning_content` field in the assistant message", ""
			}
			if t["role"] != "tool" || t["tool_call_id"] != "call_e2e" {
				return "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. " +
					"The following tool_call_ids did not have response messages: call_e2e", ""
			}
			return "", str(t["content"])
		},
		reply: func(step int) string {
			if step == 0 {
				return completion(map[string]any{"content": nil, "reasoning_content": "I need the calculator.", "tool_calls": []any{call}}, "tool_calls")
			}
			return completion(map[string]any{"content": providerAnswer}, "stop")
		},
	}
}

// responsesFake is OpenAI Responses: the reasoning item and the function_call item as
// they were sent, then a function_call_output item with the call_id.
func responsesFake() *providerFake {
	reasoning := map[string]any{"id": "rs_e2e", "type": "reasoning", "encrypted_content": "opaque", "summary": []any{}}
	fcall := map[string]any{"id": "fc_e2e", "type": "function_call", "call_id": "call_e2e", "name": "calculator", "arguments": `{"expression":"2+3"}`, "status": "completed"}
	response := func(output ...any) string {
		return js(map[string]any{"id": "resp", "object": "response", "created_at": 1, "status": "completed", "model": "fake-gpt",
			"output": output, "usage": map[string]any{"input_tokens": 13, "output_tokens": 5, "total_tokens": 18}})
	}
	return &providerFake{
		errorBody: func(msg string) string {
			return js(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error"}})
		},
		step: func(req map[string]any) int {
			return countIf(arr(req["input"]), func(m map[string]any) bool { return m["type"] == "function_call" })
		},
		check: func(step int, req map[string]any) (string, string) {
			items := arr(req["input"])
			for _, iv := range items {
				it := obj(iv)
				if it["type"] == "function_call_output" && it["call_id"] != "call_e2e" {
					return fmt.Sprintf("No tool call found for function call output with call_id %s.", it["call_id"]), ""
				}
			}
			if step == 0 {
				return "", ""
			}
			n := len(items)
			if n < 3 || js(items[n-3]) != js(reasoning) {
				return "Item 'fc_e2e' of type 'function_call' was provided without its required 'reasoning' item: 'rs_e2e'.", ""
			}
			if js(items[n-2]) != js(fcall) {
				return "the function_call item was not sent back as it came", ""
			}
			out := obj(items[n-1])
			if out["type"] != "function_call_output" || out["call_id"] != "call_e2e" {
				return "No tool output found for function call call_e2e.", ""
			}
			return "", str(out["output"])
		},
		reply: func(step int) string {
			if step == 0 {
				return response(reasoning, fcall)
			}
			return response(map[string]any{"id": "msg", "type": "message", "role": "assistant", "status": "completed",
				"content": []any{map[string]any{"type": "output_text", "text": providerAnswer, "annotations": []any{}}}})
		},
	}
}

// anthropicFake is Anthropic Messages: the assistant content (thinking with its
// signature, tool_use) as it was sent, then a user message that opens with the
// tool_result block for the tool_use_id.
func anthropicFake() *providerFake {
	content := []any{
		map[string]any{"type": "thinking", "thinking": "I need the calculator.", "signature": "sig-e2e"},
		map[string]any{"type": "tool_use", "id": "toolu_e2e", "name": "calculator", "input": map[string]any{"expression": "2+3"}},
	}
	message := func(stop string, content []any) string {
		return js(map[string]any{"id": "msg", "type": "message", "role": "assistant", "model": "fake-claude", "content": content,
			"stop_reason": stop, "usage": map[string]any{"input_tokens": 21, "output_tokens": 8}})
	}
	return &providerFake{
		errorBody: func(msg string) string {
			return js(map[string]any{"type": "error", "error": map[string]any{"type": "invalid_request_error", "message": msg}})
		},
		step: func(req map[string]any) int {
			return countIf(arr(req["messages"]), func(m map[string]any) bool { return m["role"] == "assistant" })
		},
		check: func(step int, req map[string]any) (string, string) {
			msgs := arr(req["messages"])
			for i, mv := range msgs {
				role := obj(mv)["role"]
				if role != "user" && role != "assistant" {
					return fmt.Sprintf("messages: Unexpected role %q. The Messages API accepts a top-level `system` parameter.", role), ""
				}
				if i > 0 && role == obj(msgs[i-1])["role"] {
					return "messages: roles must alternate between \"user\" and \"assistant\"", ""
				}
			}
			if step == 0 {
				return "", ""
			}
			n := len(msgs)
			if js(obj(msgs[n-2])["content"]) != js(content) {
				return "messages.1.content: `thinking` blocks in the latest assistant message cannot be modified.", ""
			}
			first := obj(arr(obj(msgs[n-1])["content"])[0])
			if first["type"] != "tool_result" || first["tool_use_id"] != "toolu_e2e" || first["is_error"] == true {
				return "messages.2: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_e2e", ""
			}
			return "", str(obj(arr(first["content"])[0])["text"])
		},
		reply: func(step int) string {
			if step == 0 {
				return message("tool_use", content)
			}
			return message("end_turn", []any{map[string]any{"type": "text", "text": providerAnswer}})
		},
	}
}

// TestProvidersTwoStepRun runs a whole run through the pipeline against each fake
// provider: the model calls the calculator, the executor runs it, the injector joins
// the step, and the second model request, which carries the result, is accepted by
// the provider's rules.
func TestProvidersTwoStepRun(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.DiscardHandler)
	providers := []struct {
		name  string
		fake  func() *providerFake
		model func(url string) (planner.Model, error)
		usage toolbus.Usage // of the two requests
	}{
		{"openai", chatFake, func(url string) (planner.Model, error) {
			return openai.NewChat(openai.ChatOptions{APIKey: "k", BaseURL: url + "/v1", Model: "fake-gpt", Logger: quiet})
		}, toolbus.Usage{InputTokens: 22, OutputTokens: 14}},
		{"openai-responses", responsesFake, func(url string) (planner.Model, error) {
			return openai.NewResponses(openai.ResponsesOptions{APIKey: "k", BaseURL: url + "/v1", Model: "fake-gpt", Logger: quiet})
		}, toolbus.Usage{InputTokens: 26, OutputTokens: 10}},
		{"anthropic", anthropicFake, func(url string) (planner.Model, error) {
			return anthropic.New(anthropic.Options{APIKey: "k", BaseURL: url, Model: "fake-claude", Logger: quiet})
		}, toolbus.Usage{InputTokens: 42, OutputTokens: 16}},
	}
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			fake := p.fake()
			srv := httptest.NewServer(fake)
			t.Cleanup(srv.Close)
			model, err := p.model(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			s := newStack(t, model)
			s.startAll()
			run := "providers-" + strings.ReplaceAll(p.name, "-", "_")
			s.submit(run, toolbus.Limits{})
			ended := s.waitEnd(run)

			accepted, rejected, results := fake.outcome()
			if len(rejected) > 0 {
				t.Fatalf("the provider refused requests: %v", rejected)
			}
			if ended.Status != toolbus.RunCompleted || ended.Answer != providerAnswer || ended.StepsUsed != 2 {
				t.Fatalf("run ended %+v", ended)
			}
			if accepted != 2 || len(results) != 1 || !strings.Contains(results[0], `"value":5`) {
				t.Fatalf("accepted %d requests; the second carried tool result %q", accepted, results)
			}
			if ended.Usage != p.usage {
				t.Fatalf("usage %+v, want %+v (both steps summed)", ended.Usage, p.usage)
			}
			req, ok := s.seenReq.forStep(run, 1)
			if !ok {
				t.Fatal("no request for step 1")
			}
			if got := toolRoles(req.Messages); got != "system,user,assistant,tool:"+req.Messages[2].ToolCalls[0].CallID {
				t.Fatalf("history of step 1: %s", got)
			}
		})
	}
}

// TestProvidersReplayIncidentCassette re-runs the recorded incident demo offline: the
// replay model serves the cassette's answers and the tools produce the same results.
func TestProvidersReplayIncidentCassette(t *testing.T) {
	t.Parallel()
	model, err := planner.OpenReplay("../planner/testdata/incident.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	s := newStack(t, model)
	s.startAll()
	s.submit("replayed-incident", toolbus.Limits{})
	ended := s.waitEnd("replayed-incident")
	if ended.Status != toolbus.RunCompleted || ended.StepsUsed != 3 ||
		!strings.HasPrefix(ended.Answer, "INC-404 does not exist. INC-001 is a high-severity incident") {
		t.Fatalf("run ended %+v", ended)
	}
	if ended.Usage.Total() != 910 {
		t.Fatalf("usage %+v, want the recorded 910 tokens", ended.Usage)
	}
	// Results are listed in call order: the stream holds them in completion order.
	res := s.finished("replayed-incident")
	sort.Slice(res, func(i, j int) bool {
		return res[i].Step < res[j].Step || res[i].Step == res[j].Step && res[i].CallIndex < res[j].CallIndex
	})
	var got []string
	for _, f := range res {
		got = append(got, fmt.Sprintf("%d:%s:%s:%s", f.Step, f.ToolResult.Tool, f.ToolResult.Status, f.ToolResult.Code()))
	}
	want := "0:lookup_incident:failed:incident_not_found,0:calculator:succeeded:,1:lookup_incident:succeeded:"
	if strings.Join(got, ",") != want {
		t.Fatalf("tool results %v, want %s", got, want)
	}
}
