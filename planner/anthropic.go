package planner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/param"

	"github.com/toolbus/toolbus"
)

// AnthropicOptions configures the Anthropic Messages adapter.
type AnthropicOptions struct {
	// APIKey of the Anthropic API (ANTHROPIC_API_KEY); empty: the SDK's own credential
	// chain (ANTHROPIC_API_KEY, ANTHROPIC_AUTH_TOKEN, profiles).
	APIKey string
	// BaseURL of the API (ANTHROPIC_BASE_URL); empty: https://api.anthropic.com.
	BaseURL string
	// Model is the default model name; a run whose model is "anthropic:<name>" uses
	// <name>.
	Model string
	// HTTPClient replaces the SDK's HTTP client.
	HTTPClient *http.Client
	// MaxTokens bounds the answer (max_tokens, required by the API; default 4096).
	MaxTokens int64
	// ThinkingBudget enables extended thinking with this many budget tokens (at least
	// 1024, less than MaxTokens); 0 leaves thinking to the model's default.
	ThinkingBudget int64
	// Stream asks for a streamed answer and aggregates its events (text, thinking,
	// signature and tool input deltas) with the SDK's Message.Accumulate.
	Stream bool
	// Retry is the retry policy; the SDK's own retries are disabled.
	Retry RetryPolicy
	// Logger receives retry warnings (default slog.Default()).
	Logger *slog.Logger
}

// DefaultAnthropicMaxTokens is max_tokens when AnthropicOptions.MaxTokens is 0.
const DefaultAnthropicMaxTokens = 4096

// Anthropic is a Model served by the Anthropic Messages API (POST /v1/messages).
//
// Translation: system messages become the top-level system prompt; the content blocks
// of an answer (thinking with its signature, redacted_thinking, text, tool_use) are kept
// in Raw and sent back as they came; tool results go first in the next user message as
// tool_result blocks (tool_use_id, is_error for results that did not succeed), one user
// message for all results of a step, followed by any user text. Roles strictly
// alternate.
type Anthropic struct {
	client anthropic.Client
	opts   AnthropicOptions
	log    *slog.Logger
}

var _ Model = (*Anthropic)(nil)

const providerAnthropic = "anthropic"

