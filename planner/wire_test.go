package planner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
)

var discardLog = slog.New(slog.DiscardHandler)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// checkGolden compares a request body with testdata/<name>, after normalising it
// (sorted keys, indentation). With -update it rewrites the file instead.
func checkGolden(t *testing.T, name string, body []byte) {
	t.Helper()
	got := normalizeJSON(t, body)
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./planner -run %s -update to create it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("request body differs from %s (rerun with -update if the change is intended)\n got: %s\nwant: %s", path, got, want)
	}
}

// normalizeJSON re-encodes a JSON document with sorted keys and indentation. Nothing in
// the request bodies is volatile (no ids, no timestamps), so nothing else is rewritten.
func normalizeJSON(t *testing.T, b []byte) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("body is not JSON: %v\n%s", err, b)
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(out, '\n')
}

// fixtureTools are the tool contracts of the translation tests.
func fixtureTools() []toolbus.ToolContract {
	return []toolbus.ToolContract{
		{Name: "lookup_incident", Description: "Look up an incident by id.", ReadOnly: true,
			InputSchema: json.RawMessage(`{"type":"object","properties":{"incident_id":{"type":"string","pattern":"^INC-[0-9]+$"}},"required":["incident_id"],"additionalProperties":false}`)},
		{Name: "calculator", Description: "Evaluate an arithmetic expression.", ReadOnly: true,
			InputSchema: json.RawMessage(`{"type":"object","properties":{"expression":{"type":"string","maxLength":256}},"required":["expression"]}`)},
	}
}

// The raw parts of the first assistant message of richHistory, one per provider, so
// every adapter has to pick its own and leave the others alone.
const (
	fixtureChatRaw      = `{"reasoning_content":"Two lookups and a computation are needed."}`
	fixtureResponsesRaw = `[` +
		`{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"Two lookups are needed."}],"encrypted_content":"gAAAA-opaque"},` +
		`{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Let me look.","annotations":[]}]},` +
		`{"id":"fc_1","type":"function_call","call_id":"call_a","name":"lookup_incident","arguments":"{\"incident_id\":\"INC-404\"}","status":"completed"},` +
		`{"id":"fc_2","type":"function_call","call_id":"call_b","name":"calculator","arguments":"{\"expression\":\"17*38+55\"}","status":"completed"},` +
		`{"id":"fc_3","type":"function_call","call_id":"call_c","name":"calculator","arguments":"{\"expression\": \"1/0\"","status":"completed"}]`
	fixtureAnthropicRaw = `[` +
		`{"type":"thinking","thinking":"Two lookups and a computation are needed.","signature":"EqQBCgIYAhIM-opaque-signature"},` +
		`{"type":"redacted_thinking","data":"EmwKAhgBEgy-redacted"},` +
		`{"type":"text","text":"Let me look."},` +
		`{"type":"tool_use","id":"call_a","name":"lookup_incident","input":{"incident_id":"INC-404"}},` +
		`{"type":"tool_use","id":"call_b","name":"calculator","input":{"expression":"17*38+55"}},` +
		`{"type":"tool_use","id":"call_c","name":"calculator","input":{"expression":"1/0"}}]`
)

