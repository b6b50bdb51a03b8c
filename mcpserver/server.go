// Package mcpserver serves the tool catalog of a bus to MCP hosts: each tools/call is a
// pre-planned run on the bus (audited like any other run; the executor applies the
// allowlist, the approval rules and the tool's timeout; no model is called). The
// command `toolbus mcp` wires it to stdio or to streamable HTTP (HTTPHandler).
package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// Config configures the MCP server of the catalog.
type Config struct {
	// Source is the CloudEvents source of the runs it starts.
	Source string
	// Principal is who the runs act for.
	Principal string
	// ApprovalTimeout is the deadline of a run whose tool needs approval: the time left
	// to approve it with `toolbus approve` (default 10m).
	ApprovalTimeout time.Duration
	// DefaultToolTimeout bounds a call of a tool whose contract sets no timeout (default 60s).
	DefaultToolTimeout time.Duration
	// Refresh is how often the offered tools follow the catalog (default 1s).
	Refresh time.Duration
	// CLIApprovalsOnly stops asking the host's user to decide a call that needs approval
	// (and refuses such decisions from MCP callers): the call waits for `toolbus approve`
	// or the console, a decision of someone other than the caller.
	CLIApprovalsOnly bool
	// TaskAfter is how long a call whose request takes tasks (2026-07-28, extension
	// io.modelcontextprotocol/tasks) is followed before it is answered with a task
	// (default 5s); a long-running tool's call (heartbeat_timeout) is one at once.
	TaskAfter time.Duration
	// TaskPollInterval is the polling interval a task suggests (default 2s).
	TaskPollInterval time.Duration
	// StateKey seals the requestState of input_required results (state.go): at least
	// 32 bytes, the same in every replica of the door, held by the door's deployment
	// only (TOOLBUS_MCP_STATE_KEY_FILE). Empty: a random key, so a round trip resumes
	// only at the process that asked it.
	StateKey []byte
	// StateTTL is how long a requestState may be used (default DefaultStateTTL).
	StateTTL time.Duration
	// Version is the server version told to hosts.
	Version string
	Logger  *slog.Logger
}

// bridge turns MCP tools/call requests into pre-planned runs on the bus.
type bridge struct {
	bus *events.Bus
	cat *store.Catalog
	cfg Config
	srv *mcp.Server
	// states seals and opens requestStates.
	states sealer

	mu      sync.Mutex
	offered map[string]string // tool -> JSON of the contract offered
}

// New returns an MCP server offering the catalog tools that a live instance
// serves, kept current until ctx ends (hosts get notifications/tools/list_changed).
// Each tools/call is a run whose step 0 is the call itself (RunStarted.Calls): the
// stream keeps its audit record, the executor applies the allowlist, the approval
// rules and the tool's timeout, and no model is called.
func New(ctx context.Context, bus *events.Bus, cfg Config) (*mcp.Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ApprovalTimeout <= 0 {
		cfg.ApprovalTimeout = 10 * time.Minute
	}
	if cfg.DefaultToolTimeout <= 0 {
		cfg.DefaultToolTimeout = time.Minute
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = time.Second
	}
	if cfg.TaskAfter <= 0 {
		cfg.TaskAfter = 5 * time.Second
	}
	if cfg.TaskPollInterval <= 0 {
		cfg.TaskPollInterval = 2 * time.Second
	}
	cat, err := bus.Catalog(ctx, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("mcp: catalog: %w", err)
	}
	if len(cfg.StateKey) == 0 {
		cfg.StateKey = NewStateKey()
	} else if len(cfg.StateKey) < StateKeySize {
		return nil, fmt.Errorf("mcp: the state key has %d bytes, want at least %d", len(cfg.StateKey), StateKeySize)
	}
	if cfg.StateTTL <= 0 {
		cfg.StateTTL = DefaultStateTTL
	}
	b := &bridge{bus: bus, cat: cat, cfg: cfg, offered: map[string]string{},
		states: sealer{key: cfg.StateKey, now: time.Now, ttl: cfg.StateTTL}}
	// The SDK's default (logging), tasks, and prompts and resources, which go-sdk
	// answers (with none) whether declared or not: a host discovers what it can call.
	caps := &mcp.ServerCapabilities{Logging: &mcp.LoggingCapabilities{}, Prompts: &mcp.PromptCapabilities{}, Resources: &mcp.ResourceCapabilities{}}
	caps.AddExtension(ExtTasks, nil)
	b.srv = mcp.NewServer(&mcp.Implementation{Name: "toolbus", Version: cfg.Version}, &mcp.ServerOptions{Logger: cfg.Logger, Capabilities: caps})
	if err := b.addTaskMethods(); err != nil {
		return nil, fmt.Errorf("mcp: %w", err)
	}
	b.srv.AddReceivingMiddleware(b.taskResults, withCaller(cfg.Principal), b.teamTools(cfg.Principal), cancelledAnswers)
	b.sync()
	go func() {
		t := time.NewTicker(cfg.Refresh)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				b.sync()
			}
		}
	}()
	return b.srv, nil
}

