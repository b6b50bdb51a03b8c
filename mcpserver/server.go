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
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/internal/callrun"
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
	cat, err := bus.Store().WatchCatalog(ctx, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("mcp: catalog: %w", err)
	}
	b := &bridge{bus: bus, cat: cat, cfg: cfg, offered: map[string]string{}}
	b.srv = mcp.NewServer(&mcp.Implementation{Name: "toolbus", Version: cfg.Version}, &mcp.ServerOptions{Logger: cfg.Logger})
	b.srv.AddReceivingMiddleware(cancelledAnswers)
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
			desc += " (needs approval: a call waits for `toolbus approve`)"
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

// call runs one tools/call as a pre-planned run and maps its tool.finished to the
// result; while the call runs, its progress reports go to the host as progress
// notifications when the request carries a progressToken. A call that needs approval is answered at once with an error naming the run
// and call to approve: an MCP host's request would otherwise hold for minutes with no
// progress the user can see, and many hosts time requests out well before that; the
// run waits for the decision (up to ApprovalTimeout) and `toolbus replay` shows it.
func (b *bridge) call(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	name := req.Params.Name
	tc, ok := b.cat.Lookup(name)
	if !ok {
		return errorResult(fmt.Sprintf("unknown tool %q: no executor serves it", name)), nil
	}
	args := strings.TrimSpace(string(req.Params.Arguments))
	if args == "" || args == "null" {
		args = "{}"
	}
	who, teams := callerOf(req, b.cfg.Principal)
	rs := callrun.Build(callrun.Spec{
		RunID: callrun.NewID("mcp"), Principal: toolbus.Principal{ID: who, Roles: teams}, Tool: tc, Arguments: args,
		Via: "MCP tools/call", DefaultToolTimeout: b.cfg.DefaultToolTimeout, ApprovalTimeout: b.cfg.ApprovalTimeout,
	}, time.Now())
	run := rs.RunID
	watch, err := b.bus.Watch(ctx, events.SubjectRun(run), true)
	if err != nil {
		return nil, fmt.Errorf("mcp: %w", err)
	}
	if err := b.bus.StartRun(ctx, b.cfg.Source, rs); err != nil {
		return nil, fmt.Errorf("mcp: start run for %s: %w", name, err)
	}
	b.cfg.Logger.Info("mcp call started", "tool", name, "run_id", run, "principal", who)
	var answer *mcp.CallToolResult
	// The host asked for progress (a progressToken): the call's tool.progress events are
	// forwarded as notifications/progress, whose progress must increase (a report that
	// does not move done forward is not sent).
	token := req.Params.GetProgressToken()
	sent := -1.0
	v := audit.Visitor{
		ToolProgress: func(_ events.StoredEvent, tp toolbus.ToolProgress) {
			if token == nil || answer != nil || tp.CallID != callrun.CallID || tp.Step != 0 || tp.Done <= sent || req.Session == nil {
				return
			}
			sent = tp.Done
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: token, Progress: tp.Done, Total: tp.Total, Message: tp.Message,
			}); err != nil {
				b.cfg.Logger.Debug("mcp progress not sent", "run_id", run, "error", err)
			}
		},
		ToolFinished: func(_ events.StoredEvent, tf toolbus.ToolFinished) {
			if tf.CallID == callrun.CallID {
				answer = toolResult(tf.ToolResult)
				answer.Meta = mcp.Meta{MetaRun: run, MetaCall: callrun.CallID}
			}
		},
		ToolWaiting: func(events.StoredEvent, toolbus.ToolWaiting) {
			answer = errorResult(fmt.Sprintf("%s needs approval: run %s, call %s waits for it until %s. Approve with `toolbus approve %s %s` (or deny with `toolbus deny %s %s --reason ...`); `toolbus replay %s` shows the result.",
				name, run, callrun.CallID, rs.Limits.Deadline.Format(time.RFC3339), run, callrun.CallID, run, callrun.CallID, run))
		},
		RunEnded: func(_ events.StoredEvent, re toolbus.RunEnded) {
			if re.Status != toolbus.RunRunning {
				answer = errorResult(fmt.Sprintf("run %s ended %s before the call answered: %s %s", run, re.Status, re.Code, re.Reason))
			}
		},
	}
	for answer == nil {
		ev, ok, err := watch.Next(ctx, time.Second)
		if err != nil {
			if ctx.Err() != nil {
				// The host cancelled or went away: cancel the run, so the call is too.
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				_, _ = b.bus.PublishCancel(cctx, b.cfg.Source, toolbus.Cancel{RunID: run, Reason: "the MCP request was cancelled", Who: who}) //nolint:errcheck // best effort
				cancel()
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("mcp: %w", err)
		}
		if ok {
			v.Visit(ev)
		}
	}
	return answer, nil
}

// toolResult maps a tool result to MCP: the text the model would read, the output as
// structured content when it is an object, and isError for any status but succeeded.
func toolResult(r toolbus.ToolResult) *mcp.CallToolResult {
	text := r.Content
	if text == "" && r.Error != nil {
		text = r.Error.Message
	}
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}
	if r.Status != toolbus.StatusSucceeded {
		res.IsError = true
		if r.Error != nil && !strings.Contains(text, r.Error.Code) {
			res.Content = append(res.Content, &mcp.TextContent{Text: fmt.Sprintf("status %s, code %s", r.Status, r.Error.Code)})
		}
		return res
	}
	if out := json.RawMessage(r.Output); len(out) > 0 && out[0] == '{' && json.Valid(out) {
		res.StructuredContent = out
	}
	return res
}

func errorResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}
