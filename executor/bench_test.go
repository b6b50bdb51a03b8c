package executor_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/testutil"
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
	ex := testutil.Must(executor.New(reg, executor.WithInstance("bench")))
	ctx := context.Background()
	call := toolbus.ToolCall{CallID: "call_1", Tool: "noop", Arguments: `{"x":"hello"}`}
	p := toolbus.Principal{ID: "bench"}
	b.ReportAllocs()
	for b.Loop() {
		res := ex.Execute(ctx, call, p)
		if res.Status != toolbus.StatusSucceeded {
			b.Fatalf("status %s: %s", res.Status, res.Content)
		}
	}
}

// BenchmarkExecuteTyped measures a RegisterFunc tool with a struct input and output
// (decode into In, canonical re-encoding of the output, redaction scan).
func BenchmarkExecuteTyped(b *testing.B) {
	type in struct {
		City  string `json:"city" jsonschema:"minLength=1"`
		Units string `json:"units,omitempty" jsonschema:"enum=metric,enum=imperial"`
	}
	type out struct {
		City  string  `json:"city"`
		TempC float64 `json:"temp_c"`
		Sky   string  `json:"sky"`
	}
	reg := executor.NewRegistry()
	err := executor.RegisterFunc(reg, executor.Tool{Name: "weather", ReadOnly: true},
		func(_ context.Context, a in) (out, error) { return out{City: a.City, TempC: 21.5, Sky: "clear"}, nil })
	if err != nil {
		b.Fatal(err)
	}
	ex := testutil.Must(executor.New(reg))
	ctx := context.Background()
	call := toolbus.ToolCall{CallID: "call_1", Tool: "weather", Arguments: `{"city":"Paris","units":"metric"}`}
	b.ReportAllocs()
	for b.Loop() {
		if res := ex.Execute(ctx, call, toolbus.Principal{}); res.Status != toolbus.StatusSucceeded {
			b.Fatalf("status %s: %s", res.Status, res.Content)
		}
	}
}

// BenchmarkRedactSecrets measures the redaction of a 16 KiB JSON output (200 strings)
// by three secrets, each with its encodings and the split check: the cost WithSecrets
// adds to every result of the executor role.
func BenchmarkRedactSecrets(b *testing.B) {
	lines := make([]string, 200)
	for i := range lines {
		lines[i] = "2026-12-05T10:00:00Z auth-api: request served in 12ms, pool 7/64, ok " + string(rune('a'+i%26))
	}
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "logs", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(context.Context, json.RawMessage) (any, error) { return map[string]any{"lines": lines}, nil }}); err != nil {
		b.Fatal(err)
	}
	ex := testutil.Must(executor.New(reg, executor.WithSecrets("n4ts-PwPwPwPwPwPw", "sk-not-a-real-key-0123456789abcdef", "s3cr3t/p@ss w0rd")))
	ctx := context.Background()
	call := toolbus.ToolCall{CallID: "call_1", Tool: "logs", Arguments: `{}`}
	b.ReportAllocs()
	for b.Loop() {
		if res := ex.Execute(ctx, call, toolbus.Principal{}); res.Status != toolbus.StatusSucceeded || res.Redactions != 0 {
			b.Fatalf("status %s, %d redactions", res.Status, res.Redactions)
		}
	}
}
