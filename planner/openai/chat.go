package openai

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/shared"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/internal/wire"
)

// ChatOptions configures the OpenAI Chat Completions adapter. The same adapter serves
// any OpenAI-compatible server (DeepSeek, vLLM, Ollama, LM Studio...) through BaseURL.
type ChatOptions struct {
	// APIKey is sent as a bearer token (OPENAI_API_KEY). Empty: the SDK reads
	// OPENAI_API_KEY itself, and local servers that need no key get none.
	APIKey string
	// BaseURL of the API, e.g. https://api.sdk.com/v1 (the default),
	// https://api.deepseek.com/v1 or http://localhost:11434/v1 (OPENAI_BASE_URL).
	BaseURL string
	// Model is the default model name; a run whose model is "openai:<name>" uses <name>.
	Model string
	// HTTPClient replaces the SDK's HTTP client (proxies, tests).
	HTTPClient *http.Client
	// MaxTokens bounds the answer (max_completion_tokens); 0 leaves the server's default.
	MaxTokens int64
	// LegacyMaxTokens sends MaxTokens as max_tokens, for older compatible servers.
	LegacyMaxTokens bool
	// Stream asks for a streamed answer and aggregates it (text, reasoning and
	// tool-call argument deltas) with the SDK's ChatCompletionAccumulator.
	Stream bool
	// Retry is the retry policy; the SDK's own retries are disabled.
	Retry planner.RetryPolicy
	// Logger receives retry warnings (default slog.Default()).
	Logger *slog.Logger
}

// Chat is a planner.Model served by the OpenAI Chat Completions API (POST /chat/completions).
//
// Translation: system and user messages go as they are; an assistant message goes back
// whole (its text, every tool call with its raw arguments, and the non-standard fields
// a compatible server sent, such as DeepSeek's reasoning_content, kept in Raw); each
// tool result follows it as one `tool` message per tool_call_id, in call order. A tool
// result is never sent as user text.
type Chat struct {
	client sdk.Client
	opts   ChatOptions
	log    *slog.Logger
}

var _ planner.Model = (*Chat)(nil)

const providerOpenAI = "openai"

// NewChat returns a Chat Completions adapter.
func NewChat(opts ChatOptions) (*Chat, error) {
	client, log, err := newClient(providerOpenAI, opts.Model, opts.APIKey, opts.BaseURL, opts.HTTPClient, opts.Logger)
	if err != nil {
		return nil, err
	}
	return &Chat{client: client, opts: opts, log: log}, nil
}

// newClient checks the options both OpenAI adapters share and builds the SDK client.
func newClient(provider, model, apiKey, baseURL string, hc *http.Client, log *slog.Logger) (sdk.Client, *slog.Logger, error) {
	if model == "" {
		return sdk.Client{}, nil, errors.New(provider + ": a model name is required")
	}
	if log == nil {
		log = slog.Default()
	}
	return sdk.NewClient(clientOptions(apiKey, baseURL, hc)...), log, nil
}

func clientOptions(apiKey, baseURL string, hc *http.Client) []option.RequestOption {
	opts := []option.RequestOption{option.WithMaxRetries(0)}
	if apiKey != "" {
		opts = append(opts, option.WithAPIKey(apiKey))
	}
	if baseURL != "" {
		opts = append(opts, option.WithBaseURL(baseURL))
	}
	if hc != nil {
		opts = append(opts, option.WithHTTPClient(hc))
	}
	return opts
}

// Complete asks the model for the next assistant message.
func (o *Chat) Complete(ctx context.Context, req planner.Request) (planner.Response, error) {
	params, err := o.params(req)
	if err != nil {
		return planner.Response{}, err
	}
	return wire.Complete(ctx, o.opts.Retry, o.log, string(params.Model), func(ctx context.Context) (planner.Response, error) {
		if o.opts.Stream {
			return o.stream(ctx, req.Step, params)
		}
		return o.complete(ctx, req.Step, params)
	})
}

func (o *Chat) params(req planner.Request) (sdk.ChatCompletionNewParams, error) {
	msgs, err := chatMessages(req.Messages)
	if err != nil {
		return sdk.ChatCompletionNewParams{}, err
	}
	tools, err := chatTools(req.Tools)
	if err != nil {
		return sdk.ChatCompletionNewParams{}, err
	}
	p := sdk.ChatCompletionNewParams{
		Model:    wire.ModelName(providerOpenAI, req.Model, o.opts.Model),
		Messages: msgs,
		Tools:    tools,
	}
	if o.opts.MaxTokens > 0 {
		if o.opts.LegacyMaxTokens {
			p.MaxTokens = sdk.Int(o.opts.MaxTokens)
		} else {
			p.MaxCompletionTokens = sdk.Int(o.opts.MaxTokens)
		}
	}
	if o.opts.Stream {
		p.StreamOptions.IncludeUsage = sdk.Bool(true)
	}
	return p, nil
}

