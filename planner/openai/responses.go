package openai

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"unicode/utf8"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/internal/wire"
)

// ResponsesOptions configures the OpenAI Responses adapter.
type ResponsesOptions struct {
	// APIKey is sent as a bearer token (OPENAI_API_KEY); empty: the SDK reads the env.
	APIKey string
	// BaseURL of the API (OPENAI_BASE_URL); empty: https://api.sdk.com/v1.
	BaseURL string
	// Model is the default model name; a run whose model is "openai-responses:<name>"
	// uses <name>.
	Model string
	// HTTPClient replaces the SDK's HTTP client.
	HTTPClient *http.Client
	// MaxTokens bounds the answer (max_output_tokens); 0 leaves the server's default.
	MaxTokens int64
	// ReasoningEffort ("minimal", "low", "medium", "high") is sent for reasoning models,
	// with a reasoning summary requested; empty sends no reasoning settings.
	ReasoningEffort string
	// Stateless sends store=false and asks for reasoning.encrypted_content, so reasoning
	// items can be sent back without state kept by OpenAI (zero-data-retention
	// organisations need it). toolbus sends the whole history either way.
	Stateless bool
	// Retry is the retry policy; the SDK's own retries are disabled.
	Retry planner.RetryPolicy
	// Logger receives retry warnings (default slog.Default()).
	Logger *slog.Logger
}

// Responses is a planner.Model served by the OpenAI Responses API (POST /responses). It
// sends the whole history as input items every step (no previous_response_id).
//
// Translation: the output items of an answer (reasoning items, messages, function
// calls) are kept in Raw and sent back as they came; without them (a history made by
// another model) the assistant text becomes an assistant message and each tool call a
// function_call item. Each tool result follows as a function_call_output item with the
// call's call_id, in call order.
type Responses struct {
	client sdk.Client
	opts   ResponsesOptions
	log    *slog.Logger
}

var _ planner.Model = (*Responses)(nil)

const providerResponses = "openai-responses"

// NewResponses returns a Responses adapter.
func NewResponses(opts ResponsesOptions) (*Responses, error) {
	client, log, err := newClient(providerResponses, opts.Model, opts.APIKey, opts.BaseURL, opts.HTTPClient, opts.Logger)
	if err != nil {
		return nil, err
	}
	return &Responses{client: client, opts: opts, log: log}, nil
}

// Complete asks the model for the next assistant message.
func (o *Responses) Complete(ctx context.Context, req planner.Request) (planner.Response, error) {
	params, err := o.params(req)
	if err != nil {
		return planner.Response{}, err
	}
	return wire.Complete(ctx, o.opts.Retry, o.log, string(params.Model), func(ctx context.Context) (planner.Response, error) {
		var hr *http.Response
		r, err := o.client.Responses.New(ctx, params, option.WithResponseInto(&hr))
		if err != nil {
			return planner.Response{}, apiError(providerResponses, err, hr)
		}
		if r == nil { // a "null" body decodes to nothing, without error
			return planner.Response{}, wire.Malformed(providerResponses, "the answer is empty")
		}
		return responsesResponse(req.Step, r)
	})
}

func (o *Responses) params(req planner.Request) (responses.ResponseNewParams, error) {
	input, err := responsesInput(req.Messages)
	if err != nil {
		return responses.ResponseNewParams{}, err
	}
	tools, err := responsesTools(req.Tools)
	if err != nil {
		return responses.ResponseNewParams{}, err
	}
	p := responses.ResponseNewParams{
		Model: wire.ModelName(providerResponses, req.Model, o.opts.Model),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input},
		Tools: tools,
	}
	if o.opts.MaxTokens > 0 {
		p.MaxOutputTokens = sdk.Int(o.opts.MaxTokens)
	}
	if o.opts.ReasoningEffort != "" {
		p.Reasoning = shared.ReasoningParam{
			Effort:  shared.ReasoningEffort(o.opts.ReasoningEffort),
			Summary: shared.ReasoningSummaryAuto,
		}
	}
	if o.opts.Stateless {
		p.Store = sdk.Bool(false)
		p.Include = []responses.ResponseIncludable{responses.ResponseIncludableReasoningEncryptedContent}
	}
	return p, nil
}

