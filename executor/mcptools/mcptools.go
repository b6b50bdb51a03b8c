// Package mcptools serves the tools of MCP servers (Model Context Protocol) as toolbus
// tools: each configured server's tools enter an executor.Registry under the name
// <server>__<tool>, with the server's input schemas, and a call becomes an MCP
// tools/call with the call's deadline and cancellation.
//
// Configuration has the shape MCP hosts use (Claude Desktop, Cursor): a JSON file with
// "mcpServers" entries, each a stdio "command" with "args" and "env", or a streamable
// HTTP "url" with "headers" and, for a server that requires authorization, "oauth"
// (package mcpauth).
//
// Results map as follows: isError becomes a failed tool_error with the server's text;
// protocol and transport errors become retryable failures (code mcp_error or
// mcp_unavailable); structuredContent becomes the output; otherwise the text content is
// what the model reads, with resource links and text resources described rather than
// dropped; images, audio and binary resources pass through as the result's attachments.
// A server whose connection ends (a stdio process that died, an HTTP session lost) is
// connected again with exponential backoff; calls in flight get a retryable
// mcp_unavailable result, and later calls wait for the new connection.
package mcptools

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/mcptools/mcpauth"
)

// Error codes of MCP failures (ToolResult.Error.Code).
const (
	// CodeUnavailable: the server is not connected, or its connection ended during the
	// call (it is being restarted). Retryable.
	CodeUnavailable = "mcp_unavailable"
	// CodeProtocol: the server answered tools/call with a protocol error. Retryable.
	CodeProtocol = "mcp_error"
)

// Options tunes a Provider.
type Options struct {
	// Logger (default slog.Default).
	Logger *slog.Logger
	// OnChange is called after the provider changed the registry (a server's tool list
	// changed, or a reconnected server offers other tools), typically with a running
	// worker.Worker's Sync.
	OnChange func(ctx context.Context) error
	// MinBackoff and MaxBackoff bound the wait between reconnections (defaults 200ms
	// and 30s); the wait doubles after each failed attempt.
	MinBackoff, MaxBackoff time.Duration
	// Timeout is the executor.Tool Timeout of the MCP tools (0: the executor default).
	Timeout time.Duration
	// OnSecret is given every credential of the servers' authorization as it becomes
	// known (client secrets and keys at New, each new OAuth token): the executor's
	// AddSecrets, so none reaches a result, progress message or log line.
	OnSecret func(values ...string)
	// AuthorizationCodeFetcher sends a person to an authorization URL and returns the
	// code (servers with the authorization_code grant and no usable stored token). Nil
	// in executors: such a server fails to connect until an operator logs in
	// (mcpauth.ErrLoginRequired).
	AuthorizationCodeFetcher auth.AuthorizationCodeFetcher
	// HTTPClient makes the authorization's metadata, registration and token requests
	// (default: mcpauth's, with mcpauth.RequestTimeout).
	HTTPClient *http.Client
	// Tokens shares the servers' OAuth tokens with the deployment's other instances
	// (an executor on a bus: its team's keys of toolbus_secrets, events.Bus.Secrets), so
	// one instance renews a token for all. Nil: each process takes its own.
	Tokens mcpauth.TokenStore
	// RefreshEarly is how long before its expiry a token is renewed (default
	// mcpauth.RefreshEarly; tests shorten it).
	RefreshEarly time.Duration
}

// Provider keeps MCP servers connected and their tools registered.
type Provider struct {
	reg  *executor.Registry
	opts Options
	log  *slog.Logger

	servers []*server
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	// sessionEnded, for tests, is called when a session ended, before it is marked so.
	sessionEnded func()
}

// New returns a Provider that registers the tools of every server of cfg in reg once
// started. AddServer adds servers with a custom transport.
func New(reg *executor.Registry, cfg Config, opts Options) (*Provider, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 200 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(30*time.Second, opts.MinBackoff)
	}
	p := &Provider{reg: reg, opts: opts, log: opts.Logger.With("component", "mcp")}
	names := slices.Sorted(maps.Keys(cfg.MCPServers))
	for _, name := range names {
		d, err := cfg.MCPServers[name].dial(opts)
		if err != nil {
			return nil, fmt.Errorf("mcptools: server %q: %w", name, err)
		}
		p.AddServerPolicy(name, d, cfg.MCPServers[name].Policy)
	}
	return p, nil
}

// AddServer adds a server reached through dial, all of its tools served; call it before
// Start.
func (p *Provider) AddServer(name string, dial Dialer) { p.AddServerPolicy(name, dial, Policy{}) }

// AddServerPolicy adds a server reached through dial whose tools policy filters and
// marks; call it before Start.
func (p *Provider) AddServerPolicy(name string, dial Dialer, policy Policy) {
	p.servers = append(p.servers, &server{name: name, prefix: sanitize(name) + "__", dial: dial, p: p, policy: policy,
		log: p.log.With("mcp_server", name), tools: map[string]string{}, up: make(chan struct{})})
}

// Start connects every server and registers its tools, then keeps the connections up
// until ctx ends or Close is called. A server that cannot be reached at start fails
// Start: a misconfigured server is better reported at once than retried silently.
func (p *Provider) Start(ctx context.Context) error {
	ctx, p.cancel = context.WithCancel(ctx)
	for _, s := range p.servers {
		sess, err := s.connect(ctx)
		if err != nil {
			p.Close()
			return fmt.Errorf("mcptools: server %q: %w", s.name, err)
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			s.supervise(ctx, sess)
		}()
	}
	return nil
}

// Close stops the servers (a stdio process gets its stdin closed, then SIGTERM) and
// waits for the supervisors. The tools stay registered.
func (p *Provider) Close() {
	if p.cancel != nil {
		p.cancel()
	}
	for _, s := range p.servers {
		s.mu.Lock()
		if s.sess != nil {
			_ = s.sess.Close()
		}
		s.mu.Unlock()
	}
	p.wg.Wait()
}

// Tools returns the registered tool names of the provider's servers, sorted.
func (p *Provider) Tools() []string {
	var out []string
	for _, s := range p.servers {
		s.mu.Lock()
		for n := range s.tools {
			out = append(out, n)
		}
		s.mu.Unlock()
	}
	sort.Strings(out)
	return out
}
