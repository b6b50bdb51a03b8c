package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/testutil"
)

// TestAsk: a tool's question goes to the context's asker (its message redacted), an
// accepted answer is checked against the question's schema, and Ask refuses what it
// cannot do: no asker, a schema that is not an object schema, a context that is no
// call's.
func TestAsk(t *testing.T) {
	const secret = "s3cr3t-value-of-the-test"
	schema := json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`)
	cases := []struct {
		name   string
		asker  executor.Asker
		schema json.RawMessage
		want   error  // errors.Is
		action string // when want is nil
	}{
		{name: "accepted", schema: schema, action: "accept",
			asker: func(_ context.Context, q executor.Question) (executor.Answer, error) {
				if q.Message != "how many? [REDACTED]" {
					return executor.Answer{}, errors.New("message not redacted: " + q.Message)
				}
				return executor.Answer{Action: "accept", Content: json.RawMessage(`{"n":3}`)}, nil
			}},
		{name: "declined", schema: schema, action: "decline",
			asker: func(context.Context, executor.Question) (executor.Answer, error) {
				return executor.Answer{Action: "decline"}, nil
			}},
		{name: "answer off the schema", schema: schema, want: executor.ErrInvalidAnswer,
			asker: func(context.Context, executor.Question) (executor.Answer, error) {
				return executor.Answer{Action: "accept", Content: json.RawMessage(`{"n":"three"}`)}, nil
			}},
		{name: "no asker", schema: schema, want: executor.ErrCannotAsk},
		{name: "not an object schema", schema: json.RawMessage(`{"type":"string"}`), want: executor.ErrInvalidQuestion,
			asker: func(context.Context, executor.Question) (executor.Answer, error) { return executor.Answer{}, nil }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var (
				got    executor.Answer
				gotErr error
			)
			reg := executor.NewRegistry()
			if err := reg.Register(executor.Tool{Name: "q", Description: "Asks.", InputSchema: json.RawMessage(`{"type":"object"}`),
				Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
					got, gotErr = executor.Ask(ctx, "how many? "+secret, tc.schema)
					return "ok", nil
				}}); err != nil {
				t.Fatal(err)
			}
			ex := testutil.Must(executor.New(reg, executor.WithSecrets(secret)))
			ctx := context.Background()
			if tc.asker != nil {
				ctx = executor.WithAsker(ctx, tc.asker)
			}
			ex.Execute(ctx, toolbus.ToolCall{CallID: "c1", Tool: "q", Arguments: "{}"}, toolbus.Principal{ID: "p"})
			if tc.want != nil {
				if !errors.Is(gotErr, tc.want) {
					t.Fatalf("Ask error %v, want %v", gotErr, tc.want)
				}
				return
			}
			if gotErr != nil || got.Action != tc.action {
				t.Fatalf("Ask = %+v, %v; want action %s", got, gotErr, tc.action)
			}
		})
	}
	if _, err := executor.Ask(context.Background(), "m", schema); !errors.Is(err, executor.ErrNotRunning) {
		t.Errorf("Ask outside a call: %v, want ErrNotRunning", err)
	}
}

// TestAskNamed: a named question reaches the asker with its key (the control); a key
// that is not 1 to 64 of [A-Za-z0-9_-] is refused before anyone is asked.
func TestAskNamed(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}}}`)
	for _, tc := range []struct {
		key  string
		want error
	}{{"user_name", nil}, {"bad key", executor.ErrInvalidQuestion}, {string(make([]byte, 65)), executor.ErrInvalidQuestion}} {
		var askedKey string
		var gotErr error
		reg := executor.NewRegistry()
		if err := reg.Register(executor.Tool{Name: "q", Description: "Asks.", InputSchema: json.RawMessage(`{"type":"object"}`),
			Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
				_, gotErr = executor.AskNamed(ctx, tc.key, "how many?", schema)
				return "ok", nil
			}}); err != nil {
			t.Fatal(err)
		}
		ctx := executor.WithAsker(context.Background(), func(_ context.Context, q executor.Question) (executor.Answer, error) {
			askedKey = q.Key
			return executor.Answer{Action: "decline"}, nil
		})
		testutil.Must(executor.New(reg)).Execute(ctx, toolbus.ToolCall{CallID: "c1", Tool: "q", Arguments: "{}"}, toolbus.Principal{ID: "p"})
		if tc.want != nil {
			if !errors.Is(gotErr, tc.want) || askedKey != "" {
				t.Errorf("key %q: error %v (asked with %q), want %v and nobody asked", tc.key, gotErr, askedKey, tc.want)
			}
			continue
		}
		if gotErr != nil || askedKey != tc.key {
			t.Errorf("key %q: error %v, asked with key %q", tc.key, gotErr, askedKey)
		}
	}
}
