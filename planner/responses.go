package planner

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/toolbus/toolbus"
)

// OpenAIResponsesOptions configures the OpenAI Responses adapter.
type OpenAIResponsesOptions struct {
	// APIKey is sent as a bearer token (OPENAI_API_KEY); empty: the SDK reads the env.
	APIKey string
	// BaseURL of the API (OPENAI_BASE_URL); empty: https://api.openai.com/v1.
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
	Retry RetryPolicy
	// Logger receives retry warnings (default slog.Default()).
	Logger *slog.Logger
}

// OpenAIResponses is a Model served by the OpenAI Responses API (POST /responses). It
// sends the whole history as input items every step (no previous_response_id).
//
// Translation: the output items of an answer (reasoning items, messages, function
// calls) are kept in Raw and sent back as they came; without them (a history made by
// another model) the assistant text becomes an assistant message and each tool call a
// function_call item. Each tool result follows as a function_call_output item with the
// call's call_id, in call order.
type OpenAIResponses struct {
	client openai.Client
	opts   OpenAIResponsesOptions
	log    *slog.Logger
}

var _ Model = (*OpenAIResponses)(nil)

const providerResponses = "openai-responses"

// NewOpenAIResponses returns a Responses adapter.
func NewOpenAIResponses(opts OpenAIResponsesOptions) (*OpenAIResponses, error) {
	client, log, err := newOpenAIClient(providerResponses, opts.Model, opts.APIKey, opts.BaseURL, opts.HTTPClient, opts.Logger)
	if err != nil {
		return nil, err
	}
	return &OpenAIResponses{client: client, opts: opts, log: log}, nil
}

// Complete asks the model for the next assistant message.
func (o *OpenAIResponses) Complete(ctx context.Context, req Request) (Response, error) {
	params, err := o.params(req)
	if err != nil {
		return Response{}, err
	}
	var resp Response
	err = o.opts.Retry.do(ctx, o.log, func(ctx context.Context) error {
		var hr *http.Response
		r, err := o.client.Responses.New(ctx, params, option.WithResponseInto(&hr))
		if err != nil {
			return openaiError(providerResponses, err, hr)
		}
		if r == nil { // a "null" body decodes to nothing, without error
			return malformed(providerResponses, "the answer is empty")
		}
		resp, err = responsesResponse(req.Step, r)
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

func (o *OpenAIResponses) params(req Request) (responses.ResponseNewParams, error) {
	input, err := responsesInput(req.Messages)
	if err != nil {
		return responses.ResponseNewParams{}, err
	}
	tools, err := responsesTools(req.Tools)
	if err != nil {
		return responses.ResponseNewParams{}, err
	}
	p := responses.ResponseNewParams{
		Model: modelName(providerResponses, req.Model, o.opts.Model),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input},
		Tools: tools,
	}
	if o.opts.MaxTokens > 0 {
		p.MaxOutputTokens = openai.Int(o.opts.MaxTokens)
	}
	if o.opts.ReasoningEffort != "" {
		p.Reasoning = shared.ReasoningParam{
			Effort:  shared.ReasoningEffort(o.opts.ReasoningEffort),
			Summary: shared.ReasoningSummaryAuto,
		}
	}
	if o.opts.Stateless {
		p.Store = openai.Bool(false)
		p.Include = []responses.ResponseIncludable{responses.ResponseIncludableReasoningEncryptedContent}
	}
	return p, nil
}

// responsesInput translates the history to Responses input items.
func responsesInput(history []toolbus.Message) (responses.ResponseInputParam, error) {
	turns, err := groupHistory(history)
	if err != nil {
		return nil, err
	}
	out := make(responses.ResponseInputParam, 0, len(history))
	for _, t := range turns {
		switch t.msg.Role {
		case toolbus.RoleSystem:
			out = append(out, responses.ResponseInputItemParamOfMessage(t.msg.Content, responses.EasyInputMessageRoleSystem))
		case toolbus.RoleUser:
			out = append(out, responses.ResponseInputItemParamOfMessage(t.msg.Content, responses.EasyInputMessageRoleUser))
		case toolbus.RoleAssistant:
			out = append(out, responsesAssistant(t.msg)...)
			for _, r := range t.results {
				item := responses.ResponseInputItemParamOfFunctionCallOutput(r.Content)
				item.OfFunctionCallOutput.CallID = openai.String(r.ToolCallID)
				out = append(out, item)
			}
		}
	}
	return out, nil
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
	if raw := readRaw(m.Raw).OpenAIResponses; len(raw) > 0 && json.Unmarshal(raw, &items) == nil {
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
					items[i] = setJSONField(items[i], "call_id", m.ToolCalls[k].CallID)
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
		schema, err := schemaObject(t.Function.Name, t.Function.Parameters)
		if err != nil {
			return nil, err
		}
		// strict=false: the API defaults to strict schemas, which every property of
		// every tool would have to satisfy (all required, no additional properties).
		ft := &responses.FunctionToolParam{Name: t.Function.Name, Parameters: schema, Strict: openai.Bool(false)}
		if t.Function.Description != "" {
			ft.Description = openai.String(t.Function.Description)
		}
		out = append(out, responses.ToolUnionParam{OfFunction: ft})
	}
	return out, nil
}

// responsesResponse reads a Responses answer: message text, reasoning summaries and
// function calls, with every output item kept in Raw.
func responsesResponse(step int, r *responses.Response) (Response, error) {
	switch r.Status {
	case responses.ResponseStatusFailed:
		msg := r.Error.Message
		if msg == "" {
			msg = "the response failed"
		}
		return Response{}, &ProviderError{Provider: providerResponses, Message: msg, Retryable: true}
	case responses.ResponseStatusInProgress, responses.ResponseStatusQueued:
		return Response{}, malformed(providerResponses, "the response is still %s", r.Status)
	}
	rawOutput := json.RawMessage(r.JSON.Output.Raw())
	var items []json.RawMessage
	if err := json.Unmarshal(rawOutput, &items); err != nil {
		return Response{}, malformed(providerResponses, "the answer has no output items")
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
			msg.ToolCalls = append(msg.ToolCalls, toolbus.ToolCall{CallID: ri.CallID, Tool: ri.Name, Arguments: jsonString(ri.Arguments)})
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
	NormalizeCallIDs(step, msg.ToolCalls)
	if len(items) > 0 {
		msg.Raw = rawParts{OpenAIResponses: rawOutput}.encode()
	}
	return Response{
		Message: msg,
		Usage:   toolbus.Usage{InputTokens: r.Usage.InputTokens, OutputTokens: r.Usage.OutputTokens},
		Model:   r.Model,
	}, nil
}
