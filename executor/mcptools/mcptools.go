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
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/mcptools/mcpauth"
	"github.com/toolbus/toolbus/internal/retry"
)

// Error codes of MCP failures (ToolResult.Error.Code).
const (
	// CodeUnavailable: the server is not connected, or its connection ended during the
	// call (it is being restarted). Retryable.
	CodeUnavailable = "mcp_unavailable"
	// CodeProtocol: the server answered tools/call with a protocol error. Retryable.
	CodeProtocol = "mcp_error"
)

// ErrConfig is wrapped by the errors of LoadConfig and New for an unusable configuration.
var ErrConfig = errors.New("mcptools: invalid configuration")

// Server is one entry of "mcpServers": either Command (stdio) or URL (streamable HTTP),
// and the policy of its tools.
type Server struct {
	// Command starts a stdio server (looked up in PATH) with Args. Its environment is
	// Env and nothing else of the executor's but PATH and HOME: never the executor's
	// TOOLBUS_* settings nor its NATS credentials. A value "${NAME}" is the executor's
	// variable NAME (for a key the server needs), except TOOLBUS_* and NATS_* ones.
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// URL of a streamable HTTP server, with Headers sent on every request.
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	// OAuth authorizes the HTTP server's requests as the MCP specification says
	// (package mcpauth): the grant, the client's identity and credentials.
	OAuth *mcpauth.Config `json:"oauth,omitempty"`
	Policy
}

// Policy is what an operator allows of a server's tools. Tool names are the server's own
// (not the toolbus <server>__<tool> names); "*" in a list means every tool.
type Policy struct {
	// AllowTools, when set, are the only tools served; DenyTools are never served.
	AllowTools []string `json:"allowTools,omitempty"`
	DenyTools  []string `json:"denyTools,omitempty"`
	// NeedsApproval are the tools whose calls wait for a person's approval.
	NeedsApproval []string `json:"needsApproval,omitempty"`
	// Timeout bounds each call of the server's tools ("30s"; empty: Options.Timeout).
	Timeout Duration `json:"timeout,omitempty"`
}

// serves reports whether the policy lets the tool be served.
func (p Policy) serves(tool string) bool {
	if matchAny(p.DenyTools, tool) {
		return false
	}
	return len(p.AllowTools) == 0 || matchAny(p.AllowTools, tool)
}

func matchAny(list []string, tool string) bool {
	return slices.Contains(list, tool) || slices.Contains(list, "*")
}

// Duration is a time.Duration written as a Go duration string in JSON ("30s", "2m").
type Duration time.Duration

// UnmarshalJSON reads "30s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("duration %q: want a positive Go duration such as \"30s\"", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes "30s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// inheritedEnv are the only variables of the executor a stdio server gets besides its
// own Env: enough to find and run its interpreter (npx, uvx, node).
var inheritedEnv = []string{"PATH", "HOME"}

// forbiddenEnvPrefixes are the executor's variables no server may be given by "${NAME}":
// toolbus's own settings and credentials.
var forbiddenEnvPrefixes = []string{"TOOLBUS_", "NATS_"}

