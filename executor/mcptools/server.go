package mcptools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/retry"
)

// One connected server: its session, kept up with backoff, its tools kept in line with
// the registry under sanitized names, and the calls made over it.

type server struct {
	name, prefix string
	dial         Dialer
	p            *Provider
	policy       Policy
	log          *slog.Logger

	// syncMu serializes tool list refreshes, so an older listing never overwrites a
	// newer one.
	syncMu sync.Mutex
	mu     sync.Mutex
	sess   *mcp.ClientSession // nil while disconnected
	up     chan struct{}      // closed while sess != nil
	tools  map[string]string  // toolbus name -> MCP name
	sigs   map[string]string  // toolbus name -> contract signature, to spot changed tools
}

// connect opens a session and registers the server's tools.
func (s *server) connect(ctx context.Context) (*mcp.ClientSession, error) {
	t, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "toolbus", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			// Not in the notification's goroutine: listing is a request on the same session.
			go s.refresh(ctx)
		},
	})
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	sess, err := client.Connect(cctx, t, nil)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := s.sync(cctx, sess); err != nil {
		_ = sess.Close()
		return nil, err
	}
	s.mu.Lock()
	s.sess = sess
	close(s.up)
	s.mu.Unlock()
	s.log.Info("MCP server connected", "tools", len(s.tools))
	return sess, nil
}

// supervise waits for the session to end and connects again with backoff.
func (s *server) supervise(ctx context.Context, sess *mcp.ClientSession) {
	for {
		err := sess.Wait()
		if h := s.p.sessionEnded; h != nil {
			h()
		}
		// Close releases what the SDK keeps for an ended session (its listen request's
		// goroutine waits for Close, not for the connection's end).
		_ = sess.Close()
		s.down(sess)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("MCP server connection ended; reconnecting", "error", err)
		// The first reconnection waits MinBackoff too: a server that just dropped us is
		// not asked again at once.
		if retry.Sleep(ctx, s.p.opts.MinBackoff) != nil {
			return
		}
		err = retry.Do(ctx, retry.Policy{Base: 2 * s.p.opts.MinBackoff, Max: s.p.opts.MaxBackoff,
			OnError: func(_ int, err error, wait time.Duration) (time.Duration, error) {
				s.log.Warn("MCP server reconnection failed", "error", err, "retry_in", wait)
				return wait, nil
			}}, func(ctx context.Context) error {
			var err error
			sess, err = s.connect(ctx)
			return err
		})
		if err != nil {
			return // only the context ends the retries
		}
	}
}

func (s *server) refresh(ctx context.Context) {
	s.mu.Lock()
	sess := s.sess
	s.mu.Unlock()
	if sess == nil {
		return // the reconnection lists the tools anyway
	}
	if err := s.sync(ctx, sess); err != nil {
		s.log.Warn("MCP tool list not refreshed", "error", err)
	}
}

// sync lists the server's tools and brings the registry in line: new tools registered,
// removed ones unregistered, changed ones replaced; then OnChange.
func (s *server) sync(ctx context.Context, sess *mcp.ClientSession) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	type listed struct {
		tool executor.Tool
		mcp  string
	}
	want := map[string]listed{}
	for t, err := range sess.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("list tools: %w", err)
		}
		if !s.policy.serves(t.Name) {
			continue // the configuration's allowTools/denyTools leave it out
		}
		tool, err := s.tool(t)
		if err != nil {
			s.log.Warn("MCP tool skipped", "tool", t.Name, "error", err)
			continue
		}
		if _, dup := want[tool.Name]; dup {
			s.log.Warn("MCP tool skipped: its toolbus name is taken by another tool of the server", "tool", t.Name, "name", tool.Name)
			continue
		}
		want[tool.Name] = listed{tool, t.Name}
	}
	s.mu.Lock()
	changed := false
	if s.sigs == nil {
		s.sigs = map[string]string{}
	}
	for name := range s.tools {
		if _, ok := want[name]; !ok {
			s.p.reg.Unregister(name)
			delete(s.tools, name)
			delete(s.sigs, name)
			changed = true
		}
	}
	for name, l := range want {
		sig := signature(l.tool)
		if _, ok := s.tools[name]; ok {
			if s.sigs[name] == sig {
				continue
			}
			s.p.reg.Unregister(name)
			delete(s.tools, name)
			changed = true
		}
		if err := s.p.reg.Register(l.tool); err != nil {
			s.log.Warn("MCP tool not registered", "tool", name, "error", err)
			continue
		}
		s.tools[name] = l.mcp
		s.sigs[name] = sig
		changed = true
	}
	s.mu.Unlock()
	if changed && s.p.opts.OnChange != nil {
		if err := s.p.opts.OnChange(ctx); err != nil {
			s.log.Warn("catalog not updated after an MCP tool list change", "error", err)
		}
	}
	return nil
}

