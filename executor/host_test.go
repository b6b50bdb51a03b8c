package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/testutil"
)

// TestAskAll: questions asked together are numbered in the order given (seqs after the
// call's earlier questions, marked as one batch) and wait at once: the asker answers
// none until all three are asked; each answer is checked by its kind (a form's against
// its schema, the host's results as objects) and decoded by Sample and ListRoots; two
// questions under one key and an unknown method are refused before anyone is asked.
func TestAskAll(t *testing.T) {
	form := executor.Question{Key: "user_name", Message: "Name?", Schema: json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`)}
	sample := executor.SamplingQuestion("greeting", &mcp.CreateMessageParams{MaxTokens: 5, Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "hi"}}}})
	var (
		mu    sync.Mutex
		asked []executor.Question
		all   = make(chan struct{})
	)
	asker := func(ctx context.Context, q executor.Question) (executor.Answer, error) {
		mu.Lock()
		if asked = append(asked, q); len(asked) == 4 {
			close(all) // the lone first question, then the batch of three
		}
		mu.Unlock()
		if q.BatchSize > 0 {
			select {
			case <-all:
			case <-ctx.Done():
				return executor.Answer{}, ctx.Err()
			}
		}
		switch q.Method {
		case toolbus.AskSample:
			return executor.Answer{Action: "accept", Content: json.RawMessage(`{"role":"assistant","content":{"type":"text","text":"Hello!"},"model":"m"}`)}, nil
		case toolbus.AskRoots:
			return executor.Answer{Action: "accept", Content: json.RawMessage(`{"roots":[{"uri":"file:///w"}]}`)}, nil
		}
		return executor.Answer{Action: "accept", Content: json.RawMessage(`{"name":"Alice"}`)}, nil
	}
	var got string
	var gotErr error
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "q", Description: "Asks.", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			if _, err := executor.AskAll(ctx, form, form); !errors.Is(err, executor.ErrInvalidQuestion) {
				return nil, fmt.Errorf("two questions under one key: %v", err)
			}
			if _, err := executor.AskAll(ctx, executor.Question{Method: "resources/read", Params: json.RawMessage(`{}`)}); !errors.Is(err, executor.ErrInvalidQuestion) {
				return nil, fmt.Errorf("unknown method: %v", err)
			}
			res, err := executor.Sample(ctx, "first", &mcp.CreateMessageParams{MaxTokens: 5})
			if err != nil {
				return nil, err
			}
			as, err := executor.AskAll(ctx, form, sample, executor.RootsQuestion("client_roots"))
			var roots mcp.ListRootsResult
			if err == nil {
				err = executor.DecodeAnswer(as[2], &roots)
			}
			gotErr = err
			got = fmt.Sprintf("%s|%s|%s", res.Content.(*mcp.TextContent).Text, as[0].Content, roots.Roots[0].URI)
			return "ok", nil
		}}); err != nil {
		t.Fatal(err)
	}
	ctx := executor.WithAsker(context.Background(), asker)
	res := testutil.Must(executor.New(reg)).Execute(ctx, toolbus.ToolCall{CallID: "c1", Tool: "q", Arguments: "{}"}, toolbus.Principal{ID: "p"})
	if res.Status != toolbus.StatusSucceeded || gotErr != nil || got != `Hello!|{"name":"Alice"}|file:///w` {
		t.Fatalf("result %s %s, error %v, got %q", res.Status, res.Content, gotErr, got)
	}
	if len(asked) != 4 || asked[0].Seq != 1 || asked[0].BatchSize != 0 {
		t.Fatalf("asked %+v, want the lone question 1 then a batch of 3", asked)
	}
	seqs := map[int]string{}
	for _, q := range asked[1:] {
		if q.Batch != 2 || q.BatchSize != 3 {
			t.Errorf("question %d %q: batch %d of %d, want 2 of 3", q.Seq, q.Key, q.Batch, q.BatchSize)
		}
		seqs[q.Seq] = q.Key
	}
	if seqs[2] != "user_name" || seqs[3] != "greeting" || seqs[4] != "client_roots" {
		t.Errorf("seqs %v, want 2, 3, 4 in the order given", seqs)
	}
}
