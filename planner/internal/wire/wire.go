// Package wire holds what the provider adapters (planner/openai, planner/anthropic) share:
// the classification of provider errors, the history grouping that enforces the
// tool-message rules, the Message.Raw envelope, the retried request (Complete) and a few
// JSON helpers. It links no SDK.
package wire

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
)

// retryableStatus reports whether an HTTP status is worth another attempt: rate limits,
// request timeouts and server errors (including Anthropic's 529 overloaded).
func retryableStatus(code int) bool {
	return code == http.StatusTooManyRequests || code == http.StatusRequestTimeout || code >= 500
}

// StatusError classifies an HTTP error answer. msg is the provider's message; body is
// the raw error body, used when msg is empty.
func StatusError(provider string, code int, header http.Header, msg, body string, err error) *planner.ProviderError {
	if msg == "" {
		msg = strings.TrimSpace(body)
		if len(msg) > 512 {
			msg = msg[:512] + "..."
		}
	}
	pe := &planner.ProviderError{Provider: provider, Status: code, Message: msg, Retryable: retryableStatus(code), Err: err}
	if header != nil {
		if d, ok := RetryAfter(header, Now()); ok {
			pe.RetryAfter = d
		}
		if header.Get("x-should-retry") == "true" { // OpenAI and Anthropic mark retryable answers (e.g. a 409 lock timeout)
			pe.Retryable = true
		}
	}
	return pe
}

// TransportError classifies an error that came with no HTTP error status: a network
// failure or timeout (retryable), the caller's context ending (returned as is by the
// retry loop), an answer the SDK could not decode (answered: retryable, a proxy or a
// provider hiccup; the attempts are bounded), or a failure before anything was sent,
// such as missing credentials (not retryable: every attempt would fail the same way).
func TransportError(provider string, err error, answered bool) error {
	if err == nil {
		return nil
	}
	var pe *planner.ProviderError
	if errors.As(err, &pe) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// Whether this is the caller's deadline or the attempt's own is decided by the
		// retry loop, which knows both contexts.
		return &planner.ProviderError{Provider: provider, Message: "request timed out or was cancelled", Retryable: true, Err: err}
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return &planner.ProviderError{Provider: provider, Message: "transport: " + err.Error(), Retryable: true, Err: err}
	}
	if !answered {
		return &planner.ProviderError{Provider: provider, Message: "request not sent: " + err.Error(), Err: err}
	}
	return &planner.ProviderError{Provider: provider, Message: "unreadable answer: " + err.Error(), Retryable: true, Err: err}
}

// Malformed is a retryable error for a successful HTTP answer toolbus cannot use.
func Malformed(provider, format string, args ...any) error {
	return &planner.ProviderError{Provider: provider, Message: fmt.Sprintf(format, args...), Retryable: true}
}

// historyError is a history that no provider would accept (an orphan or missing tool
// result, an unknown role). It fails the run: retrying sends the same history.
func historyError(format string, args ...any) error {
	return planner.Permanent(fmt.Errorf("history: "+format, args...))
}

// Turn is one entry of the history as the providers see it: a system, user or assistant
// message; an assistant message with tool calls carries the tool messages that answer
// them, one per call, in call order.
type Turn struct {
	Msg     toolbus.Message
	Results []toolbus.Message
}

// GroupHistory checks the tool-message rules every provider enforces and attaches each
// tool message to the assistant message whose call it answers:
//   - a tool message must answer a call of the closest preceding assistant message
//     (no orphan tool_call_id), at most once;
//   - every call of an assistant message must be answered before the next non-tool
//     message (no missing result);
//   - results are put in call order, whatever order they were recorded in.
//
// Unanswered calls are refused even at the end of the history: the planner asks for
// the next step only once every call of the step has its result.
func GroupHistory(msgs []toolbus.Message) ([]Turn, error) {
	out := make([]Turn, 0, len(msgs))
	for i := 0; i < len(msgs); i++ {
		m := msgs[i]
		switch m.Role {
		case toolbus.RoleSystem, toolbus.RoleUser:
			out = append(out, Turn{Msg: m})
		case toolbus.RoleAssistant:
			t := Turn{Msg: m}
			j := i + 1
			for j < len(msgs) && msgs[j].Role == toolbus.RoleTool {
				j++
			}
			tools := msgs[i+1 : j]
			if len(m.ToolCalls) > 0 || len(tools) > 0 {
				res, err := matchResults(i, m.ToolCalls, tools)
				if err != nil {
					return nil, err
				}
				t.Results = res
			}
			out = append(out, t)
			i = j - 1
		case toolbus.RoleTool:
			return nil, historyError("message %d: tool message for call %q follows no assistant message with that call", i, m.ToolCallID)
		default:
			return nil, historyError("message %d: unknown role %q", i, m.Role)
		}
	}
	return out, nil
}

