package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/internal/door"
)

// cmdMCP serves the tool catalog as an MCP server: over stdio by default (stdout then
// carries only MCP messages; logs go to stderr), or over streamable HTTP with --http,
// where every request needs a bearer token of TOOLBUS_MCP_TOKENS(_FILE) and the runs
// carry the token's principal.
func cmdMCP(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer) error {
	fs := newFlagSet("mcp", "mcp [--http ADDR]   (serve the catalog to MCP hosts; TOOLBUS_NATS_URL must be set; --http needs TOOLBUS_MCP_TOKENS_FILE)", errOut)
	addr := fs.String("http", "", "serve streamable HTTP on this address; \":8090\" listens on 127.0.0.1 only (default: stdio)")
	principal := fs.String("principal", "mcp", "principal the runs act for over stdio (over HTTP: each token's)")
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		return &exitError{code: 2, msg: fmt.Sprintf("mcp: unexpected argument %q", fs.Arg(0))}
	}
	var (
		access *door.Source
		listen string
		beyond bool
	)
	if *addr != "" {
		var err error
		if listen, beyond, err = door.LoopbackAddr(*addr); err != nil {
			return &exitError{code: 2, msg: "mcp: --http " + err.Error()}
		}
		if cfg.MCPTokens == "" && cfg.MCPTokensFile == "" {
			return &exitError{code: 2, msg: "mcp: --http needs TOOLBUS_MCP_TOKENS_FILE (or TOOLBUS_MCP_TOKENS): the principals and token hashes allowed in; `toolbus token NAME` makes one"}
		}
		if access, err = door.NewSource(cfg.MCPTokens, cfg.MCPTokensFile); err != nil {
			return &exitError{code: 2, msg: "mcp: " + err.Error()}
		}
	}
	c, err := openBus(ctx, cfg, log, false)
	if err != nil {
		return err
	}
	defer c.Close()
	srv, err := newMCPServer(ctx, c.bus, mcpConfig{
		Source: events.Source("mcp", cfg.Instance), Principal: *principal, ApprovalTimeout: cfg.RunTimeout, Logger: log,
	})
	if err != nil {
		return err
	}
	if *addr == "" {
		err := srv.Run(ctx, &mcp.StdioTransport{})
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	h := mcpHTTPHandler(srv, mcpHTTPConfig{
		Listen: listen, Access: access, AllowedHosts: cfg.MCPAllowedHosts, AllowedOrigins: cfg.MCPAllowedOrigins,
		SessionTimeout: cfg.MCPSessionTimeout, MaxSessions: cfg.MCPMaxSessions, Logger: log,
	})
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("mcp: %w", err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx) //nolint:errcheck // best effort at exit
	}()
	log.Info("toolbus mcp serving streamable HTTP", "addr", ln.Addr().String(), "principals", access.Current().Len())
	if beyond {
		log.Warn("toolbus mcp listens beyond this machine: anyone who reaches it with a token calls tools; serve it behind TLS (a reverse proxy) and set TOOLBUS_MCP_ALLOWED_HOSTS to the names clients use", "addr", ln.Addr().String())
	}
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("mcp: %w", err)
	}
	return nil
}

// mcpConfig configures the MCP server of the catalog.
type mcpConfig struct {
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
	Logger  *slog.Logger
}

// deadlineSlack is added to a tool's timeout for the run's deadline: the executor's own
// timeout answers first, and the run's deadline only covers a call no executor takes.
const deadlineSlack = 15 * time.Second

// mcpBridge turns MCP tools/call requests into pre-planned runs on the bus.
type mcpBridge struct {
	bus *events.Bus
	cat *store.Catalog
	cfg mcpConfig
	srv *mcp.Server

	mu      sync.Mutex
	offered map[string]string // tool -> JSON of the contract offered
}

