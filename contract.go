package toolbus

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ToolContract is what an executor publishes about a tool it serves (the value of a key in
// the toolbus_tools KV bucket): what the model sees plus runtime metadata.
type ToolContract struct {
	Name         string          `json:"name"`
	Description  string          `json:"description"`
	InputSchema  json.RawMessage `json:"input_schema"`
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	// ReadOnly is false for tools with side effects; those get an idempotency key.
	ReadOnly      bool          `json:"read_only"`
	NeedsApproval bool          `json:"needs_approval,omitempty"`
	Timeout       time.Duration `json:"timeout,omitempty"`
	// HeartbeatTimeout marks a long-running tool: a call that reports no progress
	// (tool.progress) for this long is timed out; Timeout is then its longest run.
	HeartbeatTimeout time.Duration `json:"heartbeat_timeout,omitempty"`
	// TaskRequired: a call must be answered as a task (MCP taskSupport "required"); the
	// MCP door refuses it to a host that does not take tasks.
	TaskRequired   bool     `json:"task_required,omitempty"`
	MaxOutputBytes int      `json:"max_output_bytes,omitempty"`
	MaxConcurrency int      `json:"max_concurrency,omitempty"`
	RedactFields   []string `json:"redact_fields,omitempty"`
	// Owner is the team whose executors serve the tool (the catalog records it; with
	// per-team credentials only that team may write the entry).
	Owner string `json:"owner,omitempty"`
	// Version numbers the contract: an executor may replace a registered contract that
	// differs from its own only with a higher version (or on purpose, with
	// TOOLBUS_EXECUTOR_REPLACE_CONTRACTS).
	Version int `json:"version,omitempty"`
	// Retry is the tool's retry policy: a failure it names is retried by the fleet with
	// backoff, within the run's deadline, and only the final result goes to the model.
	// Nil: no retries.
	Retry *RetryPolicy `json:"retry,omitempty"`
}

// RetryPolicy is a tool's retry policy. The runtime, not the model, retries a failed call
// whose error code it names: attempt n+1 starts after a backoff of InitialBackoff·2^(n-1)
// (at most MaxBackoff) with jitter (half to all of it), with the same idempotency key, up
// to MaxAttempts attempts in all and never past the run's deadline. Each failed attempt is
// recorded in the final result (ToolResult.Retries).
type RetryPolicy struct {
	// MaxAttempts counts every attempt, the first included: 2 to MaxRetryAttempts.
	MaxAttempts int `json:"max_attempts"`
	// InitialBackoff is the wait before the second attempt (at least 1ms).
	InitialBackoff time.Duration `json:"initial_backoff"`
	// MaxBackoff caps the wait between attempts (at least InitialBackoff, at most
	// MaxRetryBackoff).
	MaxBackoff time.Duration `json:"max_backoff"`
	// Codes are the error codes retried. Empty: every failure the tool marked retryable
	// (ToolError.Retryable).
	Codes []string `json:"codes,omitempty"`
}

// Bounds of a RetryPolicy.
const (
	MaxRetryAttempts = 20
	MaxRetryBackoff  = time.Hour
)

// Validate reports the first field of p out of range, naming it.
func (p RetryPolicy) Validate() error {
	switch {
	case p.MaxAttempts < 2 || p.MaxAttempts > MaxRetryAttempts:
		return fmt.Errorf("retry policy: max_attempts %d: want 2 to %d (the first attempt included)", p.MaxAttempts, MaxRetryAttempts)
	case p.InitialBackoff < time.Millisecond:
		return fmt.Errorf("retry policy: initial_backoff %s: want at least 1ms", p.InitialBackoff)
	case p.MaxBackoff < p.InitialBackoff:
		return fmt.Errorf("retry policy: max_backoff %s: want at least initial_backoff (%s)", p.MaxBackoff, p.InitialBackoff)
	case p.MaxBackoff > MaxRetryBackoff:
		return fmt.Errorf("retry policy: max_backoff %s: want at most %s", p.MaxBackoff, MaxRetryBackoff)
	}
	for _, c := range p.Codes {
		if c == "" || strings.TrimSpace(c) != c {
			return fmt.Errorf("retry policy: codes: %q is not an error code", c)
		}
	}
	return nil
}

// Retries reports whether p retries a failure with error e.
func (p RetryPolicy) Retries(e *ToolError) bool {
	if e == nil {
		return false
	}
	if len(p.Codes) == 0 {
		return e.Retryable
	}
	return slices.Contains(p.Codes, e.Code)
}

// Backoff returns the wait before the attempt after attempt (1-based), before jitter.
func (p RetryPolicy) Backoff(attempt int) time.Duration {
	d := p.InitialBackoff
	for i := 1; i < attempt && d < p.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, p.MaxBackoff)
}

