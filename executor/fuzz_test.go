package executor_test

import (
	"context"
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/testutil"
)

// FuzzArguments runs Execute on arbitrary argument strings: it never panics, the status is
// valid, and the tool runs only for valid arguments.
func FuzzArguments(f *testing.F) {
	for _, s := range []string{
		`{"q":"x"}`, `{"q":"x","limit":5}`, `{"q":"x",}`, `{"q":"x"`, `[1]`, `"x"`, ``, ` `, `null`, `{}`, `{} {}`,
		`{"q":"\u00e9\ud83d\ude00"}`, `{"q":"\ud800"}`, "{\"q\":\"\xff\"}", `{"q":"x","q":1}`, `{"limit":1e400,"q":"x"}`,
		`{"q":"x","filters":[{"field":"a"},{"field":1}]}`, `{"q":"` + openAIKey + `"}`, `{"a":[[[[[[[[[[]]]]]]]]]]}`,
		"{\"q\":\"x\"}\x00", `{"q":-0.0e-0}`, `{"q":"x"}]`, `{"q":"x"}}`, "{\"q\":\"x\"} \n",
	} {
		f.Add(s)
	}
	reg := executor.NewRegistry()
	var ran int
	err := reg.Register(executor.Tool{Name: "search", InputSchema: json.RawMessage(searchSchema),
		Func: func(_ context.Context, args json.RawMessage) (any, error) {
			ran++
			if !json.Valid(args) {
				return nil, executor.NewError("bad_args", "tool got invalid JSON")
			}
			var m map[string]any
			if err := json.Unmarshal(args, &m); err != nil {
				return nil, err
			}
			return m, nil
		}})
	if err != nil {
		f.Fatal(err)
	}
	ex := testutil.Must(executor.New(reg))
	f.Fuzz(func(t *testing.T, args string) {
		ran = 0
		r := ex.Execute(context.Background(), toolbus.ToolCall{CallID: "c", Tool: "search", Arguments: args}, toolbus.Principal{})
		if !r.Status.Valid() {
			t.Fatalf("invalid status %q", r.Status)
		}
		if !utf8.ValidString(r.Content) {
			t.Fatalf("content not UTF-8: %q", r.Content)
		}
		switch r.Status {
		case toolbus.StatusSucceeded:
			if ran != 1 || !json.Valid(r.Output) {
				t.Fatalf("succeeded: ran %d output %q", ran, r.Output)
			}
		case toolbus.StatusRejected:
			if ran != 0 || r.Code() != toolbus.CodeInvalidArguments || !json.Valid([]byte(r.Content)) {
				t.Fatalf("rejected: ran %d: %+v", ran, r)
			}
		default:
			t.Fatalf("unexpected %s: %+v", r.Status, r)
		}
	})
}