// NewAnthropic returns a Messages adapter.
func NewAnthropic(opts AnthropicOptions) (*Anthropic, error) {
	if opts.Model == "" {
		return nil, errors.New("planner: anthropic: a model name is required")
	}
	if opts.MaxTokens <= 0 {
		opts.MaxTokens = DefaultAnthropicMaxTokens
	}
	if opts.ThinkingBudget > 0 && opts.ThinkingBudget >= opts.MaxTokens {
		return nil, fmt.Errorf("planner: anthropic: thinking budget %d must be below max tokens %d", opts.ThinkingBudget, opts.MaxTokens)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	copts := []option.RequestOption{option.WithMaxRetries(0)}
	if opts.APIKey != "" {
		copts = append(copts, option.WithAPIKey(opts.APIKey))
	}
	if opts.BaseURL != "" {
		copts = append(copts, option.WithBaseURL(opts.BaseURL))
	}
	if opts.HTTPClient != nil {
		copts = append(copts, option.WithHTTPClient(opts.HTTPClient))
	}
	return &Anthropic{client: anthropic.NewClient(copts...), opts: opts, log: log}, nil
}

// Complete asks the model for the next assistant message.
func (a *Anthropic) Complete(ctx context.Context, req Request) (Response, error) {
	params, err := a.params(req)
	if err != nil {
		return Response{}, err
	}
	var resp Response
	err = a.opts.Retry.do(ctx, a.log, func(ctx context.Context) error {
		var (
			hr  *http.Response
			msg *anthropic.Message
			err error
		)
		if a.opts.Stream {
			msg, err = a.stream(ctx, params, &hr)
		} else {
			msg, err = a.client.Messages.New(ctx, params, option.WithResponseInto(&hr))
		}
		if err != nil {
			return anthropicError(err, hr)
		}
		if msg == nil { // a "null" body decodes to nothing, without error
			return malformed(providerAnthropic, "the answer is empty")
		}
		resp = anthropicResponse(req.Step, msg)
		return nil
	})
	if err != nil {
		return Response{}, err
	}
	if resp.Model == "" {
		resp.Model = params.Model
	}
	return resp, nil
}

func (a *Anthropic) stream(ctx context.Context, params anthropic.MessageNewParams, hr **http.Response) (*anthropic.Message, error) {
	s := a.client.Messages.NewStreaming(ctx, params, option.WithResponseInto(hr))
	defer s.Close()
	var msg anthropic.Message
	stopped := false
	for s.Next() {
		ev := s.Current()
		if err := msg.Accumulate(ev); err != nil {
			return nil, malformed(providerAnthropic, "stream: %v", err)
		}
		if ev.Type == "message_stop" {
			stopped = true
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if !stopped {
		return nil, malformed(providerAnthropic, "the stream ended before message_stop")
	}
	return &msg, nil
}

func (a *Anthropic) params(req Request) (anthropic.MessageNewParams, error) {
	system, msgs, err := anthropicMessages(req.Messages)
	if err != nil {
		return anthropic.MessageNewParams{}, err
	}
	tools, err := anthropicTools(req.Tools)
	if err != nil {
		return anthropic.MessageNewParams{}, err
	}
	p := anthropic.MessageNewParams{
		Model:     modelName(providerAnthropic, req.Model, a.opts.Model),
		MaxTokens: a.opts.MaxTokens,
		System:    system,
		Messages:  msgs,
		Tools:     tools,
	}
	if a.opts.ThinkingBudget > 0 {
		p.Thinking = anthropic.ThinkingConfigParamUnion{OfEnabled: &anthropic.ThinkingConfigEnabledParam{BudgetTokens: a.opts.ThinkingBudget}}
	}
	return p, nil
}

// anthropicMessages translates the history to a system prompt and strictly
// alternating user and assistant messages.
func anthropicMessages(history []toolbus.Message) ([]anthropic.TextBlockParam, []anthropic.MessageParam, error) {
	turns, err := groupHistory(history)
	if err != nil {
		return nil, nil, err
	}
	var (
		system []anthropic.TextBlockParam
		out    []anthropic.MessageParam
		role   toolbus.Role
		blocks []anthropic.ContentBlockParamUnion
	)
	flush := func() {
		if len(blocks) == 0 {
			return
		}
		if role == toolbus.RoleUser {
			out = append(out, anthropic.MessageParam{OfUser: &anthropic.UserMessageParam{Content: blocks}})
		} else {
			out = append(out, anthropic.MessageParam{OfAssistant: &anthropic.AssistantMessageParam{Content: blocks}})
		}
		blocks = nil
	}
	add := func(r toolbus.Role, bs ...anthropic.ContentBlockParamUnion) {
		if len(bs) == 0 {
			return
		}
		if r != role {
			flush()
			role = r
		}
		blocks = append(blocks, bs...)
	}
	for _, t := range turns {
		switch t.msg.Role {
		case toolbus.RoleSystem:
			if t.msg.Content != "" {
				system = append(system, anthropic.TextBlockParam{Text: t.msg.Content})
			}
		case toolbus.RoleUser:
			if t.msg.Content != "" {
				add(toolbus.RoleUser, anthropic.NewTextBlock(t.msg.Content))
			}
		case toolbus.RoleAssistant:
			add(toolbus.RoleAssistant, anthropicAssistant(t.msg)...)
			// The results open the next user message: tool_result blocks come first.
			results := make([]anthropic.ContentBlockParamUnion, 0, len(t.results))
			for _, r := range t.results {
				results = append(results, anthropicToolResult(r))
			}
			if len(results) > 0 {
				flush()
				add(toolbus.RoleUser, results...)
			}
		}
	}
	flush()
	return system, out, nil
}

func anthropicToolResult(r toolbus.Message) anthropic.ContentBlockParamUnion {
	tr := &anthropic.ToolResultBlockParam{ToolUseID: r.ToolCallID}
	content := r.Content
	if r.IsError {
		tr.IsError = anthropic.Bool(true)
		if content == "" {
			content = "(the tool call did not succeed and returned no details)"
		}
	}
	if content != "" {
		tr.Content = []anthropic.ToolResultBlockParamContentUnion{{OfText: &anthropic.TextBlockParam{Text: content}}}
	}
	return anthropic.ContentBlockParamUnion{OfToolResult: tr}
}

// anthropicBlock is the part of a content block toolbus reads from Raw.
type anthropicBlock struct {
	Type  string          `json:"type"`
	ID    string          `json:"id"`
	Input json.RawMessage `json:"input"`
}

// anthropicAssistant returns the content blocks of an assistant message: its raw blocks
// when it has them (tool_use ids set to the calls' ids, which toolbus may have
// normalized), else blocks rebuilt from the portable fields (a thinking block only
// with its signature, which the API requires).
func anthropicAssistant(m toolbus.Message) []anthropic.ContentBlockParamUnion {
	var raws []json.RawMessage
	if raw := readRaw(m.Raw).Anthropic; len(raw) > 0 && json.Unmarshal(raw, &raws) == nil {
		var uses []int
		for i, b := range raws {
			var ab anthropicBlock
			if json.Unmarshal(b, &ab) == nil && ab.Type == "tool_use" {
				uses = append(uses, i)
			}
		}
		if len(uses) == len(m.ToolCalls) {
			for k, i := range uses {
				var ab anthropicBlock
				_ = json.Unmarshal(raws[i], &ab)
				if ab.ID != m.ToolCalls[k].CallID {
					raws[i] = setJSONField(raws[i], "id", m.ToolCalls[k].CallID)
				}
				if in := bytes.TrimSpace(ab.Input); len(in) == 0 || in[0] != '{' {
					// A compatible server sent no object input; the API requires one.
					raws[i] = setJSONField(raws[i], "input", objectArguments(m.ToolCalls[k].Arguments))
				}
			}
			out := make([]anthropic.ContentBlockParamUnion, 0, len(raws))
			for _, b := range raws {
				out = append(out, param.Override[anthropic.ContentBlockParamUnion](b))
			}
			return out
		}
	}
	var out []anthropic.ContentBlockParamUnion
	if m.Reasoning != "" && m.ReasoningSignature != "" {
		out = append(out, anthropic.ContentBlockParamUnion{OfThinking: &anthropic.ThinkingBlockParam{
			Thinking: m.Reasoning, Signature: m.ReasoningSignature}})
	}
	if m.Content != "" {
		out = append(out, anthropic.NewTextBlock(m.Content))
	}
	for _, c := range m.ToolCalls {
		out = append(out, anthropic.ContentBlockParamUnion{OfToolUse: &anthropic.ToolUseBlockParam{
			ID: c.CallID, Name: c.Tool, Input: objectArguments(c.Arguments)}})
	}
	return out
}

func anthropicTools(cs []toolbus.ToolContract) ([]anthropic.ToolUnionParam, error) {
	if len(cs) == 0 {
		return nil, nil
	}
	out := make([]anthropic.ToolUnionParam, 0, len(cs))
	for _, t := range toolbus.AnthropicTools(cs) {
		if _, err := schemaObject(t.Name, t.InputSchema); err != nil {
			return nil, err
		}
		tp := &anthropic.ToolParam{
			Name: t.Name,
			// The schema goes byte for byte as the executor published it.
			InputSchema: param.Override[anthropic.ToolInputSchemaParam](t.InputSchema),
		}
		if t.Description != "" {
			tp.Description = anthropic.String(t.Description)
		}
		out = append(out, anthropic.ToolUnionParam{OfTool: tp})
	}
	return out, nil
}

// anthropicResponse reads a Messages answer; every content block is kept in Raw.
func anthropicResponse(step int, m *anthropic.Message) Response {
	out := toolbus.Message{Role: toolbus.RoleAssistant}
	var text, thinking []string
	raws := make([]json.RawMessage, 0, len(m.Content))
	for _, b := range m.Content {
		switch b.Type {
		case "text":
			text = append(text, b.Text)
		case "thinking":
			thinking = append(thinking, b.Thinking)
			if out.ReasoningSignature == "" {
				out.ReasoningSignature = b.Signature
			}
		case "tool_use":
			args := bytes.TrimSpace(b.Input)
			if len(args) == 0 || string(args) == "null" {
				args = []byte("{}")
			}
			out.ToolCalls = append(out.ToolCalls, toolbus.ToolCall{CallID: b.ID, Tool: b.Name, Arguments: compactJSON(args)})
		}
		raw := json.RawMessage(b.RawJSON())
		if !json.Valid(raw) {
			raw, _ = json.Marshal(b.ToParam())
		}
		raws = append(raws, raw)
	}
	out.Content = strings.Join(text, "\n")
	out.Reasoning = strings.Join(thinking, "\n")
	NormalizeCallIDs(step, out.ToolCalls)
	if len(raws) > 0 {
		if b, err := json.Marshal(raws); err == nil {
			out.Raw = rawParts{Anthropic: b}.encode()
		}
	}
	u := m.Usage
	return Response{
		Message: out,
		// Input tokens are input_tokens plus the cache writes and reads: all of them
		// were read by the model and count for the run's token budget.
		Usage: toolbus.Usage{InputTokens: u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens, OutputTokens: u.OutputTokens},
		Model: m.Model,
	}
}

// anthropicError classifies an error of the Anthropic SDK.
func anthropicError(err error, hr *http.Response) error {
	var ae *anthropic.Error
	if errors.As(err, &ae) {
		var h http.Header
		if ae.Response != nil {
			h = ae.Response.Header
		}
		pe := statusError(providerAnthropic, ae.StatusCode, h, ae.Message, ae.RawJSON(), err)
		if ae.StatusCode < 400 {
			// An error event in the middle of a stream (overloaded_error, api_error):
			// the request was accepted, so another attempt may succeed.
			pe.Status, pe.Retryable = 0, true
		}
		return pe
	}
	if hr != nil && hr.StatusCode >= 400 {
		return statusError(providerAnthropic, hr.StatusCode, hr.Header, "", "", err)
	}
	return transportError(providerAnthropic, err, hr != nil)
}