// ValidToolName reports whether name is a valid tool name: 1 to 64 of [A-Za-z0-9_-],
// as the model APIs require; it is also a valid NATS subject token.
func ValidToolName(name string) bool { return validToken(name, 64) }

// ValidRunID reports whether id can be a run id: a non-empty subject token of
// [A-Za-z0-9_-], at most 128 characters.
func ValidRunID(id string) bool { return validToken(id, 128) }

// validToken reports whether s is 1 to most bytes, each a TokenByte.
func validToken(s string, most int) bool {
	if len(s) == 0 || len(s) > most {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !TokenByte(s[i]) {
			return false
		}
	}
	return true
}

// TokenByte reports whether c may stand in a name as it is: [A-Za-z0-9_-], the bytes of
// a tool name, a run id and an identity, which are NATS subject tokens and KV key tokens
// as they stand. The one home of that alphabet: what maps or escapes other names into
// it (a call id in a key, an MCP tool's name) asks here.
func TokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// IDShape is what ValidRunID accepts, in the words of errors that refuse a run id or an
// identity (a principal, an approver, a canceller, a client's identity): one home, so
// every refusal names the same shape.
const IDShape = "1-128 of [A-Za-z0-9_-]"

func schemaOrEmpty(s json.RawMessage) json.RawMessage {
	if len(s) == 0 {
		return json.RawMessage(`{"type":"object","properties":{}}`)
	}
	return s
}

// OpenAIFunctionTool is a tool in the shape of OpenAI Chat Completions' "tools" array.
type OpenAIFunctionTool struct {
	Type     string             `json:"type"`
	Function OpenAIFunctionSpec `json:"function"`
}

// OpenAIFunctionSpec is the "function" member of an OpenAI function tool.
type OpenAIFunctionSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

// AnthropicTool is a tool in the shape of Anthropic Messages' "tools" array.
type AnthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// MCPTool is a tool in the shape of an MCP tools/list result entry.
type MCPTool struct {
	Name         string          `json:"name"`
	Description  string          `json:"description,omitempty"`
	InputSchema  json.RawMessage `json:"inputSchema"`
	OutputSchema json.RawMessage `json:"outputSchema,omitempty"`
	Annotations  *MCPAnnotations `json:"annotations,omitempty"`
}

// MCPAnnotations are the MCP tool hints toolbus can state.
type MCPAnnotations struct {
	ReadOnlyHint bool `json:"readOnlyHint"`
}

// OpenAITools converts contracts to OpenAI function tools, in the given order.
func OpenAITools(cs []ToolContract) []OpenAIFunctionTool {
	out := make([]OpenAIFunctionTool, 0, len(cs))
	for _, c := range cs {
		out = append(out, OpenAIFunctionTool{Type: "function", Function: OpenAIFunctionSpec{
			Name: c.Name, Description: c.Description, Parameters: schemaOrEmpty(c.InputSchema)}})
	}
	return out
}

// AnthropicTools converts contracts to Anthropic tools, in the given order.
func AnthropicTools(cs []ToolContract) []AnthropicTool {
	out := make([]AnthropicTool, 0, len(cs))
	for _, c := range cs {
		out = append(out, AnthropicTool{Name: c.Name, Description: c.Description, InputSchema: schemaOrEmpty(c.InputSchema)})
	}
	return out
}

// MCPTools converts contracts to MCP tools/list entries, in the given order.
func MCPTools(cs []ToolContract) []MCPTool {
	out := make([]MCPTool, 0, len(cs))
	for _, c := range cs {
		out = append(out, MCPTool{Name: c.Name, Description: c.Description, InputSchema: schemaOrEmpty(c.InputSchema),
			OutputSchema: c.OutputSchema, Annotations: &MCPAnnotations{ReadOnlyHint: c.ReadOnly}})
	}
	return out
}
