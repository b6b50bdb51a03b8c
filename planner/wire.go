package planner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/toolbus/toolbus"
)

// This file holds what the provider adapters (openai.go, responses.go, anthropic.go) share:
// the provider error type, the history grouping that enforces the tool-message rules, the
// Message.Raw envelope and a few JSON helpers.

// ProviderError is a failed call to a model provider: an HTTP error status, a transport
// failure or an answer that could not be read. Retryable errors (429, 408, 5xx, transport
// errors and timeouts, unreadable answers) are retried by the adapter's RetryPolicy and,
// when the attempts run out, returned as a transient error so the planner retries the step
// later. Other errors reach the planner wrapped by Permanent and fail the run with the
// provider's message.
type ProviderError struct {
	// Provider names the adapter: "openai", "openai-responses" or "anthropic".
	Provider string
	// Status is the HTTP status, 0 when no response arrived.
	Status int
	// Message is the provider's own explanation (its error.message), or a description of
	// the failure.
	Message string
	// RetryAfter is the wait the provider asked for (Retry-After, Retry-After-Ms), if any.
	RetryAfter time.Duration
	// Retryable reports whether another attempt may succeed.
	Retryable bool
	// Err is the underlying error (the SDK's error, a net.Error, a context error).
	Err error
}

func (e *ProviderError) Error() string {
	// No "planner:" prefix: the planner wraps a model error once, with the run and step.
	var b strings.Builder
	b.WriteString(e.Provider)
	if e.Status != 0 {
		fmt.Fprintf(&b, ": %d %s", e.Status, http.StatusText(e.Status))
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	} else if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *ProviderError) Unwrap() error { return e.Err }

// retryableStatus reports whether an HTTP status is worth another attempt: rate limits,
// request timeouts and server errors (including Anthropic's 529 overloaded).
func retryableStatus(code int) bool {
	return code == http.StatusTooManyRequests || code == http.StatusRequestTimeout || code >= 500
}

// statusError classifies an HTTP error answer. msg is the provider's message; body is
// the raw error body, used when msg is empty.
func statusError(provider string, code int, header http.Header, msg, body string, err error) *ProviderError {
	if msg == "" {
		msg = strings.TrimSpace(body)
		if len(msg) > 512 {
			msg = msg[:512] + "..."
		}
	}
	pe := &ProviderError{Provider: provider, Status: code, Message: msg, Retryable: retryableStatus(code), Err: err}
	if header != nil {
		if d, ok := retryAfter(header, timeNow()); ok {
			pe.RetryAfter = d
		}
		if header.Get("x-should-retry") == "true" { // OpenAI and Anthropic mark retryable answers (e.g. a 409 lock timeout)
			pe.Retryable = true
		}
	}
	return pe
}

// transportError classifies an error that came with no HTTP error status: a network
// failure or timeout (retryable), the caller's context ending (returned as is by the
// retry loop), an answer the SDK could not decode (answered: retryable, a proxy or a
// provider hiccup; the attempts are bounded), or a failure before anything was sent,
// such as missing credentials (not retryable: every attempt would fail the same way).
func transportError(provider string, err error, answered bool) error {
	if err == nil {
		return nil
	}
	var pe *ProviderError
	if errors.As(err, &pe) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// Whether this is the caller's deadline or the attempt's own is decided by the
		// retry loop, which knows both contexts.
		return &ProviderError{Provider: provider, Message: "request timed out or was cancelled", Retryable: true, Err: err}
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return &ProviderError{Provider: provider, Message: "transport: " + err.Error(), Retryable: true, Err: err}
	}
	if !answered {
		return &ProviderError{Provider: provider, Message: "request not sent: " + err.Error(), Err: err}
	}
	return &ProviderError{Provider: provider, Message: "unreadable answer: " + err.Error(), Retryable: true, Err: err}
}

