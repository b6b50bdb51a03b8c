package anthropic

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"unicode/utf8"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/param"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/internal/wire"
)

// Options configures the Anthropic Messages adapter.
type Options struct {
	// APIKey of the Anthropic API (ANTHROPIC_API_KEY); empty: the SDK's own credential
	// chain (ANTHROPIC_API_KEY, ANTHROPIC_AUTH_TOKEN, profiles).
	APIKey string
	// BaseURL of the API (ANTHROPIC_BASE_URL); empty: https://api.sdk.com.
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
	Retry planner.RetryPolicy
	// Logger receives retry warnings (default slog.Default()).
	Logger *slog.Logger
}

// DefaultMaxTokens is max_tokens when Options.MaxTokens is 0.
const DefaultMaxTokens = 4096

// Messages is a planner.Model served by the Anthropic Messages API (POST /v1/messages).
//
// Translation: system messages become the top-level system prompt; the content blocks
// of an answer (thinking with its signature, redacted_thinking, text, tool_use) are kept
// in Raw and sent back as they came; tool results go first in the next user message as
// tool_result blocks (tool_use_id, is_error for results that did not succeed), one user
// message for all results of a step, followed by any user text. Roles strictly
// alternate.
type Messages struct {
	client sdk.Client
	opts   Options
	log    *slog.Logger
}

var _ planner.Model = (*Messages)(nil)

const providerAnthropic = "anthropic"