// newMCPServer returns an MCP server offering the catalog tools that a live instance
// serves, kept current until ctx ends (hosts get notifications/tools/list_changed).
// Each tools/call is a run whose step 0 is the call itself (RunStarted.Calls): the
// stream keeps its audit record, the executor applies the allowlist, the approval
// rules and the tool's timeout, and no model is called.
func newMCPServer(ctx context.Context, bus *events.Bus, cfg mcpConfig) (*mcp.Server, error) {
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
	cat, err := bus.WatchCatalog(ctx, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("mcp: catalog: %w", err)
	}
	b := &mcpBridge{bus: bus, cat: cat, cfg: cfg, offered: map[string]string{}}
	b.srv = mcp.NewServer(&mcp.Implementation{Name: "toolbus", Version: version()}, &mcp.ServerOptions{Logger: cfg.Logger})
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
func (b *mcpBridge) sync() {
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

// mcpCallID is the call id of the one call of an MCP run.
const mcpCallID = "call_0"

// The _meta keys of a result that name its run and call (`toolbus replay <run>`).
const (
	mcpMetaRun  = "toolbus/run_id"
	mcpMetaCall = "toolbus/call_id"
)

// call runs one tools/call as a pre-planned run and maps its tool.finished to the
// result. A call that needs approval is answered at once with an error naming the run
// and call to approve: an MCP host's request would otherwise hold for minutes with no
// progress the user can see, and many hosts time requests out well before that; the
// run waits for the decision (up to ApprovalTimeout) and `toolbus replay` shows it.
func (b *mcpBridge) call(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	name := req.Params.Name
	tc, ok := b.cat.Lookup(name)
	if !ok {
		return errorResult(fmt.Sprintf("unknown tool %q: no executor serves it", name)), nil
	}
	args := strings.TrimSpace(string(req.Params.Arguments))
	if args == "" || args == "null" {
		args = "{}"
	}
	timeout := tc.Timeout
	if timeout <= 0 {
		timeout = b.cfg.DefaultToolTimeout
	}
	deadline := timeout + deadlineSlack
	if tc.NeedsApproval {
		deadline = max(deadline, b.cfg.ApprovalTimeout)
	}
	run := "mcp-" + strings.TrimPrefix(newRunID(), "run-")
	who, teams := callerOf(req, b.cfg.Principal)
	rs := toolbus.RunStarted{
		RunID: run, Principal: toolbus.Principal{ID: who, Roles: teams}, AllowedTools: []string{name},
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "MCP tools/call " + name}},
		Limits:   toolbus.Limits{MaxSteps: 2, Deadline: time.Now().Add(deadline).UTC()},
		Calls:    []toolbus.ToolCall{{CallID: mcpCallID, Tool: name, Arguments: args}},
	}
	watch, err := b.bus.Watch(ctx, events.SubjectRun(run), true)
	if err != nil {
		return nil, fmt.Errorf("mcp: %w", err)
	}
	if err := b.bus.StartRun(ctx, b.cfg.Source, rs); err != nil {
		return nil, fmt.Errorf("mcp: start run for %s: %w", name, err)
	}
	b.cfg.Logger.Info("mcp call started", "tool", name, "run_id", run, "principal", who)
	var answer *mcp.CallToolResult
	v := audit.Visitor{
		ToolFinished: func(_ events.StoredEvent, tf toolbus.ToolFinished) {
			if tf.CallID == mcpCallID {
				answer = toolResult(tf.ToolResult)
				answer.Meta = mcp.Meta{mcpMetaRun: run, mcpMetaCall: mcpCallID}
			}
		},
		ToolWaiting: func(events.StoredEvent, toolbus.ToolWaiting) {
			answer = errorResult(fmt.Sprintf("%s needs approval: run %s, call %s waits for it until %s. Approve with `toolbus approve %s %s` (or deny with `toolbus deny %s %s --reason ...`); `toolbus replay %s` shows the result.",
				name, run, mcpCallID, rs.Limits.Deadline.Format(time.RFC3339), run, mcpCallID, run, mcpCallID, run))
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
