package planner

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/shared"

	"github.com/toolbus/toolbus"
)

// OpenAIOptions configures the OpenAI Chat Completions adapter. The same adapter serves
// any OpenAI-compatible server (DeepSeek, vLLM, Ollama, LM Studio...) through BaseURL.
type OpenAIOptions struct {
	// APIKey is sent as a bearer token (OPENAI_API_KEY). Empty: the SDK reads
	// OPENAI_API_KEY itself, and local servers that need no key get none.
	APIKey string
	// BaseURL of the API, e.g. https://api.openai.com/v1 (the default),
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
	Retry RetryPolicy
	// Logger receives retry warnings (default slog.Default()).
	Logger *slog.Logger
}

// OpenAI is a Model served by the OpenAI Chat Completions API (POST /chat/completions).
//
// Translation: system and user messages go as they are; an assistant message goes back
// whole (its text, every tool call with its raw arguments, and the non-standard fields
// a compatible server sent, such as DeepSeek's reasoning_content, kept in Raw); each
// tool result follows it as one `tool` message per tool_call_id, in call order. A tool
// result is never sent as user text.
type OpenAI struct {
	client openai.Client
	opts   OpenAIOptions
	log    *slog.Logger
}

var _ Model = (*OpenAI)(nil)

const providerOpenAI = "openai"

// NewOpenAI returns a Chat Completions adapter.
func NewOpenAI(opts OpenAIOptions) (*OpenAI, error) {
	client, log, err := newOpenAIClient(providerOpenAI, opts.Model, opts.APIKey, opts.BaseURL, opts.HTTPClient, opts.Logger)
	if err != nil {
		return nil, err
	}
	return &OpenAI{client: client, opts: opts, log: log}, nil
}

// newOpenAIClient checks the options both OpenAI adapters share and builds the SDK client.
func newOpenAIClient(provider, model, apiKey, baseURL string, hc *http.Client, log *slog.Logger) (openai.Client, *slog.Logger, error) {
	if model == "" {
		return openai.Client{}, nil, errors.New("planner: " + provider + ": a model name is required")
	}
	if log == nil {
		log = slog.Default()
	}
	return openai.NewClient(openaiClientOptions(apiKey, baseURL, hc)...), log, nil
}

func openaiClientOptions(apiKey, baseURL string, hc *http.Client) []option.RequestOption {
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
func (o *OpenAI) Complete(ctx context.Context, req Request) (Response, error) {
	params, err := o.params(req)
	if err != nil {
		return Response{}, err
	}
	var resp Response
	err = o.opts.Retry.do(ctx, o.log, func(ctx context.Context) error {
		var err error
		if o.opts.Stream {
			resp, err = o.stream(ctx, req.Step, params)
		} else {
			resp, err = o.complete(ctx, req.Step, params)
		}
		return err
	})
	if err != nil {
		return Response{}, err
	}
	if resp.Model == "" {
		resp.Model = params.Model
	}
	return resp, nil
}

func (o *OpenAI) params(req Request) (openai.ChatCompletionNewParams, error) {
	msgs, err := chatMessages(req.Messages)
	if err != nil {
		return openai.ChatCompletionNewParams{}, err
	}
	tools, err := chatTools(req.Tools)
	if err != nil {
		return openai.ChatCompletionNewParams{}, err
	}
	p := openai.ChatCompletionNewParams{
		Model:    modelName(providerOpenAI, req.Model, o.opts.Model),
		Messages: msgs,
		Tools:    tools,
	}
	if o.opts.MaxTokens > 0 {
		if o.opts.LegacyMaxTokens {
			p.MaxTokens = openai.Int(o.opts.MaxTokens)
		} else {
			p.MaxCompletionTokens = openai.Int(o.opts.MaxTokens)
		}
	}
	if o.opts.Stream {
		p.StreamOptions.IncludeUsage = openai.Bool(true)
	}
	return p, nil
}

// chatMessages translates the history to Chat Completions messages.
func chatMessages(history []toolbus.Message) ([]openai.ChatCompletionMessageParamUnion, error) {
	turns, err := groupHistory(history)
	if err != nil {
		return nil, err
	}
	out := make([]openai.ChatCompletionMessageParamUnion, 0, len(history))
	for _, t := range turns {
		switch t.msg.Role {
		case toolbus.RoleSystem:
			out = append(out, openai.SystemMessage(t.msg.Content))
		case toolbus.RoleUser:
			out = append(out, openai.UserMessage(t.msg.Content))
		case toolbus.RoleAssistant:
			out = append(out, chatAssistant(t.msg))
			for _, r := range t.results {
				out = append(out, openai.ToolMessage(r.Content, r.ToolCallID))
			}
		}
	}
	return out, nil
}

func chatAssistant(m toolbus.Message) openai.ChatCompletionMessageParamUnion {
	a := &openai.ChatCompletionAssistantMessageParam{}
	if m.Content != "" || len(m.ToolCalls) == 0 {
		a.Content.OfString = openai.String(m.Content)
	}
	for _, c := range m.ToolCalls {
		a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
			OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
				ID:       c.CallID,
				Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Tool, Arguments: c.Arguments},
			},
		})
	}
	if extra := readRaw(m.Raw).OpenAIChat; len(extra) > 0 {
		var fields map[string]json.RawMessage
		if json.Unmarshal(extra, &fields) == nil && len(fields) > 0 {
			ef := make(map[string]any, len(fields))
			for k, v := range fields {
				ef[k] = v
			}
			a.SetExtraFields(ef)
		}
	}
	return openai.ChatCompletionMessageParamUnion{OfAssistant: a}
}

