package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	jsval "github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolbus/toolbus"
)

// Func is a tool implementation: it receives the raw JSON object arguments, already
// checked against the tool's InputSchema, and returns an output (any JSON-marshalable
// value, a string used as text, or a json.RawMessage) or an error (see Error).
//
// A Func must honour ctx: when ctx is done the executor stops waiting for it (see
// Executor.Execute), but it cannot stop the goroutine running it.
type Func func(ctx context.Context, args json.RawMessage) (any, error)

// Tool describes one tool: what the model sees (Name, Description, InputSchema), runtime
// limits and the implementation.
type Tool struct {
	// Name is the tool name the model calls: 1 to 64 of [A-Za-z0-9_-].
	Name string
	// Description tells the model what the tool does and when to use it.
	Description string
	// InputSchema is the JSON Schema of the arguments object (required; its top level
	// must be {"type":"object",...}). It is compiled once, at registration.
	InputSchema json.RawMessage
	// OutputSchema is the optional JSON Schema of the output. When set, outputs that
	// do not match it fail with invalid_tool_output.
	OutputSchema json.RawMessage
	// ReadOnly is true for tools without side effects; false tools get an idempotency
	// key (see CallInfo).
	ReadOnly bool
	// NeedsApproval marks tools whose calls need a person's approval. The executor core
	// only publishes it in the contract; the bus worker enforces approvals before
	// calling Execute.
	NeedsApproval bool
	// Timeout bounds a call, including the wait for a concurrency slot; 0 means the
	// executor default (30s). For a long-running tool (HeartbeatTimeout set) it is the
	// longest a call may run however often it reports progress.
	Timeout time.Duration
	// HeartbeatTimeout makes the tool long-running: a call that reports no progress
	// (Progress) for this long, from its start or its last report, is timed out, as a
	// Temporal activity's heartbeat timeout does; one that keeps reporting runs until it
	// returns, up to Timeout. 0: not long-running (reports are still published). When
	// set, it must be less than Timeout.
	HeartbeatTimeout time.Duration
	// TaskRequired: a call must be answered as a task; the MCP door lists the tool with
	// taskSupport "required" and refuses its calls to a host that takes no tasks.
	TaskRequired bool
	// MaxOutputBytes bounds ToolResult.Content in bytes; 0 means the executor default
	// (16384). When set it must be at least MinOutputBytes.
	MaxOutputBytes int
	// MaxConcurrency limits the calls of this tool in flight in one Executor; 0 means
	// unlimited.
	MaxConcurrency int
	// RedactFields are JSON object keys whose values are replaced with "[REDACTED]"
	// anywhere in the output and in error details. Keys match ignoring case, '_' and
	// '-' ("api_key" also covers "apiKey" and "API-KEY").
	RedactFields []string
	// Version numbers the contract in the catalog: a changed contract replaces the
	// registered one only with a higher version (see worker.Config.ReplaceContracts).
	Version int
	// Retry is the tool's retry policy (toolbus.RetryPolicy): failures with the codes it
	// names are retried by the fleet with backoff and jitter, with the same idempotency
	// key, within the run's deadline; only the final result goes to the model. Nil: no
	// retries. Register refuses a policy out of range (RetryPolicy.Validate).
	Retry *toolbus.RetryPolicy
	// Func is the implementation (required).
	Func Func
}

// MinOutputBytes is the smallest accepted MaxOutputBytes: enough for an error object and
// the truncation marker.
const MinOutputBytes = 256

// Contract returns the catalog entry of t (what an executor publishes to the tool
// catalog and what events.OpenAITools and friends convert for the model APIs).
func (t Tool) Contract() toolbus.ToolContract {
	return toolbus.ToolContract{
		Name:             t.Name,
		Description:      t.Description,
		InputSchema:      t.InputSchema,
		OutputSchema:     t.OutputSchema,
		ReadOnly:         t.ReadOnly,
		NeedsApproval:    t.NeedsApproval,
		Timeout:          t.Timeout,
		HeartbeatTimeout: t.HeartbeatTimeout,
		TaskRequired:     t.TaskRequired,
		MaxOutputBytes:   t.MaxOutputBytes,
		MaxConcurrency:   t.MaxConcurrency,
		RedactFields:     slices.Clone(t.RedactFields),
		Version:          t.Version,
		Retry:            clonePolicy(t.Retry),
	}
}