// New returns a Messages adapter.
func New(opts Options) (*Messages, error) {
	if opts.Model == "" {
		return nil, errors.New("anthropic: a model name is required")
	}
	if opts.MaxTokens <= 0 {
		opts.MaxTokens = DefaultMaxTokens
	}
	if opts.ThinkingBudget > 0 && opts.ThinkingBudget >= opts.MaxTokens {
		return nil, fmt.Errorf("anthropic: thinking budget %d must be below max tokens %d", opts.ThinkingBudget, opts.MaxTokens)
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
	return &Messages{client: sdk.NewClient(copts...), opts: opts, log: log}, nil
}

// Complete asks the model for the next assistant message.
func (a *Messages) Complete(ctx context.Context, req planner.Request) (planner.Response, error) {
	params, err := a.params(req)
	if err != nil {
		return planner.Response{}, err
	}
	return wire.Complete(ctx, a.opts.Retry, a.log, string(params.Model), func(ctx context.Context) (planner.Response, error) {
		var (
			hr  *http.Response
			msg *sdk.Message
			err error
		)
		if a.opts.Stream {
			msg, err = a.stream(ctx, params, &hr)
		} else {
			msg, err = a.client.Messages.New(ctx, params, option.WithResponseInto(&hr))
		}
		if err != nil {
			return planner.Response{}, apiError(err, hr)
		}
		if msg == nil { // a "null" body decodes to nothing, without error
			return planner.Response{}, wire.Malformed(providerAnthropic, "the answer is empty")
		}
		return anthropicResponse(req.Step, msg), nil
	})
}

func (a *Messages) stream(ctx context.Context, params sdk.MessageNewParams, hr **http.Response) (*sdk.Message, error) {
	s := a.client.Messages.NewStreaming(ctx, params, option.WithResponseInto(hr))
	defer s.Close()
	var msg sdk.Message
	stopped := false
	for s.Next() {
		ev := s.Current()
		if err := msg.Accumulate(ev); err != nil {
			return nil, wire.Malformed(providerAnthropic, "stream: %v", err)
		}
		if ev.Type == "message_stop" {
			stopped = true
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if !stopped {
		return nil, wire.Malformed(providerAnthropic, "the stream ended before message_stop")
	}
	return &msg, nil
}

func (a *Messages) params(req planner.Request) (sdk.MessageNewParams, error) {
	system, msgs, err := anthropicMessages(req.Messages)
	if err != nil {
		return sdk.MessageNewParams{}, err
	}
	tools, err := anthropicTools(req.Tools)
	if err != nil {
		return sdk.MessageNewParams{}, err
	}
	p := sdk.MessageNewParams{
		Model:     wire.ModelName(providerAnthropic, req.Model, a.opts.Model),
		MaxTokens: a.opts.MaxTokens,
		System:    system,
		Messages:  msgs,
		Tools:     tools,
	}
	if a.opts.ThinkingBudget > 0 {
		p.Thinking = sdk.ThinkingConfigParamUnion{OfEnabled: &sdk.ThinkingConfigEnabledParam{BudgetTokens: a.opts.ThinkingBudget}}
	}
	return p, nil
}

// anthropicMessages translates the history to a system prompt and strictly
// alternating user and assistant messages.
func anthropicMessages(history []toolbus.Message) ([]sdk.TextBlockParam, []sdk.MessageParam, error) {
	turns, err := wire.GroupHistory(history)
	if err != nil {
		return nil, nil, err
	}
	var (
		system []sdk.TextBlockParam
		out    []sdk.MessageParam
		role   toolbus.Role
		blocks []sdk.ContentBlockParamUnion
	)
	flush := func() {
		if len(blocks) == 0 {
			return
		}
		if role == toolbus.RoleUser {
			out = append(out, sdk.MessageParam{OfUser: &sdk.UserMessageParam{Content: blocks}})
		} else {
			out = append(out, sdk.MessageParam{OfAssistant: &sdk.AssistantMessageParam{Content: blocks}})
		}
		blocks = nil
	}
	add := func(r toolbus.Role, bs ...sdk.ContentBlockParamUnion) {
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
		switch t.Msg.Role {
		case toolbus.RoleSystem:
			if t.Msg.Content != "" {
				system = append(system, sdk.TextBlockParam{Text: t.Msg.Content})
			}
		case toolbus.RoleUser:
			if t.Msg.Content != "" {
				add(toolbus.RoleUser, sdk.NewTextBlock(t.Msg.Content))
			}
		case toolbus.RoleAssistant:
			add(toolbus.RoleAssistant, anthropicAssistant(t.Msg)...)
			// The results open the next user message: tool_result blocks come first.
			results := make([]sdk.ContentBlockParamUnion, 0, len(t.Results))
			for _, r := range t.Results {
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

func anthropicToolResult(r toolbus.Message) sdk.ContentBlockParamUnion {
	tr := &sdk.ToolResultBlockParam{ToolUseID: r.ToolCallID}
	content := r.Content
	if r.IsError {
		tr.IsError = sdk.Bool(true)
		if content == "" {
			content = "(the tool call did not succeed and returned no details)"
		}
	}
	if content != "" {
		tr.Content = []sdk.ToolResultBlockParamContentUnion{{OfText: &sdk.TextBlockParam{Text: content}}}
	}
	for _, a := range r.Attachments {
		tr.Content = append(tr.Content, anthropicAttachment(a))
	}
	return sdk.ContentBlockParamUnion{OfToolResult: tr}
}

// anthropicImageTypes are the image media types the Messages API accepts.
var anthropicImageTypes = map[string]bool{"image/jpeg": true, "image/png": true, "image/gif": true, "image/webp": true}

// anthropicAttachment is a tool result's attachment as the Messages API takes it in a
// tool_result: an image block (JPEG, PNG, GIF, WebP), a document block (a PDF, base64;
// a text file, as plain text), or else a text block that describes it.
func anthropicAttachment(a toolbus.Attachment) sdk.ToolResultBlockParamContentUnion {
	mt := strings.ToLower(a.MediaType)
	if i := strings.IndexByte(mt, ';'); i >= 0 {
		mt = strings.TrimSpace(mt[:i])
	}
	switch {
	case len(a.Data) == 0:
	case anthropicImageTypes[mt]:
		return sdk.ToolResultBlockParamContentUnion{OfImage: &sdk.ImageBlockParam{Source: sdk.ImageBlockParamSourceUnion{
			OfBase64: &sdk.Base64ImageSourceParam{Data: base64.StdEncoding.EncodeToString(a.Data), MediaType: sdk.Base64ImageSourceMediaType(mt)}}}}
	case mt == "application/pdf":
		d := &sdk.DocumentBlockParam{Source: sdk.DocumentBlockParamSourceUnion{OfBase64: &sdk.Base64PDFSourceParam{Data: base64.StdEncoding.EncodeToString(a.Data)}}}
		if a.Name != "" {
			d.Title = sdk.String(a.Name)
		}
		return sdk.ToolResultBlockParamContentUnion{OfDocument: d}
	case a.Kind() == "text" && utf8.Valid(a.Data):
		d := &sdk.DocumentBlockParam{Source: sdk.DocumentBlockParamSourceUnion{OfText: &sdk.PlainTextSourceParam{Data: string(a.Data)}}}
		if a.Name != "" {
			d.Title = sdk.String(a.Name)
		}
		return sdk.ToolResultBlockParamContentUnion{OfDocument: d}
	}
	return sdk.ToolResultBlockParamContentUnion{OfText: &sdk.TextBlockParam{Text: a.Describe()}}
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
func anthropicAssistant(m toolbus.Message) []sdk.ContentBlockParamUnion {
	var raws []json.RawMessage
	if raw := wire.ReadRaw(m.Raw).Anthropic; len(raw) > 0 && json.Unmarshal(raw, &raws) == nil {
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
					raws[i] = wire.SetJSONField(raws[i], "id", m.ToolCalls[k].CallID)
				}
				if in := bytes.TrimSpace(ab.Input); len(in) == 0 || in[0] != '{' {
					// A compatible server sent no object input; the API requires one.
					raws[i] = wire.SetJSONField(raws[i], "input", wire.ObjectArguments(m.ToolCalls[k].Arguments))
				}
			}
			out := make([]sdk.ContentBlockParamUnion, 0, len(raws))
			for _, b := range raws {
				out = append(out, param.Override[sdk.ContentBlockParamUnion](b))
			}
			return out
		}
	}
	var out []sdk.ContentBlockParamUnion
	if m.Reasoning != "" && m.ReasoningSignature != "" {
		out = append(out, sdk.ContentBlockParamUnion{OfThinking: &sdk.ThinkingBlockParam{
			Thinking: m.Reasoning, Signature: m.ReasoningSignature}})
	}
	if m.Content != "" {
		out = append(out, sdk.NewTextBlock(m.Content))
	}
	for _, c := range m.ToolCalls {
		out = append(out, sdk.ContentBlockParamUnion{OfToolUse: &sdk.ToolUseBlockParam{
			ID: c.CallID, Name: c.Tool, Input: wire.ObjectArguments(c.Arguments)}})
	}
	return out
}

func anthropicTools(cs []toolbus.ToolContract) ([]sdk.ToolUnionParam, error) {
	if len(cs) == 0 {
		return nil, nil
	}
	out := make([]sdk.ToolUnionParam, 0, len(cs))
	for _, t := range toolbus.AnthropicTools(cs) {
		if _, err := wire.SchemaObject(t.Name, t.InputSchema); err != nil {
			return nil, err
		}
		tp := &sdk.ToolParam{
			Name: t.Name,
			// The schema goes byte for byte as the executor published it.
			InputSchema: param.Override[sdk.ToolInputSchemaParam](t.InputSchema),
		}
		if t.Description != "" {
			tp.Description = sdk.String(t.Description)
		}
		out = append(out, sdk.ToolUnionParam{OfTool: tp})
	}
	return out, nil
}

// anthropicResponse reads a Messages answer; every content block is kept in Raw.
func anthropicResponse(step int, m *sdk.Message) planner.Response {
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
			out.ToolCalls = append(out.ToolCalls, toolbus.ToolCall{CallID: b.ID, Tool: b.Name, Arguments: wire.CompactJSON(args)})
		}
		raw := json.RawMessage(b.RawJSON())
		if !json.Valid(raw) {
			raw, _ = json.Marshal(b.ToParam())
		}
		raws = append(raws, raw)
	}
	out.Content = strings.Join(text, "\n")
	out.Reasoning = strings.Join(thinking, "\n")
	planner.NormalizeCallIDs(step, out.ToolCalls)
	if len(raws) > 0 {
		if b, err := json.Marshal(raws); err == nil {
			out.Raw = wire.RawParts{Anthropic: b}.Encode()
		}
	}
	u := m.Usage
	return planner.Response{
		Message: out,
		// Input tokens are input_tokens plus the cache writes and reads: all of them
		// were read by the model and count for the run's token budget.
		Usage: toolbus.Usage{InputTokens: u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens, OutputTokens: u.OutputTokens},
		Model: m.Model,
	}
}

// apiError classifies an error of the Anthropic SDK.
func apiError(err error, hr *http.Response) error {
	var ae *sdk.Error
	if errors.As(err, &ae) {
		var h http.Header
		if ae.Response != nil {
			h = ae.Response.Header
		}
		pe := wire.StatusError(providerAnthropic, ae.StatusCode, h, ae.Message, ae.RawJSON(), err)
		if ae.StatusCode < 400 {
			// An error event in the middle of a stream (overloaded_error, api_error):
			// the request was accepted, so another attempt may succeed.
			pe.Status, pe.Retryable = 0, true
		}
		return pe
	}
	if hr != nil && hr.StatusCode >= 400 {
		return wire.StatusError(providerAnthropic, hr.StatusCode, hr.Header, "", "", err)
	}
	return wire.TransportError(providerAnthropic, err, hr != nil)
}
