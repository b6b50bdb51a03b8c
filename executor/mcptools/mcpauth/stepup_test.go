package mcpauth_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/mcptools"
	"github.com/toolbus/toolbus/executor/mcptools/mcpauth"
	"github.com/toolbus/toolbus/internal/testutil"
)

// scopedServer is an MCP server that lets initialize through and asks, with a 401, for
// the scope "read" (from WWW-Authenticate); tools/call needs callScope too and is
// answered 403 insufficient_scope until the token has it.
func scopedServer(t *testing.T, as *authServer, callScope string) string {
	srv := mcp.NewServer(&mcp.Implementation{Name: "scoped", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "write"}, func(_ context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "written"}}}, nil, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	var base string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/oauth-protected-resource/mcp", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"resource": base + "/mcp", "authorization_servers": []string{as.URL}})
	})
	mux.HandleFunc("/mcp", func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Method string }
		raw, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(raw, &body)
		r.Body = io.NopCloser(bytes.NewReader(raw))
		meta := fmt.Sprintf(`resource_metadata="%s/.well-known/oauth-protected-resource/mcp"`, base)
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		as.mu.Lock()
		granted, ok := as.scopes[tok]
		as.mu.Unlock()
		switch {
		case body.Method == "initialize" || strings.HasPrefix(body.Method, "notifications/"):
		case !ok:
			w.Header().Set("WWW-Authenticate", `Bearer scope="read", `+meta)
			w.WriteHeader(http.StatusUnauthorized)
			return
		case body.Method == "tools/call" && !slices.Contains(strings.Fields(granted), callScope):
			w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope", scope="read `+callScope+`", `+meta)
			w.WriteHeader(http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	base = s.URL
	return s.URL + "/mcp"
}

// TestClientCredentialsStepUp: the scope of the 401's challenge is requested first; a
// 403 insufficient_scope takes a new token for the union of the scopes, and the call
// goes through. A server that never accepts the scope costs one more token per call,
// never a loop, and the call fails.
func TestClientCredentialsStepUp(t *testing.T) {
	for _, c := range []struct {
		name      string
		grants    bool // the token can get "write"
		wantCalls bool
	}{{"granted", true, true}, {"never granted", false, false}} {
		t.Run(c.name, func(t *testing.T) {
			as := newAuthServer(t, "cc", "cc-secret-123456", time.Hour)
			url := scopedServer(t, as, "write")
			cfg := mcpauth.Config{Grant: mcpauth.GrantClientCredentials, ClientID: "cc", ClientSecret: "cc-secret-123456"}
			if !c.grants {
				// The authorization server grants what is asked; scopes pinned by the
				// operator never ask for "write", so the server never gets it.
				cfg.Scopes = []string{"read"}
			}
			reg := executor.NewRegistry()
			ex := testutil.Must(executor.New(reg))
			p := testutil.Must(mcptools.New(reg, mcptools.Config{MCPServers: map[string]mcptools.Server{"s": {URL: url, OAuth: &cfg}}},
				mcptools.Options{OnSecret: ex.AddSecrets}))
			ctx := eventstest.Context(t, time.Minute)
			if err := p.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			tool, _ := reg.Lookup("s__write")
			_, err := tool.Func(ctx, []byte(`{}`))
			tokens, _ := as.tokens()
			as.mu.Lock()
			first, last := as.scopes[tokens[0]], as.scopes[tokens[len(tokens)-1]]
			as.mu.Unlock()
			if first != "read" {
				t.Errorf("the first token was asked for %q, want the challenge's \"read\"", first)
			}
			if c.wantCalls {
				if err != nil || len(tokens) != 2 || last != "read write" {
					t.Fatalf("step-up: err %v, %d tokens, the last for %q", err, len(tokens), last)
				}
				return
			}
			if err == nil || len(tokens) > 2 {
				t.Fatalf("a scope never granted: err %v, %d tokens (want an error and at most one more token)", err, len(tokens))
			}
		})
	}
}