func clonePolicy(p *toolbus.RetryPolicy) *toolbus.RetryPolicy {
	if p == nil {
		return nil
	}
	c := *p
	c.Codes = slices.Clone(p.Codes)
	return &c
}

// entry is a registered tool with everything precomputed for Execute.
type entry struct {
	tool Tool
	in   *jsval.Schema
	out  *jsval.Schema // nil: no output check
	// redact holds RedactFields plus the built-in secret keys, normalized.
	redact []string
}

// Registry holds tools by name. Register tools at start-up; a Registry is safe for
// concurrent use (reads take a shared lock). The zero value is an empty registry.
type Registry struct {
	mu    sync.RWMutex
	tools map[string]*entry
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry { return &Registry{tools: map[string]*entry{}} }

// Register adds t. It returns an error wrapping ErrInvalidTool when t is unusable (see
// ErrInvalidTool) or ErrDuplicateTool when the name is taken. The schemas are compiled
// here, once; remote and file references ($ref to http or file URLs) are refused.
// The registry keeps its own copy of the schemas and RedactFields.
func (r *Registry) Register(t Tool) error {
	return r.register(t, true)
}

func invalid(name, format string, args ...any) error {
	return fmt.Errorf("%w %q: %s", ErrInvalidTool, name, fmt.Sprintf(format, args...))
}

// register validates, compiles and adds t. checkOutput=false keeps OutputSchema in the
// contract without enforcing it (schemas derived from Go types by RegisterFunc).
func (r *Registry) register(t Tool, checkOutput bool) error {
	if r == nil {
		return fmt.Errorf("%w: nil registry", ErrInvalidTool)
	}
	if !toolbus.ValidToolName(t.Name) {
		return invalid(t.Name, "name must be 1 to 64 of [A-Za-z0-9_-]")
	}
	if t.Func == nil {
		return invalid(t.Name, "Func is nil")
	}
	if t.Timeout < 0 || t.MaxConcurrency < 0 || t.MaxOutputBytes < 0 {
		return invalid(t.Name, "Timeout, MaxConcurrency and MaxOutputBytes must not be negative")
	}
	if t.HeartbeatTimeout < 0 || (t.HeartbeatTimeout > 0 && t.HeartbeatTimeout >= t.Timeout) {
		return invalid(t.Name, "HeartbeatTimeout %s must be 0 (not long-running) or positive and less than Timeout %s (the longest a call may run)", t.HeartbeatTimeout, t.Timeout)
	}
	if t.MaxOutputBytes != 0 && t.MaxOutputBytes < MinOutputBytes {
		return invalid(t.Name, "MaxOutputBytes must be 0 (default) or at least %d", MinOutputBytes)
	}
	for _, f := range t.RedactFields {
		if f == "" {
			return invalid(t.Name, "RedactFields has an empty field name")
		}
	}
	if len(bytes.TrimSpace(t.InputSchema)) == 0 {
		return invalid(t.Name, "InputSchema is required")
	}
	if t.Retry != nil {
		if err := t.Retry.Validate(); err != nil {
			return invalid(t.Name, "%v", err)
		}
		t.Retry = clonePolicy(t.Retry)
	}
	t.InputSchema = slices.Clone(t.InputSchema)
	t.OutputSchema = slices.Clone(t.OutputSchema)
	t.RedactFields = slices.Clone(t.RedactFields)

	in, err := compileSchema(t.InputSchema, "input")
	if err != nil {
		return invalid(t.Name, "input schema: %v", err)
	}
	if err := checkObjectSchema(t.InputSchema); err != nil {
		return invalid(t.Name, "input schema: %v", err)
	}
	e := &entry{tool: t, in: in, redact: redactKeys(t.RedactFields)}
	if len(bytes.TrimSpace(t.OutputSchema)) > 0 {
		out, err := compileSchema(t.OutputSchema, "output")
		if err != nil {
			return invalid(t.Name, "output schema: %v", err)
		}
		if checkOutput {
			e.out = out
		}
	} else {
		t.OutputSchema = nil
		e.tool.OutputSchema = nil
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tools == nil {
		r.tools = map[string]*entry{}
	}
	if _, dup := r.tools[t.Name]; dup {
		return fmt.Errorf("%w %q", ErrDuplicateTool, t.Name)
	}
	r.tools[t.Name] = e
	return nil
}

// checkObjectSchema requires the top level of an input schema to be {"type":"object"},
// as the model APIs do.
func checkObjectSchema(schema json.RawMessage) error {
	var top struct {
		Type any `json:"type"`
	}
	if err := json.Unmarshal(schema, &top); err != nil {
		return fmt.Errorf("not a JSON object: %v", err)
	}
	if s, ok := top.Type.(string); !ok || s != "object" {
		return fmt.Errorf(`top level must have "type": "object" (tool arguments are a JSON object)`)
	}
	return nil
}

// refuseLoader refuses every external schema reference, so registration never reads
// files or the network.
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("external schema reference %q is not allowed; inline it", url)
}

func compileSchema(raw json.RawMessage, which string) (*jsval.Schema, error) {
	doc, err := jsval.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("not valid JSON: %v", err)
	}
	c := jsval.NewCompiler()
	c.UseLoader(refuseLoader{})
	c.AssertFormat()
	url := "mem:///toolbus/" + which + ".schema.json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// builtinRedactKeys are keys whose values are always redacted in structured output
// (normalized: lower case, without '_' and '-').
var builtinRedactKeys = []string{"awssecretaccesskey", "secretaccesskey"}

// normalizeKey lower-cases the ASCII letters of k and drops '_' and '-'.
func normalizeKey(k string) string {
	b := make([]byte, 0, len(k))
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c == '_' || c == '-':
			continue
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return string(b)
}

func redactKeys(fields []string) []string {
	keys := slices.Clone(builtinRedactKeys)
	for _, f := range fields {
		keys = append(keys, normalizeKey(f))
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// Unregister removes the named tools (names not registered are ignored), for tool
// providers whose tools come and go at run time; a running Worker then needs Sync.
func (r *Registry) Unregister(names ...string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	for _, n := range names {
		delete(r.tools, n)
	}
	r.mu.Unlock()
}

func (r *Registry) lookup(name string) (*entry, bool) {
	if r == nil {
		return nil, false
	}
	r.mu.RLock()
	e, ok := r.tools[name]
	r.mu.RUnlock()
	return e, ok
}

// Lookup returns the tool registered under exactly name (no case folding, no default).
// The returned Tool shares its schema bytes with the registry; do not modify them.
func (r *Registry) Lookup(name string) (Tool, bool) {
	e, ok := r.lookup(name)
	if !ok {
		return Tool{}, false
	}
	return e.tool, true
}

// Names returns the registered tool names, sorted.
func (r *Registry) Names() []string {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	names := make([]string, 0, len(r.tools))
	for n := range r.tools {
		names = append(names, n)
	}
	r.mu.RUnlock()
	sort.Strings(names)
	return names
}

// Contracts returns the contracts of the registered tools, sorted by name.
func (r *Registry) Contracts() []toolbus.ToolContract {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	cs := make([]toolbus.ToolContract, 0, len(r.tools))
	for _, e := range r.tools {
		cs = append(cs, e.tool.Contract())
	}
	r.mu.RUnlock()
	sort.Slice(cs, func(i, j int) bool { return cs[i].Name < cs[j].Name })
	return cs
}
