package wire

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
)

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
			turns, err := GroupHistory(tt.msgs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				if !errors.Is(err, planner.ErrPermanent) {
					t.Fatalf("a history error must be permanent: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range turns[1].Results {
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
		if got := ModelName(tt.kind, tt.run, tt.def); got != tt.want {
			t.Errorf("ModelName(%q, %q, %q) = %q, want %q", tt.kind, tt.run, tt.def, got, tt.want)
		}
	}
}

func TestJSONHelpers(t *testing.T) {
	for in, want := range map[string]string{
		``: ``, `null`: ``, `"a\"b"`: `a"b`, `{"x":1}`: `{"x":1}`, ` "s" `: `s`, `"unterminated`: `"unterminated`,
	} {
		if got := JSONString(json.RawMessage(in)); got != want {
			t.Errorf("JSONString(%s) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		`{"a":1}`: `{"a":1}`, ` {"a":1} `: `{"a":1}`, ``: `{}`,
		`{"a":`: `{"invalid_arguments":"{\"a\":"}`, `[1]`: `{"invalid_arguments":"[1]"}`,
	} {
		if got := string(ObjectArguments(in)); got != want {
			t.Errorf("ObjectArguments(%q) = %s, want %s", in, got, want)
		}
	}
	if got := string(SetJSONField(json.RawMessage(`{"id":"x","n":1}`), "id", "y")); got != `{"id":"y","n":1}` {
		t.Errorf("SetJSONField = %s", got)
	}
	if got := string(SetJSONField(json.RawMessage(`[1]`), "id", "y")); got != `[1]` {
		t.Errorf("SetJSONField on a non-object = %s", got)
	}
	if _, err := SchemaObject("t", json.RawMessage(`[1]`)); !errors.Is(err, planner.ErrPermanent) {
		t.Errorf("a schema that is not an object must fail the run: %v", err)
	}
}

func TestReadRawIgnoresForeignRaw(t *testing.T) {
	for _, raw := range []string{``, `not json`, `[1,2]`, `{"other":1}`} {
		if p := ReadRaw(json.RawMessage(raw)); p.Encode() != nil {
			t.Errorf("ReadRaw(%q) = %+v, want nothing", raw, p)
		}
	}
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
			var pe *planner.ProviderError
			if err := TransportError("p", tt.err, tt.answered); !errors.As(err, &pe) || pe.Retryable != tt.retryable || !errors.Is(err, tt.err) {
				t.Fatalf("TransportError = %#v, want retryable %v wrapping %v", err, tt.retryable, tt.err)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		header map[string]string
		want   time.Duration
		ok     bool
	}{
		{"none", nil, 0, false},
		{"seconds", map[string]string{"Retry-After": "7"}, 7 * time.Second, true},
		{"fractional seconds", map[string]string{"Retry-After": "1.5"}, 1500 * time.Millisecond, true},
		{"zero", map[string]string{"Retry-After": "0"}, 0, true},
		{"http date", map[string]string{"Retry-After": now.Add(90 * time.Second).Format(http.TimeFormat)}, 90 * time.Second, true},
		{"http date in the past", map[string]string{"Retry-After": now.Add(-time.Hour).Format(http.TimeFormat)}, 0, true},
		{"milliseconds win", map[string]string{"Retry-After-Ms": "250", "Retry-After": "9"}, 250 * time.Millisecond, true},
		{"bad milliseconds fall back", map[string]string{"Retry-After-Ms": "soon", "Retry-After": "2"}, 2 * time.Second, true},
		{"negative", map[string]string{"Retry-After": "-3"}, 0, false},
		{"garbage", map[string]string{"Retry-After": "tomorrow-ish"}, 0, false},
		{"NaN", map[string]string{"Retry-After": "NaN"}, 0, false},
		{"huge saturates", map[string]string{"Retry-After": "1e300"}, time.Duration(1<<63 - 1), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.header {
				h.Set(k, v)
			}
			got, ok := RetryAfter(h, now)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("retryAfter = %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}