// chatMessages translates the history to Chat Completions messages.
func chatMessages(history []toolbus.Message) ([]sdk.ChatCompletionMessageParamUnion, error) {
	turns, err := wire.GroupHistory(history)
	if err != nil {
		return nil, err
	}
	out := make([]sdk.ChatCompletionMessageParamUnion, 0, len(history))
	for _, t := range turns {
		switch t.Msg.Role {
		case toolbus.RoleSystem:
			out = append(out, sdk.SystemMessage(t.Msg.Content))
		case toolbus.RoleUser:
			out = append(out, sdk.UserMessage(t.Msg.Content))
		case toolbus.RoleAssistant:
			out = append(out, chatAssistant(t.Msg))
			for _, r := range t.Results {
				out = append(out, sdk.ToolMessage(chatToolContent(r), r.ToolCallID))
			}
		}
	}
	return out, nil
}

// chatToolContent is the text of a tool message: Chat Completions tool messages take
// text only, so each attachment of the result is a line that describes it, and the
// model is told that it cannot see them.
func chatToolContent(r toolbus.Message) string {
	if len(r.Attachments) == 0 {
		return r.Content
	}
	var b strings.Builder
	b.WriteString(r.Content)
	for _, a := range r.Attachments {
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(a.Describe())
	}
	b.WriteString("\n(the tool returned these files; Chat Completions passes tool results as text only, so they are described, not shown)")
	return b.String()
}

func chatAssistant(m toolbus.Message) sdk.ChatCompletionMessageParamUnion {
	a := &sdk.ChatCompletionAssistantMessageParam{}
	if m.Content != "" || len(m.ToolCalls) == 0 {
		a.Content.OfString = sdk.String(m.Content)
	}
	for _, c := range m.ToolCalls {
		a.ToolCalls = append(a.ToolCalls, sdk.ChatCompletionMessageToolCallUnionParam{
			OfFunction: &sdk.ChatCompletionMessageFunctionToolCallParam{
				ID:       c.CallID,
				Function: sdk.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Tool, Arguments: c.Arguments},
			},
		})
	}
	if extra := wire.ReadRaw(m.Raw).OpenAIChat; len(extra) > 0 {
		var fields map[string]json.RawMessage
		if json.Unmarshal(extra, &fields) == nil && len(fields) > 0 {
			ef := make(map[string]any, len(fields))
			for k, v := range fields {
				ef[k] = v
			}
			a.SetExtraFields(ef)
		}
	}
	return sdk.ChatCompletionMessageParamUnion{OfAssistant: a}
}

func chatTools(cs []toolbus.ToolContract) ([]sdk.ChatCompletionToolUnionParam, error) {
	if len(cs) == 0 {
		return nil, nil
	}
	out := make([]sdk.ChatCompletionToolUnionParam, 0, len(cs))
	for _, t := range toolbus.OpenAITools(cs) {
		schema, err := wire.SchemaObject(t.Function.Name, t.Function.Parameters)
		if err != nil {
			return nil, err
		}
		def := shared.FunctionDefinitionParam{Name: t.Function.Name, Parameters: schema}
		if t.Function.Description != "" {
			def.Description = sdk.String(t.Function.Description)
		}
		out = append(out, sdk.ChatCompletionToolUnionParam{OfFunction: &sdk.ChatCompletionFunctionToolParam{Function: def}})
	}
	return out, nil
}

func (o *Chat) complete(ctx context.Context, step int, params sdk.ChatCompletionNewParams) (planner.Response, error) {
	var hr *http.Response
	cc, err := o.client.Chat.Completions.New(ctx, params, option.WithResponseInto(&hr))
	if err != nil {
		return planner.Response{}, apiError(providerOpenAI, err, hr)
	}
	if cc == nil || len(cc.Choices) == 0 { // a "null" body decodes to nothing, without error
		return planner.Response{}, wire.Malformed(providerOpenAI, "the answer has no choices")
	}
	msg := cc.Choices[0].Message
	extra := map[string]json.RawMessage{}
	for k, f := range msg.JSON.ExtraFields {
		if raw := f.Raw(); raw != "" && raw != "null" && json.Valid([]byte(raw)) {
			extra[k] = json.RawMessage(raw)
		}
	}
	return chatResponse(step, cc, extra), nil
}