// responsesInput translates the history to Responses input items.
func responsesInput(history []toolbus.Message) (responses.ResponseInputParam, error) {
	turns, err := wire.GroupHistory(history)
	if err != nil {
		return nil, err
	}
	out := make(responses.ResponseInputParam, 0, len(history))
	for _, t := range turns {
		switch t.Msg.Role {
		case toolbus.RoleSystem:
			out = append(out, responses.ResponseInputItemParamOfMessage(t.Msg.Content, responses.EasyInputMessageRoleSystem))
		case toolbus.RoleUser:
			out = append(out, responses.ResponseInputItemParamOfMessage(t.Msg.Content, responses.EasyInputMessageRoleUser))
		case toolbus.RoleAssistant:
			out = append(out, responsesAssistant(t.Msg)...)
			for _, r := range t.Results {
				item := responses.ResponseInputItemParamOfFunctionCallOutput(r.Content)
				item.OfFunctionCallOutput.CallID = sdk.String(r.ToolCallID)
				if len(r.Attachments) > 0 {
					item.OfFunctionCallOutput.Output = responses.ResponseInputItemFunctionCallOutputOutputUnionParam{
						OfResponseFunctionCallOutputItemArray: responsesOutputItems(r)}
				}
				out = append(out, item)
			}
		}
	}
	return out, nil
}

// responsesImageTypes are the image media types the Responses API accepts.
var responsesImageTypes = map[string]bool{"image/jpeg": true, "image/png": true, "image/gif": true, "image/webp": true}

// responsesOutputItems is the output of a function_call_output whose result has
// attachments: its text as input_text, then each attachment as an input_image (JPEG,
// PNG, GIF, WebP as a data URL), an input_file (a PDF as a data URL, with its file
// name), the text itself for a text file, or an input_text that describes it.
func responsesOutputItems(r toolbus.Message) responses.ResponseFunctionCallOutputItemListParam {
	text := func(s string) responses.ResponseFunctionCallOutputItemUnionParam {
		return responses.ResponseFunctionCallOutputItemUnionParam{OfInputText: &responses.ResponseInputTextContentParam{Text: s}}
	}
	var out responses.ResponseFunctionCallOutputItemListParam
	if r.Content != "" {
		out = append(out, text(r.Content))
	}
	for i, a := range r.Attachments {
		mt := strings.ToLower(a.MediaType)
		if j := strings.IndexByte(mt, ';'); j >= 0 {
			mt = strings.TrimSpace(mt[:j])
		}
		dataURL := "data:" + mt + ";base64," + base64.StdEncoding.EncodeToString(a.Data)
		switch {
		case len(a.Data) == 0:
			out = append(out, text(a.Describe()))
		case responsesImageTypes[mt]:
			out = append(out, responses.ResponseFunctionCallOutputItemUnionParam{OfInputImage: &responses.ResponseInputImageContentParam{
				ImageURL: sdk.String(dataURL), Detail: responses.ResponseInputImageContentDetailAuto}})
		case mt == "application/pdf":
			name := a.Name
			if name == "" {
				name = fmt.Sprintf("attachment-%d.pdf", i+1)
			}
			out = append(out, responses.ResponseFunctionCallOutputItemUnionParam{OfInputFile: &responses.ResponseInputFileContentParam{
				FileData: sdk.String(dataURL), Filename: sdk.String(name)}})
		case a.Kind() == "text" && utf8.Valid(a.Data):
			out = append(out, text(string(a.Data)))
		default:
			out = append(out, text(a.Describe()))
		}
	}
	return out
}

