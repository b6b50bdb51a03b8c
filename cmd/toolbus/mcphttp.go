package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus/mcpserver"
)

// The front door of `toolbus mcp --http`, outermost first: the Host header (DNS
// rebinding), the Origin header (a browser page of another site), then the MCP
// package's handler (bearer token of the access list, session cap, streamable HTTP).

// mcpHTTPConfig configures the HTTP door of the MCP server.
type mcpHTTPConfig struct {
	// Listen is the address served (for the Host check).
	Listen string
	// Access maps bearer tokens to principals.
	Access *accessSource
	// AllowedHosts are host names besides loopback and Listen's host that clients use.
	AllowedHosts []string
	// AllowedOrigins are browser origins allowed besides the server's own.
	AllowedOrigins []string
	// SessionTimeout closes a session idle this long.
	SessionTimeout time.Duration
	// MaxSessions caps the live sessions; initialize beyond it is answered 503.
	MaxSessions int
	Logger      *slog.Logger
}

// mcpHTTPHandler returns the HTTP handler of srv behind the door of cfg.
func mcpHTTPHandler(srv *mcp.Server, cfg mcpHTTPConfig) http.Handler {
	next := mcpserver.HTTPHandler(srv, mcpserver.HTTPConfig{
		Verify: func(token string) (string, []string, bool) {
			id, ok := cfg.Access.current().lookup(token)
			return id.Name, id.Teams, ok
		},
		SessionTimeout: cfg.SessionTimeout, MaxSessions: cfg.MaxSessions, Logger: cfg.Logger,
	})
	hosts := newHostPolicy(cfg.Listen, cfg.AllowedHosts)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hosts.ok(r) {
			http.Error(w, fmt.Sprintf("forbidden Host %q: add it to TOOLBUS_MCP_ALLOWED_HOSTS if clients use that name", r.Host), http.StatusForbidden)
			return
		}
		if r.URL.Path == "/readyz" && r.Method == http.MethodGet {
			fmt.Fprintln(w, "ok") // a probe: no token needed, nothing told
			return
		}
		if !originOK(r, cfg.AllowedOrigins) {
			http.Error(w, fmt.Sprintf("forbidden Origin %q: add it to TOOLBUS_MCP_ALLOWED_ORIGINS to allow a browser client of that site", r.Header.Get("Origin")), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
