package modeltest

import (
	"strings"
	"testing"
)

// TestCheck: the fake refuses each history the providers refuse, and accepts a valid one.
func TestCheck(t *testing.T) {
	user := Entry{Role: "user", Text: "q"}
	asst := Entry{Role: "assistant", Calls: []Call{{ID: "a", Name: "calculator", Args: "{}"}, {ID: "b", Name: "calculator", Args: "{}"}}}
	tool := func(id string) Entry { return Entry{Role: "tool", CallID: id, Text: "5"} }
	sent := []Entry{{Role: "assistant", Calls: asst.Calls, Opaque: `["thinking"]`}}
	withOpaque := asst
	withOpaque.Opaque = `["thinking"]`
	tests := []struct {
		name    string
		entries []Entry
		want    string
	}{
		{"valid", []Entry{user, withOpaque, tool("a"), tool("b"), user}, ""},
		{"orphan tool result", []Entry{user, tool("a")}, "answers no call"},
		{"result of a call not made", []Entry{user, withOpaque, tool("a"), tool("b"), tool("c")}, "answers no call"},
		{"missing tool result", []Entry{user, withOpaque, tool("a"), user}, "without a tool result before it: b"},
		{"missing tool result at the end", []Entry{user, withOpaque, tool("a")}, "without a tool result: b"},
		{"tool result as user text", []Entry{user, withOpaque, {Role: "user", Text: "a=5, b=5"}}, "without a tool result before it: a, b"},
		{"answered twice", []Entry{user, withOpaque, tool("a"), tool("a")}, "answered twice"},
		{"wrong order", []Entry{user, withOpaque, tool("b"), tool("a")}, "in call order"},
		{"unknown role", []Entry{user, {Role: "model", Text: "x"}}, `unknown role "model"`},
		{"reasoning dropped", []Entry{user, asst, tool("a"), tool("b")}, "must go back as the model produced them"},
		{"calls changed", []Entry{user, {Role: "assistant", Opaque: `["thinking"]`, Calls: []Call{{ID: "a", Name: "calculator", Args: `{"x":1}`}, {ID: "b", Name: "calculator", Args: "{}"}}},
			tool("a"), tool("b")}, "differ from the ones the model made"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check(tt.entries, sent)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}
