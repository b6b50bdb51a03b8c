package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/mcpserver"
)

// cmdMCP serves the tool catalog as an MCP server: over stdio by default (stdout then
// carries only MCP messages; logs go to stderr), or over streamable HTTP with --http,
// where every request needs a bearer token of TOOLBUS_MCP_TOKENS(_FILE) and the runs
// carry the token's principal.
func cmdMCP(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer) error {
	fs := newFlagSet("mcp", "mcp [--http ADDR]   (serve the catalog to MCP hosts; TOOLBUS_NATS_URL must be set; --http needs TOOLBUS_MCP_TOKENS_FILE)", errOut)
	addr := fs.String("http", "", "serve streamable HTTP on this address; \":8090\" listens on 127.0.0.1 only (default: stdio)")
	principal := fs.String("principal", "mcp", "principal the runs act for over stdio (over HTTP: each token's; with TOOLBUS_NATS_READ_PREFIX, its identity)")
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
	stateKey, err := mcpserver.ReadStateKey(cfg.MCPStateKeyFile)
	if err != nil {
		return &exitError{code: 2, msg: err.Error()}
	}
	if *addr != "" && stateKey == nil {
		log.Info("toolbus mcp: no TOOLBUS_MCP_STATE_KEY_FILE: input_required round trips resume only at this process")
	}
	c, err := node.Open(ctx, cfg, log, false)
	if err != nil {
		return err
	}
	defer c.Close()
	if c.Bus.ClientAccount() && *principal == "mcp" {
		*principal = events.ReadIdentity(cfg.ReadPrefix) // a client account acts as its identities only
	}
	srv, err := mcpserver.New(ctx, c.Bus, mcpserver.Config{
		Source: events.Source("mcp", cfg.Instance), Principal: *principal, ApprovalTimeout: cfg.RunTimeout,
		Version: version(), Logger: log, CLIApprovalsOnly: !cfg.MCPHostApprovals, StateKey: stateKey,
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
	h := mcpserver.HTTPHandler(srv, mcpserver.HTTPConfig{
		Listen: listen, Access: access, AllowedHosts: cfg.MCPAllowedHosts, AllowedOrigins: cfg.MCPAllowedOrigins,
		SessionTimeout: cfg.MCPSessionTimeout, MaxSessions: cfg.MCPMaxSessions, MaxSessionsPerToken: cfg.MCPMaxSessionsPerToken, Logger: log,
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