// malformed is a retryable error for a successful HTTP answer toolbus cannot use.
func malformed(provider, format string, args ...any) error {
	return &ProviderError{Provider: provider, Message: fmt.Sprintf(format, args...), Retryable: true}
}

// historyError is a history that no provider would accept (an orphan or missing tool
// result, an unknown role). It fails the run: retrying sends the same history.
func historyError(format string, args ...any) error {
	return Permanent(fmt.Errorf("history: "+format, args...))
}

// turn is one entry of the history as the providers see it: a system, user or assistant
// message; an assistant message with tool calls carries the tool messages that answer
// them, one per call, in call order.
type turn struct {
	msg     toolbus.Message
	results []toolbus.Message
}

// groupHistory checks the tool-message rules every provider enforces and attaches each
// tool message to the assistant message whose call it answers:
//   - a tool message must answer a call of the closest preceding assistant message
//     (no orphan tool_call_id), at most once;
//   - every call of an assistant message must be answered before the next non-tool
//     message (no missing result);
//   - results are put in call order, whatever order they were recorded in.
//
// Unanswered calls are refused even at the end of the history: the planner asks for
// the next step only once every call of the step has its result.
func groupHistory(msgs []toolbus.Message) ([]turn, error) {
	out := make([]turn, 0, len(msgs))
	for i := 0; i < len(msgs); i++ {
		m := msgs[i]
		switch m.Role {
		case toolbus.RoleSystem, toolbus.RoleUser:
			out = append(out, turn{msg: m})
		case toolbus.RoleAssistant:
			t := turn{msg: m}
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
				t.results = res
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

// rawParts is the envelope toolbus keeps in events.Message.Raw: what a provider sent
// that must go back to it unchanged, keyed by adapter so a history that crossed
// providers never sends one provider's blocks to another. An adapter that finds no part
// of its own rebuilds the message from the portable fields.
type rawParts struct {
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

func readRaw(raw json.RawMessage) rawParts {
	var p rawParts
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &p) // a Raw that is not ours is ignored: rebuild from fields
	}
	return p
}

func (p rawParts) encode() json.RawMessage {
	if len(p.OpenAIChat) == 0 && len(p.OpenAIResponses) == 0 && len(p.Anthropic) == 0 {
		return nil
	}
	b, _ := json.Marshal(p)
	return b
}

// modelName is the provider model for a request: the run's model when it names this
// adapter ("<kind>:<name>", as TOOLBUS_MODEL does), else the adapter's default.
func modelName(kind, runModel, def string) string {
	if k, name, ok := strings.Cut(runModel, ":"); ok && k == kind && name != "" {
		return name
	}
	return def
}

// schemaObject returns a tool's JSON schema as a map whose values are raw JSON, so the
// schema goes to the provider byte for byte (numbers are never rounded through float64).
func schemaObject(tool string, schema json.RawMessage) (map[string]any, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(schema, &fields); err != nil || fields == nil {
		return nil, Permanent(fmt.Errorf("tool %s: input schema is not a JSON object", tool))
	}
	out := make(map[string]any, len(fields))
	for k, v := range fields {
		out[k] = v
	}
	return out, nil
}

// objectArguments returns args when it is a JSON object, else an object that carries
// the raw text: Anthropic's tool_use input must be an object, and a call whose
// arguments were malformed (made by another provider's model) is still sent back.
func objectArguments(args string) json.RawMessage {
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

// compactJSON returns b compacted, or b unchanged when it is not valid JSON.
func compactJSON(b []byte) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return string(b)
	}
	return buf.String()
}

// setJSONField returns the JSON object obj with key set to the JSON value v; obj is
// returned unchanged when it is not an object.
func setJSONField(obj json.RawMessage, key string, v any) json.RawMessage {
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

// jsonString reads a raw JSON value as a string: a JSON string is unquoted, any other
// value (an object some servers send for arguments) is kept as its JSON text, null and
// absence give "".
func jsonString(raw json.RawMessage) string {
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