// as is the bus that reads and publishes as the caller who: in a client account (the
// accounts layout) a view reading through who's read service (events.Bus.As), else the
// bridge's bus.
func (b *bridge) as(ctx context.Context, who string) (*events.Bus, error) {
	bus, err := b.bus.As(ctx, who)
	if err != nil {
		return nil, fmt.Errorf("mcp: %w", err)
	}
	return bus, nil
}

// sync makes the offered tools those of the catalog that a live instance serves.
func (b *bridge) sync() {
	b.mu.Lock()
	defer b.mu.Unlock()
	live := map[string]bool{}
	for _, tc := range b.cat.Tools(nil) {
		schema, ok := objectSchema(tc.InputSchema)
		if !ok {
			// The SDK refuses a tool whose input is not an object: skip it, say why once.
			if _, seen := b.offered[tc.Name]; !seen {
				b.cfg.Logger.Warn("tool not offered over MCP: its input schema is not a JSON object", "tool", tc.Name)
				b.offered[tc.Name] = ""
			}
			live[tc.Name] = true
			continue
		}
		live[tc.Name] = true
		key := string(mustMarshal(tc))
		if b.offered[tc.Name] == key {
			continue
		}
		b.offered[tc.Name] = key
		desc := tc.Description
		if tc.NeedsApproval {
			desc += " (needs approval: the host asks its user, or the call waits for `toolbus approve`)"
		}
		b.srv.AddTool(&mcp.Tool{
			Name: tc.Name, Description: desc, InputSchema: schema,
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: tc.ReadOnly},
		}, b.call)
	}
	var gone []string
	for name := range b.offered {
		if !live[name] {
			gone = append(gone, name)
			delete(b.offered, name)
		}
	}
	if len(gone) > 0 {
		b.srv.RemoveTools(gone...)
	}
}

// objectSchema returns schema as a JSON object with type "object", as MCP requires; an
// empty schema is the schema of any object.
func objectSchema(schema json.RawMessage) (map[string]any, bool) {
	if len(schema) == 0 {
		return map[string]any{"type": "object"}, true
	}
	var m map[string]any
	if err := json.Unmarshal(schema, &m); err != nil || m["type"] != "object" {
		return nil, false
	}
	return m, true
}

func mustMarshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain data is marshalled here
	}
	return b
}

// The _meta keys of a result that name its run and call (`toolbus replay <run>`).
const (
	MetaRun  = "toolbus/run_id"
	MetaCall = "toolbus/call_id"
)

// call runs one tools/call as a pre-planned run and answers it as follow does; the
// retry of a call that asked for input (requestState set) decides the call it names
// (resume).
func (b *bridge) call(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	name := req.Params.Name
	c := callerOfExtra(req.Extra, b.cfg.Principal)
	who, teams := c.id, c.teams
	if req.Params.RequestState != "" {
		return b.resume(ctx, req, c)
	}
	tc, ok := b.cat.Lookup(name)
	if !ok || !offeredTo(tc, teams) {
		// Another team's tool is as unknown to this token as a tool nobody serves.
		return errorResult(fmt.Sprintf("unknown tool %q: no executor serves it", name)), nil
	}
	if tc.TaskRequired && !takesTasks(req) {
		// A tool that needs a task is not called for a host that cannot take one.
		return nil, missingTasks()
	}
	args := strings.TrimSpace(string(req.Params.Arguments))
	if args == "" || args == "null" {
		args = "{}"
	}
	principal := toolbus.Principal{ID: who, Roles: teams}
	if c.owner != "" {
		principal.Attrs = map[string]string{OwnerAttr: c.owner}
	}
	rs := callrun.Build(callrun.Spec{
		RunID: callrun.NewID("mcp"), Principal: principal, Tool: tc, Arguments: args,
		Via: "MCP tools/call", DefaultToolTimeout: b.cfg.DefaultToolTimeout, ApprovalTimeout: b.cfg.ApprovalTimeout,
	}, time.Now())
	bus, err := b.as(ctx, who)
	if err != nil {
		return nil, err
	}
	// The request's W3C traceparent (_meta, SEP-414) is the trace the run joins.
	tp, _ := req.Params.Meta["traceparent"].(string)
	if err := bus.StartRun(events.WithTraceparent(ctx, tp), b.cfg.Source, rs); err != nil {
		return nil, fmt.Errorf("mcp: start run for %s: %w", name, err)
	}
	b.cfg.Logger.Info("mcp call started", "tool", name, "run_id", rs.RunID, "principal", who)
	return b.follow(ctx, req, &rs, who, false, questionMark{})
}