// childEnv is the environment of a stdio server: PATH and HOME, then env with "${NAME}"
// values read from lookup.
func childEnv(env map[string]string, lookup func(string) (string, bool)) []string {
	var out []string
	for _, k := range inheritedEnv {
		if v, ok := lookup(k); ok {
			if _, own := env[k]; !own {
				out = append(out, k+"="+v)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		v := env[k]
		if name, ok := envRef(v); ok {
			v, _ = lookup(name)
		}
		out = append(out, k+"="+v)
	}
	return out
}

// envRef returns NAME of a value "${NAME}".
func envRef(v string) (string, bool) {
	if strings.HasPrefix(v, "${") && strings.HasSuffix(v, "}") && len(v) > 3 {
		return v[2 : len(v)-1], true
	}
	return "", false
}

// Config is the content of a TOOLBUS_MCP_CONFIG file.
type Config struct {
	MCPServers map[string]Server `json:"mcpServers"`
}

// LoadConfig reads and checks a configuration file.
func LoadConfig(path string) (Config, error) {
	var c Config
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("mcptools: read config: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%w: %s: %v", ErrConfig, path, err)
	}
	return c.Resolve(os.LookupEnv)
}

// Resolve returns c with the "${NAME}" values of its servers' oauth objects read from
// lookup (os.LookupEnv), checked.
func (c Config) Resolve(lookup func(string) (string, bool)) (Config, error) {
	servers := make(map[string]Server, len(c.MCPServers))
	for name, s := range c.MCPServers {
		if s.OAuth != nil {
			o, err := s.OAuth.Resolve(lookup)
			if err != nil {
				return c, fmt.Errorf("%w: server %q: %w", ErrConfig, name, err)
			}
			s.OAuth = &o
		}
		servers[name] = s
	}
	c.MCPServers = servers
	return c, c.check()
}

// OAuth reports whether a server of c uses OAuth.
func (c Config) OAuth() bool {
	for _, s := range c.MCPServers {
		if s.OAuth != nil {
			return true
		}
	}
	return false
}

func (c Config) check() error {
	for name, s := range c.MCPServers {
		if (s.Command == "") == (s.URL == "") {
			return fmt.Errorf("%w: server %q needs exactly one of command (stdio) or url (streamable HTTP)", ErrConfig, name)
		}
		if name == "" {
			return fmt.Errorf("%w: a server has an empty name", ErrConfig)
		}
		if s.OAuth != nil {
			if s.URL == "" {
				return fmt.Errorf("%w: server %q: oauth applies to an HTTP server (url), not a command", ErrConfig, name)
			}
			if err := s.OAuth.Check(); err != nil {
				return fmt.Errorf("%w: server %q: %w", ErrConfig, name, err)
			}
		}
		for k, v := range s.Env {
			if ref, ok := envRef(v); ok {
				for _, p := range forbiddenEnvPrefixes {
					if strings.HasPrefix(strings.ToUpper(ref), p) {
						return fmt.Errorf("%w: server %q: env %s=${%s}: the executor's %s* variables are its own settings and credentials, never given to a tool", ErrConfig, name, k, ref, p)
					}
				}
			}
		}
	}
	return nil
}

// Dialer returns a fresh transport to a server, at the first connection and at each
// reconnection.
type Dialer func(ctx context.Context) (mcp.Transport, error)

// Dial returns the Dialer of a configured server without authorization (Server.OAuth is
// used by New).
func (s Server) Dial() Dialer {
	s.OAuth = nil
	d, _ := s.dial(Options{})
	return d
}

// dial returns the Dialer of a configured server; an HTTP server with OAuth gets one
// authorization handler for all its connections, so a reconnection reuses its token.
func (s Server) dial(opts Options) (Dialer, error) {
	if s.URL != "" {
		hc := &http.Client{Transport: headerTransport{headers: maps.Clone(s.Headers), next: http.DefaultTransport}}
		var oh auth.OAuthHandler
		if s.OAuth != nil {
			var err error
			if oh, err = mcpauth.Handler(*s.OAuth, mcpauth.Options{HTTPClient: opts.HTTPClient, OnSecret: opts.OnSecret,
				Fetcher: opts.AuthorizationCodeFetcher, Tokens: opts.Tokens, Server: s.URL, RefreshEarly: opts.RefreshEarly,
				Logger: opts.Logger}); err != nil {
				return nil, err
			}
		}
		return func(context.Context) (mcp.Transport, error) {
			return &mcp.StreamableClientTransport{Endpoint: s.URL, HTTPClient: hc, OAuthHandler: oh}, nil
		}, nil
	}
	return func(context.Context) (mcp.Transport, error) {
		// Not CommandContext: the process lives as long as the provider, not a call.
		cmd := exec.Command(s.Command, s.Args...)
		cmd.Env = childEnv(s.Env, os.LookupEnv)
		cmd.Stderr = os.Stderr
		return &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, nil
	}, nil
}

type headerTransport struct {
	headers map[string]string
	next    http.RoundTripper
}

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.headers {
		r.Header.Set(k, v)
	}
	return t.next.RoundTrip(r)
}

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
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
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

// Attachments takes the images, audio and binary embedded resources out of content as
// attachments, which pass through to the model and to MCP hosts (toolbus.Attachment),
// and returns the rest, which Text renders.
func Attachments(content []mcp.Content) ([]mcp.Content, []toolbus.Attachment) {
	var (
		rest  []mcp.Content
		files []toolbus.Attachment
	)
	for _, c := range content {
		switch x := c.(type) {
		case *mcp.ImageContent:
			files = append(files, toolbus.Attachment{MediaType: x.MIMEType, Data: x.Data})
		case *mcp.AudioContent:
			files = append(files, toolbus.Attachment{MediaType: x.MIMEType, Data: x.Data})
		case *mcp.EmbeddedResource:
			if r := x.Resource; r != nil && r.Text == "" && len(r.Blob) > 0 {
				files = append(files, toolbus.Attachment{MediaType: r.MIMEType, URI: r.URI, Data: r.Blob})
				continue
			}
			rest = append(rest, c)
		default:
			rest = append(rest, c)
		}
	}
	return rest, files
}

// Text renders MCP content blocks as what the model reads: text as is, other blocks
// described on a line of their own (kind, MIME type, size, URI), never dropped.
func Text(content []mcp.Content) string {
	parts := make([]string, 0, len(content))
	for _, c := range content {
		switch x := c.(type) {
		case *mcp.TextContent:
			parts = append(parts, x.Text)
		case *mcp.ImageContent:
			parts = append(parts, fmt.Sprintf("[image: %s, %d bytes]", orUnknown(x.MIMEType), len(x.Data)))
		case *mcp.AudioContent:
			parts = append(parts, fmt.Sprintf("[audio: %s, %d bytes]", orUnknown(x.MIMEType), len(x.Data)))
		case *mcp.ResourceLink:
			d := fmt.Sprintf("[resource link: %s <%s>", x.Name, x.URI)
			if x.MIMEType != "" {
				d += ", " + x.MIMEType
			}
			if x.Description != "" {
				d += ": " + x.Description
			}
			parts = append(parts, d+"]")
		case *mcp.EmbeddedResource:
			r := x.Resource
			if r == nil {
				parts = append(parts, "[resource]")
			} else if r.Text != "" {
				parts = append(parts, fmt.Sprintf("[resource %s]\n%s", r.URI, r.Text))
			} else {
				parts = append(parts, fmt.Sprintf("[resource %s: %s, %d bytes]", r.URI, orUnknown(r.MIMEType), len(r.Blob)))
			}
		default:
			b, _ := json.Marshal(c)
			parts = append(parts, fmt.Sprintf("[content: %s]", b))
		}
	}
	return strings.Join(parts, "\n")
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown type"
	}
	return s
}