func matchResults(at int, calls []toolbus.ToolCall, tools []toolbus.Message) ([]toolbus.Message, error) {
	byID := make(map[string]int, len(calls))
	for k, c := range calls {
		if c.CallID == "" {
			return nil, historyError("message %d: tool call %d (%s) has no call id", at, k, c.Tool)
		}
		if _, dup := byID[c.CallID]; dup {
			return nil, historyError("message %d: duplicate call id %q", at, c.CallID)
		}
		byID[c.CallID] = k
	}
	res := make([]toolbus.Message, len(calls))
	seen := make([]bool, len(calls))
	for n, tm := range tools {
		k, ok := byID[tm.ToolCallID]
		if !ok {
			return nil, historyError("message %d: tool message answers call %q, which the assistant message %d did not make", at+1+n, tm.ToolCallID, at)
		}
		if seen[k] {
			return nil, historyError("message %d: call %q is answered twice", at+1+n, tm.ToolCallID)
		}
		seen[k] = true
		res[k] = tm
	}
	for k, ok := range seen {
		if !ok {
			return nil, historyError("message %d: call %q (%s) has no tool result", at, calls[k].CallID, calls[k].Tool)
		}
	}
	return res, nil
}

// RawParts is the envelope toolbus keeps in events.Message.Raw: what a provider sent
// that must go back to it unchanged, keyed by adapter so a history that crossed
// providers never sends one provider's blocks to another. An adapter that finds no part
// of its own rebuilds the message from the portable fields.
type RawParts struct {
	// OpenAIChat holds the non-standard fields of a Chat Completions assistant message
	// (reasoning_content, reasoning, reasoning_details... from OpenAI-compatible servers).
	OpenAIChat json.RawMessage `json:"openai_chat,omitempty"`
	// OpenAIResponses holds the output items of a Responses answer (reasoning items with
	// their encrypted content, messages, function calls), as they came.
	OpenAIResponses json.RawMessage `json:"openai_responses,omitempty"`
	// Anthropic holds the content blocks of a Messages answer (thinking with signature,
	// redacted_thinking, text, tool_use), as they came.
	Anthropic json.RawMessage `json:"anthropic,omitempty"`
}

func ReadRaw(raw json.RawMessage) RawParts {
	var p RawParts
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &p) // a Raw that is not ours is ignored: rebuild from fields
	}
	return p
}

func (p RawParts) Encode() json.RawMessage {
	if len(p.OpenAIChat) == 0 && len(p.OpenAIResponses) == 0 && len(p.Anthropic) == 0 {
		return nil
	}
	b, _ := json.Marshal(p)
	return b
}

// ModelName is the provider model for a request: the run's model when it names this
// adapter ("<kind>:<name>", as TOOLBUS_MODEL does), else the adapter's default.
func ModelName(kind, runModel, def string) string {
	if k, name, ok := strings.Cut(runModel, ":"); ok && k == kind && name != "" {
		return name
	}
	return def
}

// SchemaObject returns a tool's JSON schema as a map whose values are raw JSON, so the
// schema goes to the provider byte for byte (numbers are never rounded through float64).
func SchemaObject(tool string, schema json.RawMessage) (map[string]any, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(schema, &fields); err != nil || fields == nil {
		return nil, planner.Permanent(fmt.Errorf("tool %s: input schema is not a JSON object", tool))
	}
	out := make(map[string]any, len(fields))
	for k, v := range fields {
		out[k] = v
	}
	return out, nil
}

// ObjectArguments returns args when it is a JSON object, else an object that carries
// the raw text: Anthropic's tool_use input must be an object, and a call whose
// arguments were Malformed (made by another provider's model) is still sent back.
func ObjectArguments(args string) json.RawMessage {
	trimmed := bytes.TrimSpace([]byte(args))
	if len(trimmed) > 0 && trimmed[0] == '{' && json.Valid(trimmed) {
		return json.RawMessage(trimmed)
	}
	if len(trimmed) == 0 {
		return json.RawMessage(`{}`)
	}
	b, _ := json.Marshal(map[string]string{"invalid_arguments": args})
	return b
}

// CompactJSON returns b compacted, or b unchanged when it is not valid JSON.
func CompactJSON(b []byte) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return string(b)
	}
	return buf.String()
}

// SetJSONField returns the JSON object obj with key set to the JSON value v; obj is
// returned unchanged when it is not an object.
func SetJSONField(obj json.RawMessage, key string, v any) json.RawMessage {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(obj, &m); err != nil || m == nil {
		return obj
	}
	b, err := json.Marshal(v)
	if err != nil {
		return obj
	}
	m[key] = b
	out, err := json.Marshal(m)
	if err != nil {
		return obj
	}
	return out
}

// JSONString reads a raw JSON value as a string: a JSON string is unquoted, any other
// value (an object some servers send for arguments) is kept as its JSON text, null and
// absence give "".
func JSONString(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	}
	return string(raw)
}
