package executor_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/executor"
)

// BenchmarkExecute measures the whole call path for a no-op tool with a small schema.
func BenchmarkExecute(b *testing.B) {
	reg := executor.NewRegistry()
	err := reg.Register(executor.Tool{
		Name:        "noop",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"x":{"type":"string"}}}`),
		ReadOnly:    true,
		Func:        func(context.Context, json.RawMessage) (any, error) { return nil, nil },
	})
	if err != nil {
		b.Fatal(err)
	}
	ex := executor.New(reg, executor.WithInstance("bench"))
	ctx := context.Background()
	call := events.ToolCall{CallID: "call_1", Tool: "noop", Arguments: `{"x":"hello"}`}
	p := events.Principal{ID: "bench"}
	b.ReportAllocs()
	for b.Loop() {
		res := ex.Execute(ctx, call, p)
		if res.Status != events.StatusSucceeded {
			b.Fatalf("status %s: %s", res.Status, res.Content)
		}
	}
}