func (o *Chat) stream(ctx context.Context, step int, params sdk.ChatCompletionNewParams) (planner.Response, error) {
	var hr *http.Response
	s := o.client.Chat.Completions.NewStreaming(ctx, params, option.WithResponseInto(&hr))
	defer s.Close()
	var (
		acc       sdk.ChatCompletionAccumulator
		reasoning = map[string]*strings.Builder{}
		keys      []string
		finished  bool
	)
	for s.Next() {
		chunk := s.Current()
		if !acc.AddChunk(chunk) {
			return planner.Response{}, wire.Malformed(providerOpenAI, "a stream chunk could not be aggregated")
		}
		for _, ch := range chunk.Choices {
			if ch.Index != 0 {
				continue
			}
			for _, key := range reasoningKeys {
				f, ok := ch.Delta.JSON.ExtraFields[key]
				if !ok {
					continue
				}
				b := reasoning[key]
				if b == nil {
					b = &strings.Builder{}
					reasoning[key] = b
					keys = append(keys, key)
				}
				b.WriteString(wire.JSONString(json.RawMessage(f.Raw())))
			}
			if ch.FinishReason != "" {
				finished = true
			}
		}
	}
	if err := s.Err(); err != nil {
		return planner.Response{}, apiError(providerOpenAI, err, hr)
	}
	if !finished || len(acc.Choices) == 0 {
		return planner.Response{}, wire.Malformed(providerOpenAI, "the stream ended before the answer was complete")
	}
	extra := map[string]json.RawMessage{}
	for _, k := range keys {
		if s := reasoning[k].String(); s != "" {
			b, _ := json.Marshal(s)
			extra[k] = b
		}
	}
	return chatResponse(step, &acc.ChatCompletion, extra), nil
}

// reasoningKeys are the fields OpenAI-compatible servers put visible reasoning in.
var reasoningKeys = []string{"reasoning_content", "reasoning"}

// chatResponse reads the first choice of a completion. extra holds the message's
// non-standard fields, kept in Raw and sent back with the message.
func chatResponse(step int, cc *sdk.ChatCompletion, extra map[string]json.RawMessage) planner.Response {
	msg := cc.Choices[0].Message
	out := toolbus.Message{Role: toolbus.RoleAssistant, Content: msg.Content}
	if out.Content == "" && msg.Refusal != "" {
		out.Content = msg.Refusal
	}
	for _, key := range reasoningKeys {
		if r := wire.JSONString(extra[key]); r != "" {
			out.Reasoning = r
			break
		}
	}
	for _, tc := range msg.ToolCalls {
		call := toolbus.ToolCall{CallID: tc.ID, Tool: tc.Function.Name, Arguments: tc.Function.Arguments}
		if call.Tool == "" && tc.Custom.Name != "" {
			call.Tool, call.Arguments = tc.Custom.Name, tc.Custom.Input
		}
		out.ToolCalls = append(out.ToolCalls, call)
	}
	planner.NormalizeCallIDs(step, out.ToolCalls)
	if len(extra) > 0 {
		b, _ := json.Marshal(extra)
		out.Raw = wire.RawParts{OpenAIChat: b}.Encode()
	}
	return planner.Response{
		Message: out,
		Usage:   toolbus.Usage{InputTokens: cc.Usage.PromptTokens, OutputTokens: cc.Usage.CompletionTokens},
		Model:   cc.Model,
	}
}

// apiError classifies an error of the OpenAI SDK (Chat Completions and Responses).
func apiError(provider string, err error, hr *http.Response) error {
	var ae *sdk.Error
	if errors.As(err, &ae) {
		var h http.Header
		body := ae.RawJSON()
		if ae.Response != nil {
			h = ae.Response.Header
			if body == "" && ae.Response.Body != nil {
				b, _ := io.ReadAll(io.LimitReader(ae.Response.Body, 4096))
				body = string(b)
			}
		}
		return wire.StatusError(provider, ae.StatusCode, h, ae.Message, body, err)
	}
	if hr != nil && hr.StatusCode >= 400 {
		return wire.StatusError(provider, hr.StatusCode, hr.Header, "", "", err)
	}
	var se *ssestream.StreamError
	if errors.As(err, &se) {
		return &planner.ProviderError{Provider: provider, Message: se.Message, Retryable: true, Err: err}
	}
	return wire.TransportError(provider, err, hr != nil)
}