func signature(t executor.Tool) string {
	h := sha256.New()
	h.Write([]byte(t.Description))
	h.Write([]byte{0})
	h.Write(t.InputSchema)
	if t.ReadOnly {
		h.Write([]byte{1})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// sanitize maps a name to [A-Za-z0-9_-].
func sanitize(name string) string {
	b := []byte(name)
	for i, c := range b {
		if !toolbus.TokenByte(c) {
			b[i] = '_'
		}
	}
	return string(b)
}

// toolName is <server>__<tool>, sanitized; a name over 64 bytes keeps its start and a
// hash of the whole, so it stays unique and valid.
func (s *server) toolName(mcpName string) string {
	n := s.prefix + sanitize(mcpName)
	if len(n) <= 64 {
		return n
	}
	sum := sha256.Sum256([]byte(s.prefix + mcpName))
	return n[:55] + "_" + hex.EncodeToString(sum[:4])
}

// tool converts an MCP tool into a toolbus tool whose Func calls it.
func (s *server) tool(t *mcp.Tool) (executor.Tool, error) {
	schema, err := json.Marshal(t.InputSchema)
	if err != nil {
		return executor.Tool{}, fmt.Errorf("input schema: %w", err)
	}
	if t.InputSchema == nil || string(schema) == "null" {
		schema = []byte(`{"type":"object"}`)
	}
	desc := t.Description
	if desc == "" {
		desc = t.Title
	}
	name := t.Name
	timeout := s.p.opts.Timeout
	if s.policy.Timeout > 0 {
		timeout = time.Duration(s.policy.Timeout)
	}
	return executor.Tool{
		Name:        s.toolName(name),
		Description: desc,
		InputSchema: schema,
		// OutputSchema is not enforced: the server is the authority on its output.
		ReadOnly:      t.Annotations != nil && t.Annotations.ReadOnlyHint,
		Timeout:       timeout,
		NeedsApproval: matchAny(s.policy.NeedsApproval, name),
		Func: func(ctx context.Context, args json.RawMessage) (any, error) {
			return s.call(ctx, name, args)
		},
	}, nil
}

// down marks sess ended, unless it was already: calls then wait for the next session.
// Both the supervisor and a call that found the session closing mark it, whichever
// comes first; the channel the waiters wait on is made once per ended session, and the
// next connect closes it.
func (s *server) down(sess *mcp.ClientSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess == sess {
		s.sess = nil
		s.up = make(chan struct{})
	}
}

// session returns the live session, waiting for a reconnection while ctx allows.
func (s *server) session(ctx context.Context) (*mcp.ClientSession, error) {
	for {
		s.mu.Lock()
		sess, up := s.sess, s.up
		s.mu.Unlock()
		if sess != nil {
			return sess, nil
		}
		select {
		case <-up:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// call runs tools/call. ctx carries the call's deadline; when it ends the SDK sends
// notifications/cancelled to the server.
func (s *server) call(ctx context.Context, name string, args json.RawMessage) (any, error) {
	var (
		res *mcp.CallToolResult
		err error
	)
	for attempt := 0; ; attempt++ {
		var sess *mcp.ClientSession
		if sess, err = s.session(ctx); err != nil {
			return nil, err
		}
		res, err = sess.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		// ErrConnectionClosed: the session was closing before the call was written (the
		// server died and the supervisor has not noticed yet), so the server never saw
		// it: waiting for the next session and calling there runs it once. A call that
		// was written and lost its connection fails with the read error instead, and is
		// not called again (it may have run).
		if err == nil || !errors.Is(err, mcp.ErrConnectionClosed) || ctx.Err() != nil || attempt >= 3 {
			break
		}
		s.down(sess)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err() // the executor reports the timeout or cancellation
		}
		// A JSON-RPC error is the server's answer (unknown tool, bad params, a failing
		// handler); anything else is the transport failing under the call.
		var rpcErr *jsonrpc.Error
		if errors.As(err, &rpcErr) {
			return nil, executor.NewRetryableError(CodeProtocol, fmt.Sprintf("the MCP server %q answered with an error: %v", s.name, err))
		}
		return nil, executor.NewRetryableError(CodeUnavailable, fmt.Sprintf(
			"the connection to the MCP server %q ended during the call (it is being restarted; the call may be tried again): %v", s.name, err))
	}
	if res.IsError {
		text := Text(res.Content)
		if text == "" {
			text = "the tool reported an error without a message"
		}
		return nil, executor.NewError(toolbus.CodeToolError, text)
	}
	rest, files := Attachments(res.Content)
	var out any = Text(rest)
	if res.StructuredContent != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return nil, executor.NewError(toolbus.CodeInvalidToolOutput, "structuredContent is not JSON: "+err.Error())
		}
		out = json.RawMessage(b)
	}
	if len(files) > 0 {
		return executor.Attach(out, files...), nil
	}
	return out, nil
}
