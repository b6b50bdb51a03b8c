package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
)

// What a tool may ask of the caller's host besides its user's answer to a form (Ask):
// a completion of the host's model (Sample: MCP sampling/createMessage) and the host's
// roots (ListRoots: roots/list), and several of these at once (AskAll). Each is a
// question on the bus like Ask's (tool.question with its method; the answer is the
// host's result), durable the same way; `toolbus mcp` asks the host as input requests
// of one input_required result, and a host that did not declare the capability a
// question needs gets none of it: the tool's answer is cancel, with the reason.

// anyObject is the answer schema of a question to the host (its result is one object),
// so that `toolbus answer` and the console can answer it too.
var anyObject = json.RawMessage(`{"type":"object"}`)

// SamplingQuestion is the question that asks the host's model to complete p.
func SamplingQuestion(key string, p *mcp.CreateMessageParams) Question {
	raw, _ := json.Marshal(p) //nolint:errcheck // plain data
	return Question{Key: key, Method: toolbus.AskSample, Params: raw, Schema: anyObject,
		Message: "The tool asks the host's model for a completion (sampling/createMessage): answer with a CreateMessageResult."}
}

// RootsQuestion is the question that asks the host for its roots.
func RootsQuestion(key string) Question {
	return Question{Key: key, Method: toolbus.AskRoots, Params: json.RawMessage(`{}`), Schema: anyObject,
		Message: "The tool asks the host for its roots (roots/list): answer with a ListRootsResult."}
}

// Sample asks the caller's host's model to complete p (MCP sampling) under key and
// returns its message. A decline or cancel (a host without sampling) is an error
// wrapping ErrCannotAsk, with the reason.
func Sample(ctx context.Context, key string, p *mcp.CreateMessageParams) (*mcp.CreateMessageResult, error) {
	var res mcp.CreateMessageResult
	if err := askFor(ctx, SamplingQuestion(key, p), &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// ListRoots asks the caller's host for its roots (MCP roots/list) under key. A host
// without roots is an error wrapping ErrCannotAsk, with the reason.
func ListRoots(ctx context.Context, key string) ([]*mcp.Root, error) {
	var res mcp.ListRootsResult
	if err := askFor(ctx, RootsQuestion(key), &res); err != nil {
		return nil, err
	}
	return res.Roots, nil
}

// askFor asks q alone and decodes an accepted answer into v.
func askFor(ctx context.Context, q Question, v any) error {
	as, err := AskAll(ctx, q)
	if err != nil {
		return err
	}
	return DecodeAnswer(as[0], v)
}

// DecodeAnswer decodes the content of an accepted answer into v; any other answer is an
// error wrapping ErrCannotAsk that says why.
func DecodeAnswer(a Answer, v any) error {
	if a.Action != "accept" {
		return fmt.Errorf("%w: %s %s", ErrCannotAsk, a.Action, a.Reason)
	}
	if err := json.Unmarshal(a.Content, v); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidAnswer, err)
	}
	return nil
}

// AskAll asks qs together and waits for all their answers (in qs's order): a host gets
// them as the input requests of one input_required result and may answer them in any
// order. Each is Ask's (a form), or one made by SamplingQuestion or RootsQuestion; keys
// are distinct. Errors are Ask's; an error of one question (ErrInvalidAnswer) is joined
// to the others' and its answer is still returned.
func AskAll(ctx context.Context, qs ...Question) ([]Answer, error) {
	checks := make([]func(Answer) error, len(qs))
	keys := map[string]bool{}
	for i, q := range qs {
		check, err := checkQuestion(q)
		if err == nil && q.Key != "" && keys[q.Key] {
			err = fmt.Errorf("key %q is used twice", q.Key)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidQuestion, err)
		}
		keys[q.Key], checks[i] = true, check
	}
	c, _ := ctx.Value(progressKey{}).(*callCtx)
	if c == nil || !c.running() {
		return nil, fmt.Errorf("%w: no tool call running in this context (call Ask with the context the tool was given)", ErrNotRunning)
	}
	if len(qs) == 0 {
		return nil, nil
	}
	if c.asker == nil {
		return nil, fmt.Errorf("%w: this executor runs without a bus worker", ErrCannotAsk)
	}
	c.mu.Lock()
	first := c.asked + 1
	c.asked += len(qs)
	c.mu.Unlock()
	answers, errs := make([]Answer, len(qs)), make([]error, len(qs))
	var wg sync.WaitGroup
	for i, q := range qs {
		q.Seq = first + i
		if len(qs) > 1 {
			q.Batch, q.BatchSize = first, len(qs)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], errs[i] = c.asker(ctx, q)
			if errs[i] == nil && answers[i].Action == "accept" {
				errs[i] = checks[i](answers[i])
			}
		}()
	}
	wg.Wait()
	return answers, errors.Join(errs...)
}

// checkQuestion checks q and returns the check of an accepted answer to it.
func checkQuestion(q Question) (func(Answer) error, error) {
	if !validQuestionKey(q.Key) {
		return nil, fmt.Errorf("key %q is not 1 to 64 of [A-Za-z0-9_-]", q.Key)
	}
	switch q.Method {
	case "", toolbus.AskElicit:
		if err := checkObjectSchema(q.Schema); err != nil {
			return nil, err
		}
		compiled, err := compileSchema(q.Schema, "question")
		if err != nil {
			return nil, err
		}
		return func(a Answer) error {
			v, err := decodeJSON(a.Content)
			if err == nil {
				err = compiled.Validate(v)
			}
			if err != nil {
				return fmt.Errorf("%w: %v", ErrInvalidAnswer, err)
			}
			return nil
		}, nil
	case toolbus.AskSample, toolbus.AskRoots:
		var p map[string]any
		if err := json.Unmarshal(q.Params, &p); err != nil || p == nil {
			return nil, fmt.Errorf("the params of %s are not a JSON object", q.Method)
		}
		return func(a Answer) error {
			var m map[string]any
			if json.Unmarshal(a.Content, &m) != nil || m == nil {
				return fmt.Errorf("%w: the host's %s result is not a JSON object", ErrInvalidAnswer, q.Method)
			}
			return nil
		}, nil
	}
	return nil, fmt.Errorf("unknown method %q (want %s, %s or %s)", q.Method, toolbus.AskElicit, toolbus.AskSample, toolbus.AskRoots)
}
