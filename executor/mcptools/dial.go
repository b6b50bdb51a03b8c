package mcptools

import (
	"context"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolbus/toolbus/executor/mcptools/mcpauth"
)

// Reaching a server: a fresh transport per connection, a stdio process or a streamable
// HTTP session with its headers and, where configured, its OAuth authorization.

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