// richHistory is a two-step history with everything the translation must keep: a
// system prompt, reasoning with a signature and opaque provider parts, three parallel
// calls (one with malformed arguments) whose results were recorded out of call order
// (two of them errors), a second step made by another model (no raw parts), and a
// user follow-up.
func richHistory() []toolbus.Message {
	raw, err := json.Marshal(rawParts{
		OpenAIChat:      json.RawMessage(fixtureChatRaw),
		OpenAIResponses: json.RawMessage(fixtureResponsesRaw),
		Anthropic:       json.RawMessage(fixtureAnthropicRaw),
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

// twoStep is the history of a run whose first step called the calculator once.
func twoStep(first toolbus.Message, result string) []toolbus.Message {
	return []toolbus.Message{
		{Role: toolbus.RoleSystem, Content: "sys"},
		{Role: toolbus.RoleUser, Content: "What is 2+3?"},
		first,
		{Role: toolbus.RoleTool, ToolCallID: first.ToolCalls[0].CallID, Name: first.ToolCalls[0].Tool, Content: result},
	}
}

func TestGroupHistory(t *testing.T) {
	call := func(id string) toolbus.ToolCall { return toolbus.ToolCall{CallID: id, Tool: "noop", Arguments: "{}"} }
	asst := func(ids ...string) toolbus.Message {
		m := toolbus.Message{Role: toolbus.RoleAssistant}
		for _, id := range ids {
			m.ToolCalls = append(m.ToolCalls, call(id))
		}
		return m
	}
	tool := func(id string) toolbus.Message {
		return toolbus.Message{Role: toolbus.RoleTool, ToolCallID: id, Content: "r-" + id}
	}
	user := toolbus.Message{Role: toolbus.RoleUser, Content: "q"}
	tests := []struct {
		name    string
		msgs    []toolbus.Message
		order   []string // result ids of the first assistant turn
		wantErr string
	}{
		{name: "in order", msgs: []toolbus.Message{user, asst("a", "b"), tool("a"), tool("b")}, order: []string{"a", "b"}},
		{name: "reordered into call order", msgs: []toolbus.Message{user, asst("a", "b", "c"), tool("c"), tool("a"), tool("b")}, order: []string{"a", "b", "c"}},
		{name: "orphan tool message", msgs: []toolbus.Message{user, tool("a")}, wantErr: "follows no assistant"},
		{name: "orphan after user text", msgs: []toolbus.Message{user, asst("a"), tool("a"), user, tool("a")}, wantErr: "follows no assistant"},
		{name: "unknown call id", msgs: []toolbus.Message{user, asst("a"), tool("a"), tool("x")}, wantErr: `answers call "x"`},
		{name: "missing result", msgs: []toolbus.Message{user, asst("a", "b"), tool("a"), user}, wantErr: `call "b" (noop) has no tool result`},
		{name: "missing result at the end", msgs: []toolbus.Message{user, asst("a")}, wantErr: `call "a" (noop) has no tool result`},
		{name: "answered twice", msgs: []toolbus.Message{user, asst("a"), tool("a"), tool("a")}, wantErr: "answered twice"},
		{name: "duplicate call id", msgs: []toolbus.Message{user, asst("a", "a"), tool("a")}, wantErr: "duplicate call id"},
		{name: "empty call id", msgs: []toolbus.Message{user, asst(""), tool("")}, wantErr: "has no call id"},
		{name: "unknown role", msgs: []toolbus.Message{{Role: "function", Content: "x"}}, wantErr: `unknown role "function"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			turns, err := groupHistory(tt.msgs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				if !errors.Is(err, ErrPermanent) {
					t.Fatalf("a history error must be permanent: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range turns[1].results {
				got = append(got, r.ToolCallID)
			}
			if strings.Join(got, ",") != strings.Join(tt.order, ",") {
				t.Fatalf("results %v, want %v", got, tt.order)
			}
		})
	}
}

func TestModelName(t *testing.T) {
	tests := []struct{ kind, run, def, want string }{
		{"openai", "", "gpt-x", "gpt-x"},
		{"openai", "openai:gpt-y", "gpt-x", "gpt-y"},
		{"openai", "openai-responses:gpt-y", "gpt-x", "gpt-x"},
		{"openai", "script:incident", "gpt-x", "gpt-x"},
		{"openai", "bare-name", "gpt-x", "gpt-x"},
		{"anthropic", "anthropic:claude-z", "claude-x", "claude-z"},
		{"anthropic", "anthropic:", "claude-x", "claude-x"},
	}
	for _, tt := range tests {
		if got := modelName(tt.kind, tt.run, tt.def); got != tt.want {
			t.Errorf("modelName(%q, %q, %q) = %q, want %q", tt.kind, tt.run, tt.def, got, tt.want)
		}
	}
}

func TestJSONHelpers(t *testing.T) {
	for in, want := range map[string]string{
		``: ``, `null`: ``, `"a\"b"`: `a"b`, `{"x":1}`: `{"x":1}`, ` "s" `: `s`, `"unterminated`: `"unterminated`,
	} {
		if got := jsonString(json.RawMessage(in)); got != want {
			t.Errorf("jsonString(%s) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		`{"a":1}`: `{"a":1}`, ` {"a":1} `: `{"a":1}`, ``: `{}`,
		`{"a":`: `{"invalid_arguments":"{\"a\":"}`, `[1]`: `{"invalid_arguments":"[1]"}`,
	} {
		if got := string(objectArguments(in)); got != want {
			t.Errorf("objectArguments(%q) = %s, want %s", in, got, want)
		}
	}
	if got := string(setJSONField(json.RawMessage(`{"id":"x","n":1}`), "id", "y")); got != `{"id":"y","n":1}` {
		t.Errorf("setJSONField = %s", got)
	}
	if got := string(setJSONField(json.RawMessage(`[1]`), "id", "y")); got != `[1]` {
		t.Errorf("setJSONField on a non-object = %s", got)
	}
	if _, err := schemaObject("t", json.RawMessage(`[1]`)); !errors.Is(err, ErrPermanent) {
		t.Errorf("a schema that is not an object must fail the run: %v", err)
	}
}

func TestReadRawIgnoresForeignRaw(t *testing.T) {
	for _, raw := range []string{``, `not json`, `[1,2]`, `{"other":1}`} {
		if p := readRaw(json.RawMessage(raw)); p.encode() != nil {
			t.Errorf("readRaw(%q) = %+v, want nothing", raw, p)
		}
	}
}

// bytesTransport answers every request with a fixed body, with no network: the fuzz
// targets serve arbitrary bytes through it.
type bytesTransport struct {
	status      int
	contentType string
	body        []byte
}

func (b bytesTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	h := http.Header{}
	h.Set("Content-Type", b.contentType)
	return &http.Response{StatusCode: b.status, Header: h, Body: io.NopCloser(bytes.NewReader(b.body)),
		ContentLength: int64(len(b.body)), Request: r, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}, nil
}

// checkAnswer asserts the invariants of any successful answer.
func checkAnswer(t *testing.T, resp Response) {
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

// sleeps records the waits of a RetryPolicy instead of waiting.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) waits() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// fastRetry is a policy with a tiny backoff whose waits are recorded, not slept.
func fastRetry(attempts int, s *sleeps) RetryPolicy {
	return RetryPolicy{MaxAttempts: attempts, BaseDelay: time.Microsecond, MaxDelay: time.Minute, sleep: s.sleep}
}

// fake is a provider test server: it records every request body, rejects the ones
// that break the provider's rules with a 400 in the provider's error format, and
// answers the others from a script.
type fake struct {
	t *testing.T
	// path is the only path served (e.g. /v1/chat/completions).
	path string
	// rules returns why a request body breaks the provider's rules ("" accepts it).
	rules func(f *fake, req map[string]any) string
	// errorBody formats an error message as the provider does.
	errorBody func(msg string) string
	// reply answers the n-th accepted request.
	reply func(n int, req map[string]any) fakeReply

	mu       sync.Mutex
	requests [][]byte
	accepted [][]byte
	rejected []string
	sent     []string // bodies of the successful replies
}

type fakeReply struct {
	status int
	header map[string]string
	body   string
	sse    bool
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, body)
	reject := func(status int, msg string) {
		f.rejected = append(f.rejected, msg)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, f.errorBody(msg))
	}
	if r.Method != http.MethodPost || r.URL.Path != f.path {
		reject(http.StatusNotFound, "unknown endpoint "+r.Method+" "+r.URL.Path)
		return
	}
	if r.Header.Get("Authorization") != "Bearer test-key" && r.Header.Get("X-Api-Key") != "test-key" {
		reject(http.StatusUnauthorized, "invalid x-api-key")
		return
	}
	var req map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&req); err != nil {
		reject(http.StatusBadRequest, "the body is not JSON: "+err.Error())
		return
	}
	if msg := f.rules(f, req); msg != "" {
		reject(http.StatusBadRequest, msg)
		return
	}
	rep := f.reply(len(f.accepted), req)
	f.accepted = append(f.accepted, body)
	if rep.status == 0 {
		rep.status = http.StatusOK
	}
	for k, v := range rep.header {
		w.Header().Set(k, v)
	}
	if rep.sse {
		w.Header().Set("Content-Type", "text/event-stream")
	} else if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	if rep.status == http.StatusOK {
		f.sent = append(f.sent, rep.body)
	}
	w.WriteHeader(rep.status)
	_, _ = io.WriteString(w, rep.body)
}

func (f *fake) lastRequest() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		f.t.Fatal("the fake server received no request")
	}
	return f.requests[len(f.requests)-1]
}

func (f *fake) counts() (requests, accepted int, rejected []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests), len(f.accepted), append([]string(nil), f.rejected...)
}

// sentJSON returns the successful replies, decoded.
func (f *fake) sentJSON() []map[string]any {
	var out []map[string]any
	for _, s := range f.sent {
		var m map[string]any
		dec := json.NewDecoder(strings.NewReader(s))
		dec.UseNumber()
		if dec.Decode(&m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// post sends a raw body to the fake, as a client that breaks the rules would.
func post(t *testing.T, url string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer test-key")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// generic JSON accessors for the rule checkers.
func jarr(v any) []any {
	a, _ := v.([]any)
	return a
}

func jobj(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func jstr(v any) string {
	s, _ := v.(string)
	return s
}

// canon is the canonical JSON of a decoded value (sorted keys), for comparisons.
func canon(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func jsonUnmarshalNumber(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	return dec.Decode(v)
}

func TestTransportError(t *testing.T) {
	netErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	tests := []struct {
		name      string
		err       error
		answered  bool
		retryable bool
	}{
		{"connection refused", &url.Error{Op: "Post", URL: "http://x", Err: netErr}, false, true},
		{"attempt timeout", context.DeadlineExceeded, false, true},
		{"undecodable answer", errors.New("error parsing response json"), true, true},
		{"failed before sending (no credentials)", errors.New("no credentials found"), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pe *ProviderError
			if err := transportError("p", tt.err, tt.answered); !errors.As(err, &pe) || pe.Retryable != tt.retryable || !errors.Is(err, tt.err) {
				t.Fatalf("transportError = %#v, want retryable %v wrapping %v", err, tt.retryable, tt.err)
			}
		})
	}
}