// toolResult maps a tool result to MCP: the text the model would read, the output as
// structured content when it is an object, the attachments as image, audio or resource
// content, and isError for any status but succeeded. owner is the door's call
// (callOwner): the only outputs its attachments may name.
func (b *bridge) toolResult(ctx context.Context, bus *events.Bus, owner store.OutputOwner, r toolbus.ToolResult) *mcp.CallToolResult {
	text := r.Content
	if text == "" && r.Error != nil {
		text = r.Error.Message
	}
	res := &mcp.CallToolResult{}
	if text != "" || len(r.Attachments) == 0 {
		res.Content = []mcp.Content{&mcp.TextContent{Text: text}}
	}
	if r.Status != toolbus.StatusSucceeded {
		res.IsError = true
		if r.Error != nil && !strings.Contains(text, r.Error.Code) {
			res.Content = append(res.Content, &mcp.TextContent{Text: fmt.Sprintf("status %s, code %s", r.Status, r.Error.Code)})
		}
		return res
	}
	for i, a := range r.Attachments {
		res.Content = append(res.Content, b.attachment(ctx, bus, owner, r, i, a))
	}
	if out := json.RawMessage(r.Output); len(out) > 0 && out[0] == '{' && json.Valid(out) {
		res.StructuredContent = out
	}
	return res
}

// attachment maps attachment i of r to MCP content: image and audio content by its
// media type, else an embedded resource (text for text media types, else a blob). The
// bytes of an attachment kept in the outputs bucket are read from there; one that
// cannot be read, or is not the call's own (store.CallOutput), is a line of text that
// says so.
func (b *bridge) attachment(ctx context.Context, bus *events.Bus, owner store.OutputOwner, r toolbus.ToolResult, i int, a toolbus.Attachment) mcp.Content {
	data := a.Data
	if a.Ref != "" && len(data) == 0 {
		var err error
		if data, err = bus.Store().CallOutput(ctx, owner, a.Ref, i); err != nil {
			b.cfg.Logger.Warn("mcp: attachment not read", "call_id", r.CallID, "ref", a.Ref, "error", err)
			return &mcp.TextContent{Text: a.Describe() + " (its bytes could not be read)"}
		}
	}
	switch a.Kind() {
	case "image":
		return &mcp.ImageContent{Data: data, MIMEType: a.MediaType}
	case "audio":
		return &mcp.AudioContent{Data: data, MIMEType: a.MediaType}
	}
	uri := a.URI
	if uri == "" {
		uri = fmt.Sprintf("toolbus://call/%s/attachment/%d", r.CallID, i)
		if a.Name != "" {
			uri += "/" + url.PathEscape(a.Name)
		}
	}
	rc := &mcp.ResourceContents{URI: uri, MIMEType: a.MediaType}
	if a.Kind() == "text" && utf8.Valid(data) {
		rc.Text = string(data)
	} else {
		rc.Blob = data
	}
	return &mcp.EmbeddedResource{Resource: rc}
}

func errorResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}

// callOwner is the call of a run the door started (its one pre-planned call, step 0):
// the only call whose stored outputs the door reads for its answer.
func callOwner(rs *toolbus.RunStarted) store.OutputOwner {
	o := store.OutputOwner{Run: rs.RunID, CallID: callrun.CallID}
	if len(rs.Calls) > 0 {
		o.Tool = rs.Calls[0].Tool
	}
	return o
}