func chatTools(cs []toolbus.ToolContract) ([]openai.ChatCompletionToolUnionParam, error) {
	if len(cs) == 0 {
		return nil, nil
	}
	out := make([]openai.ChatCompletionToolUnionParam, 0, len(cs))
	for _, t := range toolbus.OpenAITools(cs) {
		schema, err := schemaObject(t.Function.Name, t.Function.Parameters)
		if err != nil {
			return nil, err
		}
		def := shared.FunctionDefinitionParam{Name: t.Function.Name, Parameters: schema}
		if t.Function.Description != "" {
			def.Description = openai.String(t.Function.Description)
		}
		out = append(out, openai.ChatCompletionToolUnionParam{OfFunction: &openai.ChatCompletionFunctionToolParam{Function: def}})
	}
	return out, nil
}

func (o *OpenAI) complete(ctx context.Context, step int, params openai.ChatCompletionNewParams) (Response, error) {
	var hr *http.Response
	cc, err := o.client.Chat.Completions.New(ctx, params, option.WithResponseInto(&hr))
	if err != nil {
		return Response{}, openaiError(providerOpenAI, err, hr)
	}
	if cc == nil || len(cc.Choices) == 0 { // a "null" body decodes to nothing, without error
		return Response{}, malformed(providerOpenAI, "the answer has no choices")
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

func (o *OpenAI) stream(ctx context.Context, step int, params openai.ChatCompletionNewParams) (Response, error) {
	var hr *http.Response
	s := o.client.Chat.Completions.NewStreaming(ctx, params, option.WithResponseInto(&hr))
	defer s.Close()
	var (
		acc       openai.ChatCompletionAccumulator
		reasoning = map[string]*strings.Builder{}
		keys      []string
		finished  bool
	)
	for s.Next() {
		chunk := s.Current()
		if !acc.AddChunk(chunk) {
			return Response{}, malformed(providerOpenAI, "a stream chunk could not be aggregated")
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
				b.WriteString(jsonString(json.RawMessage(f.Raw())))
			}
			if ch.FinishReason != "" {
				finished = true
			}
		}
	}
	if err := s.Err(); err != nil {
		return Response{}, openaiError(providerOpenAI, err, hr)
	}
	if !finished || len(acc.Choices) == 0 {
		return Response{}, malformed(providerOpenAI, "the stream ended before the answer was complete")
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
func chatResponse(step int, cc *openai.ChatCompletion, extra map[string]json.RawMessage) Response {
	msg := cc.Choices[0].Message
	out := toolbus.Message{Role: toolbus.RoleAssistant, Content: msg.Content}
	if out.Content == "" && msg.Refusal != "" {
		out.Content = msg.Refusal
	}
	for _, key := range reasoningKeys {
		if r := jsonString(extra[key]); r != "" {
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
	NormalizeCallIDs(step, out.ToolCalls)
	if len(extra) > 0 {
		b, _ := json.Marshal(extra)
		out.Raw = rawParts{OpenAIChat: b}.encode()
	}
	return Response{
		Message: out,
		Usage:   toolbus.Usage{InputTokens: cc.Usage.PromptTokens, OutputTokens: cc.Usage.CompletionTokens},
		Model:   cc.Model,
	}
}

// openaiError classifies an error of the OpenAI SDK (Chat Completions and Responses).
func openaiError(provider string, err error, hr *http.Response) error {
	var ae *openai.Error
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
		return statusError(provider, ae.StatusCode, h, ae.Message, body, err)
	}
	if hr != nil && hr.StatusCode >= 400 {
		return statusError(provider, hr.StatusCode, hr.Header, "", "", err)
	}
	var se *ssestream.StreamError
	if errors.As(err, &se) {
		return &ProviderError{Provider: provider, Message: se.Message, Retryable: true, Err: err}
	}
	return transportError(provider, err, hr != nil)
}
