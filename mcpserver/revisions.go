package mcpserver

import (
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Protocol2026 is the first MCP revision without sessions (2026-07-28): each request
// carries its version (the Mcp-Protocol-Version header and _meta), there is no
// initialize and no Mcp-Session-Id.
const Protocol2026 = "2026-07-28"

// modernRequests serves the requests of 2026-07-28 and later (Mcp-Protocol-Version at
// least Protocol2026) with a stateless streamable handler, since go-sdk's stateful one
// refuses them, and passes every other request (2025-06-18 and 2025-11-25 clients, with
// their sessions) to legacy. The modern requests skip the session cap: they open no
// session.
func modernRequests(srv *mcp.Server, cfg HTTPConfig, legacy http.Handler) http.Handler {
	modern := dropCancelledAnswers(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		// A 2026-07-28 request lives as long as its POST: a client that closes it cancels
		// the request, and so the call's run (as notifications/cancelled does on a session).
		&mcp.StreamableHTTPOptions{Stateless: true, PropagateRequestCancellation: true, Logger: cfg.Logger}))
	modern = taskNames(modern)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Mcp-Protocol-Version") >= Protocol2026 {
			modern.ServeHTTP(w, r)
			return
		}
		legacy.ServeHTTP(w, r)
	})
}

// challenge adds the RFC 6750 challenge to the door's 401 answers (go-sdk's bearer
// middleware writes one only with OAuth resource metadata, which toolbus has none of):
// `WWW-Authenticate: Bearer realm="toolbus"`, with error="invalid_token" when a token
// was presented.
func challenge(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&challenger{ResponseWriter: w, presented: r.Header.Get("Authorization") != ""}, r)
	})
}

type challenger struct {
	http.ResponseWriter
	presented bool
}

func (c *challenger) WriteHeader(code int) {
	if code == http.StatusUnauthorized && c.Header().Get("WWW-Authenticate") == "" {
		v := `Bearer realm="toolbus"`
		if c.presented {
			v += `, error="invalid_token", error_description="unknown token"`
		}
		c.Header().Set("WWW-Authenticate", v)
	}
	c.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController flush the stream.
func (c *challenger) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// Flush flushes the underlying writer.
func (c *challenger) Flush() {
	if fl, ok := c.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}