// responsesItem is the part of an output item toolbus reads.
type responsesItem struct {
	Type      string          `json:"type"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	Content   []struct {
		Type    string `json:"type"`
		Text    string `json:"text"`
		Refusal string `json:"refusal"`
	} `json:"content"`
	Summary []struct {
		Text string `json:"text"`
	} `json:"summary"`
}

// responsesAssistant returns the input items of an assistant message: its raw output
// items when it has them (function_call ids set to the calls' ids, which toolbus may
// have normalized), else items rebuilt from the portable fields.
func responsesAssistant(m toolbus.Message) []responses.ResponseInputItemUnionParam {
	var items []json.RawMessage
	if raw := wire.ReadRaw(m.Raw).OpenAIResponses; len(raw) > 0 && json.Unmarshal(raw, &items) == nil {
		var calls []int
		for i, it := range items {
			var ri responsesItem
			if json.Unmarshal(it, &ri) == nil && ri.Type == "function_call" {
				calls = append(calls, i)
			}
		}
		if len(calls) == len(m.ToolCalls) {
			for k, i := range calls {
				var ri responsesItem
				_ = json.Unmarshal(items[i], &ri)
				if ri.CallID != m.ToolCalls[k].CallID {
					items[i] = wire.SetJSONField(items[i], "call_id", m.ToolCalls[k].CallID)
				}
			}
			out := make([]responses.ResponseInputItemUnionParam, 0, len(items))
			for _, it := range items {
				out = append(out, param.Override[responses.ResponseInputItemUnionParam](it))
			}
			return out
		}
	}
	var out []responses.ResponseInputItemUnionParam
	if m.Content != "" {
		out = append(out, responses.ResponseInputItemParamOfMessage(m.Content, responses.EasyInputMessageRoleAssistant))
	}
	for _, c := range m.ToolCalls {
		out = append(out, responses.ResponseInputItemParamOfFunctionCall(c.Arguments, c.CallID, c.Tool))
	}
	return out
}

func responsesTools(cs []toolbus.ToolContract) ([]responses.ToolUnionParam, error) {
	if len(cs) == 0 {
		return nil, nil
	}
	out := make([]responses.ToolUnionParam, 0, len(cs))
	for _, t := range toolbus.OpenAITools(cs) {
		schema, err := wire.SchemaObject(t.Function.Name, t.Function.Parameters)
		if err != nil {
			return nil, err
		}
		// strict=false: the API defaults to strict schemas, which every property of
		// every tool would have to satisfy (all required, no additional properties).
		ft := &responses.FunctionToolParam{Name: t.Function.Name, Parameters: schema, Strict: sdk.Bool(false)}
		if t.Function.Description != "" {
			ft.Description = sdk.String(t.Function.Description)
		}
		out = append(out, responses.ToolUnionParam{OfFunction: ft})
	}
	return out, nil
}

// responsesResponse reads a Responses answer: message text, reasoning summaries and
// function calls, with every output item kept in Raw.
func responsesResponse(step int, r *responses.Response) (planner.Response, error) {
	switch r.Status {
	case responses.ResponseStatusFailed:
		msg := r.Error.Message
		if msg == "" {
			msg = "the response failed"
		}
		return planner.Response{}, &planner.ProviderError{Provider: providerResponses, Message: msg, Retryable: true}
	case responses.ResponseStatusInProgress, responses.ResponseStatusQueued:
		return planner.Response{}, wire.Malformed(providerResponses, "the response is still %s", r.Status)
	}
	rawOutput := json.RawMessage(r.JSON.Output.Raw())
	var items []json.RawMessage
	if err := json.Unmarshal(rawOutput, &items); err != nil {
		return planner.Response{}, wire.Malformed(providerResponses, "the answer has no output items")
	}
	msg := toolbus.Message{Role: toolbus.RoleAssistant}
	var text, reasoning []string
	for _, it := range items {
		var ri responsesItem
		if json.Unmarshal(it, &ri) != nil {
			continue
		}
		switch ri.Type {
		case "message":
			var b strings.Builder
			for _, c := range ri.Content {
				switch c.Type {
				case "output_text":
					b.WriteString(c.Text)
				case "refusal":
					b.WriteString(c.Refusal)
				}
			}
			if b.Len() > 0 {
				text = append(text, b.String())
			}
		case "function_call":
			msg.ToolCalls = append(msg.ToolCalls, toolbus.ToolCall{CallID: ri.CallID, Tool: ri.Name, Arguments: wire.JSONString(ri.Arguments)})
		case "reasoning":
			for _, s := range ri.Summary {
				if s.Text != "" {
					reasoning = append(reasoning, s.Text)
				}
			}
			for _, c := range ri.Content {
				if c.Type == "reasoning_text" && c.Text != "" {
					reasoning = append(reasoning, c.Text)
				}
			}
		}
	}
	msg.Content = strings.Join(text, "\n")
	msg.Reasoning = strings.Join(reasoning, "\n")
	planner.NormalizeCallIDs(step, msg.ToolCalls)
	if len(items) > 0 {
		msg.Raw = wire.RawParts{OpenAIResponses: rawOutput}.Encode()
	}
	return planner.Response{
		Message: msg,
		Usage:   toolbus.Usage{InputTokens: r.Usage.InputTokens, OutputTokens: r.Usage.OutputTokens},
		Model:   r.Model,
	}, nil
}
