package planner_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
)

// A script file answers each step with its calls and text, fills in the results it
// refers to, and fails a step past its last.
func TestScriptFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "greet.json")
	if err := os.WriteFile(path, []byte(`{"steps": [
		{"say": "hi", "calls": [{"id": "g", "tool": "greet", "arguments": {"name": "Ada"}}, {"tool": "greet"}]},
		{"say": "got {{result:g}} and {{ result:nope }}\n{{results}}"}
	]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := planner.LoadScriptFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if m.Name() != "script:greet" {
		t.Fatalf("name %q, want script:greet (from the file name)", m.Name())
	}
	ctx := context.Background()
	r0, err := m.Complete(ctx, planner.Request{RunID: "r", Step: 0})
	if err != nil {
		t.Fatal(err)
	}
	calls := r0.Message.ToolCalls
	if len(calls) != 2 || calls[0].CallID != "g" || calls[0].Arguments != `{"name": "Ada"}` || calls[1].CallID != "call_0_1" || calls[1].Arguments != "{}" || r0.Model != "script:greet" {
		t.Fatalf("step 0: %+v", r0)
	}
	hist := []toolbus.Message{
		{Role: toolbus.RoleTool, ToolCallID: "g", Name: "greet", Content: "hello, Ada"},
		{Role: toolbus.RoleTool, ToolCallID: "call_0_1", Name: "greet", Content: "hello, nobody"},
	}
	r1, err := m.Complete(ctx, planner.Request{RunID: "r", Step: 1, Messages: hist})
	if err != nil {
		t.Fatal(err)
	}
	if want := "got hello, Ada and (no result for nope)\ngreet: hello, Ada\ngreet: hello, nobody"; r1.Message.Content != want || len(r1.Message.ToolCalls) != 0 {
		t.Fatalf("step 1 = %q, want %q", r1.Message.Content, want)
	}
	_, err = m.Complete(ctx, planner.Request{RunID: "r", Step: 2})
	if !errors.Is(err, planner.ErrPermanent) || !strings.Contains(err.Error(), path) {
		t.Fatalf("step past the last: %v, want a permanent error naming the file", err)
	}
}

// A file with a mistake is refused when it loads, saying what is wrong.
func TestScriptFileRefused(t *testing.T) {
	tests := map[string]string{
		`{"steps": []}`:                                                                "no steps",
		`{"steps": [{"say": "x", "cals": []}]}`:                                        `unknown field "cals"`,
		`{"steps": [{"calls": [{"tool": "bad name"}]}]}`:                               "invalid tool name",
		`{"steps": [{"calls": [{"tool": "t", "arguments": [1]}]}]}`:                    "must be a JSON object",
		`{"steps": [{"calls": [{"id": "a", "tool": "t"}, {"id": "a", "tool": "t"}]}]}`: `call id "a" twice`,
		`not json`: "invalid character",
	}
	for body, want := range tests {
		_, err := planner.ParseScriptFile(strings.NewReader(body))
		if !errors.Is(err, planner.ErrScript) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", body, err, want)
		}
	}
}
